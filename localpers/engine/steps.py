"""What evaluating tokens gives back: a `Step` (the next-token logits and the tapped layers' features at the
last position) and a `ScoredContinuation` (a teacher-forced continuation's per-token log-probs and features),
the log-softmax at chosen tokens both `evaluation` and `batch` score with, and the check of a caller's token list.

It evaluates nothing and holds no llama.cpp handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Step:
    """Result of evaluating tokens: next-token logits and layer features at the last position."""

    logits: np.ndarray
    features: np.ndarray | None


@dataclass
class ScoredContinuation:
    """Teacher-forced view of one continuation: per token, its log-prob and the features that predicted it."""

    tokens: list[int]
    logprobs: np.ndarray  # (T,), or the first `logprob_rows` of them
    features: np.ndarray | None  # (T, n_taps, n_embd)
    logits: np.ndarray | None = None  # (T, n_vocab) when asked for


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits[t])[targets[t]] for every row t, in float64 for stability."""
    rows = logits.astype(np.float64)
    peak = rows.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(rows - peak).sum(axis=1)) + peak[:, 0]
    return rows[np.arange(len(targets)), targets] - log_norm


def check_tokens(vocabulary: Any, tokens: Sequence[int], what: str) -> None:
    """Refuse, in one line, an empty token list, a token that is not an integer or an id outside
    `vocabulary.n_vocab` (a Python caller's mistake that otherwise surfaced as an IndexError, a zip() error, an
    unbound local deep in a loop or a ctypes error)."""
    if len(tokens) == 0:
        raise ValueError(f"{what}: no token given (at least one is needed)")
    n_vocab = vocabulary.n_vocab
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, int | np.integer):
            raise ValueError(f"{what}: {token!r} is not a token id (an integer)")
        if not 0 <= token < n_vocab:
            raise ValueError(f"{what}: token id {token} is outside the vocabulary (0..{n_vocab - 1})")
