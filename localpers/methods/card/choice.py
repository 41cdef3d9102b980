"""`localpers fit` chooses, per user, how strongly CARD corrects their cluster adapter.

The candidates are the conditioned base adapter alone (the user's cluster adapter, or the global adapter where
the bundle's `head.base` says so), and the same adapter with the user's vector
(at the bundle's strength) and/or their token bias (its counted tables at strength 0.1, 1 or 2; its calibrated
opening and closing habits apply as fitted whenever the bias is on; a casing habit recases every CARD output,
whatever is chosen). They are compared on the user's own
most recent history items, which the fit for the comparison does not see: the vector and bias are fitted on
the earlier items only, and each candidate scores the real recent outputs teacher-forced (mean log-probability
per token, `Personalizer.score_reference_variants`, the same correction that decodes; the model runs once per
item for all candidates). Likelihood rather than ROUGE because a handful of items is all a user has, and
likelihood is far less noisy on a handful.

A candidate replaces the adapter alone only if it beats it on these items; otherwise the user gets the adapter
alone and is told so. Users with fewer than MIN_ITEMS_TO_CHOOSE items get no choice (the bundle's defaults).
This module decides; it stores nothing (the caller saves the choice with the fit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from localpers.methods.card.correction import CorrectionVariant
from localpers.tasks import get_task
from localpers.users.history_prompt import HistoryIndex

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from localpers.users.history import HistoryItem
    from localpers.users.store import User


class Scorer(Protocol):
    """What the choice needs of CARD's `Personalizer` (which calls it): a fit of some items, and scoring.

    A protocol, not an import, so that `personalizer` -> `choice` runs one way.
    """

    @property
    def head_config(self) -> Any: ...

    def fit_items(
        self,
        user: User,
        items: Sequence[HistoryItem],
        *,
        regularisation: float,
        prior_weight: float,
        history_offset: int = 0,
    ) -> Any: ...

    def score_reference_variants(
        self, text: str, reference: str, variants: Sequence[CorrectionVariant], **options: Any
    ) -> list[float]: ...


MIN_ITEMS_TO_CHOOSE = 8
MIN_RECENT, MAX_RECENT, RECENT_FRACTION = 3, 10, 0.2
# (label, vector strength as a multiple of the bundle's, token-bias strength)
CANDIDATES: tuple[tuple[str, float, float], ...] = (
    ("adapter", 0.0, 0.0),
    ("vector", 1.0, 0.0),
    ("bias", 0.0, 1.0),
    ("vector+bias", 1.0, 1.0),
    ("bias x2", 0.0, 2.0),
    ("vector+bias x2", 1.0, 2.0),
    # the calibrated habits with the counted tables nearly off: on the dev-split probes the counted tables cost
    # ROUGE (they push the user's past words), while the habits alone carried the style (docs/RESULTS.md, 0c)
    ("bias x0.1", 0.0, 0.1),
    ("vector+bias x0.1", 1.0, 0.1),
)


@dataclass
class Choice:
    """What the fit chose, on which items, and the score of every candidate."""

    label: str
    vector_strength: float
    bias_strength: float
    scores: dict[str, float]
    n_items: int
    reason: str
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "vector_strength": round(self.vector_strength, 6),
            "bias_strength": self.bias_strength,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "n_items": self.n_items,
            "reason": self.reason,
        }


def split_recent(items: Sequence[HistoryItem]) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """(earlier, recent): the most recent 20% of the items (3 to 10) are held out for the choice."""
    count = min(MAX_RECENT, max(MIN_RECENT, round(RECENT_FRACTION * len(items))))
    return list(items[:-count]), list(items[-count:])


def choose_correction(
    personalizer: Scorer,
    user: User,
    items: Sequence[HistoryItem],
    *,
    regularisation: float,
    prior_weight: float,
    progress: Callable[[str, int, int], None] | None = None,
    history_offset: int = 0,
) -> Choice | None:
    """The best candidate on the user's recent items, or None when the history is too short to choose.

    `history_offset` is `fit_items`'s: how many of the user's items come before `items`.
    """
    if len(items) < MIN_ITEMS_TO_CHOOSE:
        return None
    started = time.perf_counter()
    earlier, recent = split_recent(items)
    outcome = personalizer.fit_items(
        user, earlier, regularisation=regularisation, prior_weight=prior_weight, history_offset=history_offset
    )
    if outcome.report.mode != "vector":
        return None
    default_strength = float(personalizer.head_config.default_strength)
    index_by_task: dict[str, HistoryIndex] = {}
    totals = {label: 0.0 for label, _, _ in CANDIDATES}
    for done, item in enumerate(recent):
        task = get_task(item.task)
        if task.name not in index_by_task:
            pool = [(e.input, e.output) for e in earlier if e.task == task.name]
            index_by_task[task.name] = HistoryIndex(task, pool)
        variants = [
            CorrectionVariant(outcome.vector, vector_scale * default_strength, outcome.bias, bias_strength)
            for _, vector_scale, bias_strength in CANDIDATES
        ]
        scores = personalizer.score_reference_variants(
            item.input,
            item.output,
            variants,
            task=task.name,
            method="card",
            cluster=outcome.cluster,
            history=index_by_task[task.name],
        )
        for (label, _, _), score in zip(CANDIDATES, scores, strict=True):
            totals[label] += score
        if progress:
            progress("choice", done + 1, len(recent))
    scores = {label: total / len(recent) for label, total in totals.items()}
    best = max(scores, key=lambda label: (scores[label], -_position(label)))
    _, vector_scale, bias_strength = CANDIDATES[_position(best)]
    adapter = "the global adapter" if personalizer.head_config.base == "global" else "your cluster adapter"
    if best == "adapter":
        reason = (
            f"on your {len(recent)} most recent items nothing beat {adapter} alone "
            f"(log p/token {scores['adapter']:.3f}), so rewrites use it without a correction"
        )
    else:
        reason = (
            f"on your {len(recent)} most recent items (held out from this comparison's fit) '{best}' gave "
            f"log p/token {scores[best]:.3f} against {scores['adapter']:.3f} for {adapter} alone"
        )
    return Choice(
        label=best,
        vector_strength=vector_scale * default_strength,
        bias_strength=bias_strength,
        scores=scores,
        n_items=len(recent),
        reason=reason,
        seconds=time.perf_counter() - started,
    )


def _position(label: str) -> int:
    return [candidate[0] for candidate in CANDIDATES].index(label)


def stored_choice(state: dict[str, Any]) -> tuple[float | None, float | None, str | None]:
    """(vector strength, bias strength, label) saved by the last fit; Nones when it made no choice."""
    entry = state.get("choice")
    if not isinstance(entry, dict):
        return None, None, None
    try:
        return float(entry["vector_strength"]), float(entry["bias_strength"]), str(entry["label"])
    except (KeyError, TypeError, ValueError):
        return None, None, None
