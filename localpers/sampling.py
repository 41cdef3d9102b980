"""Choosing the next token from a logit vector: greedy, temperature, top-k, top-p, repetition penalty.

Pure numpy over one step's logits; it knows nothing of llama.cpp. Greedy is `temperature == 0`.
Example: `choose_token(np.array([0.1, 2.0, 0.3]), SamplingConfig())` returns 1.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick a token. The defaults are greedy decoding, as in the CARD paper."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens already generated
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def apply_repetition_penalty(logits: np.ndarray, previous: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL-style penalty: divide positive logits (multiply negative ones) of tokens already seen."""
    if penalty == 1.0 or not previous:
        return logits
    out = logits.copy()
    seen = np.fromiter(set(previous), dtype=np.int64)
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def choose_token(
    logits: np.ndarray,
    config: SamplingConfig,
    previous: Sequence[int] = (),
    rng: np.random.Generator | None = None,
) -> int:
    """Pick the next token id from one step's logits."""
    logits = apply_repetition_penalty(logits, previous, config.repetition_penalty)
    if config.greedy:
        return int(np.argmax(logits))
    rng = rng or np.random.default_rng(config.seed)
    k = config.top_k if 0 < config.top_k < logits.size else min(logits.size, 1024)
    candidates = np.argpartition(logits, -k)[-k:]
    scaled = logits[candidates].astype(np.float64) / config.temperature
    order = np.argsort(-scaled)
    candidates, scaled = candidates[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if config.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), config.top_p) + 1)
        candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
    return int(candidates[rng.choice(len(candidates), p=probs)])
