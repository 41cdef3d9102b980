"""CARD's reward-guided decoding step as one sampler of llama.cpp's chain: the top-k logit correction.

The engine keeps only the cluster model's k best tokens (a `top_k(k)` sampler placed right before this
one); this sampler adds `strength * U[v] . (P f_t * lambda)` to each of them, with `f_t` the layer features
tapped at the position being predicted. Every other token is already out of the chain, so however strong the
correction, the next token is one the cluster model ranked in its top k. It only does head maths on the
candidates it is given: no model evaluation, no token choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localpers.decoding import Candidates
from localpers.errors import LocalpersError
from localpers.head import CardHead


@dataclass
class CorrectionRecord:
    """One step of the correction: the candidate ids, their logits before, and what was added."""

    candidates: np.ndarray
    before: np.ndarray
    delta: np.ndarray


@dataclass
class CardCorrection:
    """A `MethodSampler` applying CARD's correction for one user (`vector`) at one `strength`."""

    head: CardHead
    vector: np.ndarray
    strength: float
    candidate_limit: int
    record: bool = False
    name: str = "card"
    steps: list[CorrectionRecord] = field(default_factory=list)

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        if features is None:
            raise LocalpersError("the engine returned no layer features; CARD needs the layer taps")
        ids = candidates.ids
        before = candidates.logits.astype(np.float32)  # a copy: the view is about to change
        delta = self.head.correction(ids, features, self.vector, strength=self.strength)
        candidates.logits[:] = before + delta
        if self.record:
            self.steps.append(CorrectionRecord(ids.copy(), before, np.asarray(delta, dtype=np.float32)))

    def accept(self, token: int) -> None:
        """CARD keeps no state between steps: the features of each step come from the taps."""
