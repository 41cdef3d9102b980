"""EXACT's greedy attribute search for one preference pair (EXACT Algorithm 1), given a way to score sets.

    greedy: A = {}; k times, add the attribute a maximising F(A + {a})

F(A), the pair's margin under an attribute set, comes from the caller: one set at a time (`margin`) or a step's
candidate sets together (`margins`, what `localpers.methods.exact.PairMargins.many` scores side by side). This
module runs no model, builds no prompt and stores nothing: prompts, scoring and the index are
`localpers.methods.exact`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localpers.errors import LocalpersError
from localpers.methods.attributes import ATTRIBUTES

DEFAULT_K = 3

MarginFunction = Callable[[tuple[str, ...]], float]
MarginsFunction = Callable[[list[tuple[str, ...]]], Sequence[float]]


class PathChanged(Exception):
    """Raised by a margins function that cannot score a step the way it scored the search's earlier ones, and will
    score every set one other way from now on: `greedy_select` starts the search over, so all its margins (the
    gain filter's F(A) - F({}) included) come from one scoring path."""


@dataclass
class Selection:
    """The attributes greedy search chose for one pair, with the objective along the way."""

    attributes: tuple[str, ...]
    margin: float  # F(A) for the chosen set
    base_margin: float  # F({}) : the plain prompt
    step_margins: list[float] = field(default_factory=list)  # F after each added attribute
    evaluations: int = 0

    @property
    def gain(self) -> float:
        return self.margin - self.base_margin


def greedy_select(
    margin: MarginFunction | None = None,
    library: Sequence[str] = ATTRIBUTES,
    k: int = DEFAULT_K,
    *,
    margins: MarginsFunction | None = None,
) -> Selection:
    """EXACT's Algorithm 1 for one pair: k times, add the attribute whose addition maximises F.

    F comes from `margin(attributes)`, F(A) for an ordered tuple of attribute names (the prompt lists them in
    the order they were chosen), or from `margins(sets)`, F of each set of a list: each step's candidate sets
    together, the first step's with the empty set before them (what `PairMargins.many` scores side by side). Give
    one of the two.
    Ties go to the attribute listed first in `library`. A `margins` that raises `PathChanged` has the search
    started over (once).
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    if (margin is None) == (margins is None):
        raise TypeError("greedy_select takes margin or margins, one of them")
    evaluate = margins if margins is not None else _one_at_a_time(margin)
    try:
        return _greedy(evaluate, library, k)
    except PathChanged:
        return _greedy(evaluate, library, k)


def _greedy(evaluate: MarginsFunction, library: Sequence[str], k: int) -> Selection:
    chosen: tuple[str, ...] = ()
    base = np.nan
    step_margins: list[float] = []
    evaluations = 0
    for step in range(min(k, len(library))):
        names = [name for name in library if name not in chosen]
        sets = [(*chosen, name) for name in names]
        if step == 0:
            # the plain prompt goes with the first step's candidates: the gain filter then compares F(A) and F({})
            # scored the same way (side by side, a lone prompt would be scored one at a time, and the two differ by
            # llama.cpp's batching noise)
            base, *values = _evaluated(evaluate, [chosen, *sets])
        else:
            values = _evaluated(evaluate, sets)
        evaluations += len(sets) + (step == 0)
        best = _first_best(values)
        chosen = (*chosen, names[best])
        step_margins.append(float(values[best]))
    return Selection(chosen, step_margins[-1], float(base), step_margins, evaluations)


class NoFiniteMargin(LocalpersError):
    """Every attribute set of a greedy step scored NaN or -inf: the model's log-probabilities are not numbers."""


def _first_best(values: Sequence[float]) -> int:
    """The index of the first largest value (a NaN is never chosen; `NoFiniteMargin` when none exceeds -inf)."""
    best, best_value = None, -np.inf
    for index, value in enumerate(values):
        if value > best_value:
            best, best_value = index, value
    if best is None:
        raise NoFiniteMargin(
            "no attribute set scored a finite margin (the model's log-probabilities are not finite numbers: a"
            " damaged backbone or adapter); run `localpers doctor`, or pull the bundle again"
        )
    return best


def _one_at_a_time(margin: MarginFunction) -> MarginsFunction:
    return lambda sets: [margin(attributes) for attributes in sets]


def _evaluated(margins: MarginsFunction, sets: list[tuple[str, ...]]) -> list[float]:
    values = list(margins(sets))
    if len(values) != len(sets):
        raise ValueError(f"margins gave {len(values)} values for {len(sets)} attribute sets")
    return values
