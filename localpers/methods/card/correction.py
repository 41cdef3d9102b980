"""CARD's reward-guided decoding step as one sampler of llama.cpp's chain: the top-k logit correction.

The sampler keeps only the cluster model's k best tokens and adds `strength * U[v] . (P f_t * lambda)` to
each of them, with `f_t` the layer features tapped at the position being predicted. When the user has a
token bias (`localpers.methods.card.token_bias`), the user's habitual tokens for this position join the k candidates
(uncorrected by the vector) and every candidate gets its bias times `bias_strength` (its calibrated opening
habits as they are); when the user has closing habits, a share of the ending probability of the
end-of-output tokens (`end_tokens`) among the candidates moves to them (`TokenBias.apply_closing`). Every
other token leaves the chain, so however strong the correction, the next token is one the cluster model ranked in its
top k or one the user habitually writes there. Without a token bias a llama.cpp `top_k(k)` sampler placed
right before this one makes the cut; with one, this sampler cuts itself (it must see the habitual tokens'
logits). It only does head maths on the candidates it is given: no model evaluation, no token choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from localpers.engine.decoding import Candidates
from localpers.errors import LocalpersError
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT
from localpers.methods.card.head import CardHead
from localpers.methods.card.head_spec import HeadConfig
from localpers.methods.card.token_bias import TokenBias

# Strength of the token bias's counted tables when the fit chose none (its calibrated habits apply as fitted).
# 0.1, not 1: on the dev-split style probes (train authors) the counted tables at 1 cost ROUGE-1 in all three
# styles while the habits alone carried the style (docs/RESULTS.md, section 0c).
DEFAULT_BIAS_STRENGTH = 0.1


@dataclass
class CorrectionRecord:
    """One step of the correction: the candidate ids, their logits before, and what was added."""

    candidates: np.ndarray
    before: np.ndarray
    delta: np.ndarray


@dataclass(frozen=True)
class CorrectionVariant:
    """One setting of CARD's correction for a user: their vector and token bias at chosen strengths.

    Nones mean the defaults of whoever builds the correction (`build_correction`).
    """

    vector: np.ndarray | None = None
    strength: float | None = None
    bias: TokenBias | None = None
    bias_strength: float | None = None


@dataclass
class CardCorrection:
    """A `MethodSampler` applying CARD's correction for one user (`vector`) at one `strength`.

    `top_k` is CARD's k; `bias` (optional) is the user's token bias, applied at `bias_strength`; `end_tokens`
    are the ids that end an output (the model's end token, the task's newline), where closing habits apply.
    A correction serves one generation or one teacher-forced scoring: it counts the tokens it is told of.
    """

    head: CardHead
    vector: np.ndarray
    strength: float
    top_k: int
    record: bool = False
    bias: TokenBias | None = None
    bias_strength: float = 0.0
    name: str = "card"
    end_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    steps: list[CorrectionRecord] = field(default_factory=list)
    position: int = 0  # tokens accepted so far: the token bias differs for the first one
    emitted: set[int] = field(
        default_factory=set
    )  # tokens accepted so far (a habit is pushed until it shows)
    last: int | None = None  # the token accepted last (a closing habit is not appended twice)

    def __post_init__(self) -> None:
        if self.bias is not None and (not len(self.bias) or self.bias_strength == 0.0):
            self.bias = None

    @property
    def candidate_limit(self) -> int | None:
        """The chain's top-k cut before this sampler; None when this sampler cuts itself (token bias)."""
        return None if self.bias is not None else self.top_k

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        if features is None:
            raise LocalpersError("the engine returned no layer features; CARD needs the layer taps")
        n_best = self._cut_with_habits(candidates) if self.bias is not None else candidates.size
        ids = candidates.ids
        before = candidates.logits.astype(np.float32)  # a copy: the view is about to change
        delta = np.zeros(len(ids), dtype=np.float32)
        # The token bias alone (the fit's choice often is) needs no head; the user's habits beyond the top k
        # (after the first n_best) are not corrected by the vector.
        if self.strength != 0.0:
            delta[:n_best] = self.head.correction(ids[:n_best], features, self.vector, strength=self.strength)
        if self.bias is not None:
            extra = self.bias.apply(before, ids, self.position, self.bias_strength, self.emitted)
            delta = delta + extra.astype(np.float32)
        candidates.logits[:] = before + delta
        if self.bias is not None and self.bias.closing:
            candidates.logits[:] = self._with_habits(candidates.logits, ids)
            delta = candidates.logits - before
        if self.record:
            self.steps.append(CorrectionRecord(ids.copy(), before, delta))

    def _with_habits(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The final logits with the closing habits' share of the ending probability moved."""
        assert self.bias is not None
        moved = np.array(logits, dtype=np.float32)
        self.bias.apply_closing(moved, ids, self.end_tokens, self.position, self.last)
        return moved

    def _cut_with_habits(self, candidates: Candidates) -> int:
        """Keep the k best candidates, then this position's habitual tokens not among them; returns how many
        of the kept ones are the k best (they come first)."""
        assert self.bias is not None
        best = candidates.best_positions(self.top_k)
        habits = self.bias.habitual_tokens(self.position, self.emitted)  # sorted ids
        ids = candidates.ids
        if len(habits) and habits[-1] < candidates.size and np.array_equal(ids[habits], habits):
            positions = habits  # the usual case: the candidates are still in vocabulary order
        else:
            positions = np.flatnonzero(np.isin(ids, habits))
        chosen = set(best.tolist())  # both are short: a set beats np.isin's 262k-entry lookup table
        extra = [position for position in positions.tolist() if position not in chosen]
        candidates.select(np.concatenate([best, np.asarray(extra, dtype=np.int64)]))
        return len(best)

    def accept(self, token: int) -> None:
        """Count the step (the features of each step come from the taps, not from here)."""
        self.position += 1
        self.emitted.add(int(token))
        self.last = int(token)


def build_correction(
    head: CardHead,
    config: HeadConfig,
    *,
    cluster: int | None,
    vector: np.ndarray | None,
    strength: float | None,
    top_k: int | None,
    bias: TokenBias | None,
    bias_strength: float | None,
    end_tokens: Sequence[int] = (),
    record: bool = False,
) -> tuple[CardCorrection, float, int]:
    """`(sampler, strength, k)`: CARD's correction for one user, with the bundle's defaults filled in.

    No vector = the cluster's prior (`DEFAULT_PRIOR_WEIGHT` x its default vector); no strength or k = the head's;
    no bias strength = `DEFAULT_BIAS_STRENGTH`; an empty bias or a zero bias strength = no token bias.
    """
    if vector is None:
        vector = DEFAULT_PRIOR_WEIGHT * head.default_vector(cluster)
    strength_used = config.default_strength if strength is None else strength
    k_used = top_k or config.top_k
    bias_used = DEFAULT_BIAS_STRENGTH if bias_strength is None else bias_strength
    user_bias = bias if (bias is not None and len(bias) and bias_used) else None
    correction = CardCorrection(
        head,
        vector,
        float(strength_used),
        int(k_used),
        record=record,
        bias=user_bias,
        bias_strength=float(bias_used),
        end_tokens=np.asarray(sorted(set(end_tokens)), dtype=np.int64),
    )
    return correction, strength_used, k_used
