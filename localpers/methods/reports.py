"""What the device's rewrite and fit return, as plain data: results, per-step corrections, fit reports.

These dataclasses are shared by the CLI (`--json`), the TUI and the benchmark; they hold numbers and
text only and do no work. `localpers.methods.card.personalizer` produces them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localpers.users.history_prompt import ShownExample

# What the front ends call the stages a fit reports through its progress callback (stage, done, total);
# a stage not listed here is shown by its name.
FIT_STAGE_LABELS = {
    "negatives": "model's own outputs (y-)",
    "features": "pair features",
    "pairs": "pairs: y- and features",
    "choice": "choosing the correction",
    "load": "backbone into torch",
    "train": "LoRA training steps",
    "attributes": "attribute prompts scored",
    "demo articles": "articles rewritten",
}


@dataclass
class CandidateShift:
    """One top-k candidate at a step: its logit before and after the user's correction."""

    token: int
    piece: str
    before: float
    after: float


@dataclass
class RewriteStep:
    """What the correction did at one decoding step (for the Why view)."""

    token: int
    piece: str
    correction: float
    candidates: list[CandidateShift]


@dataclass
class RewriteResult:
    text: str
    method: str
    task: str
    cluster: int | None
    adapter: str | None
    strength: float | None
    top_k: int | None
    tokens: int
    prompt_ms: float
    ms_per_token: float
    total_ms: float
    steps: list[RewriteStep] = field(default_factory=list)
    stop_reason: str = "length"  # "eos", "stop", "length", or "context": the context was full
    prompt_tokens: int = 0
    repeated_word_penalty: float = (
        0.0  # the word rule's nats this rewrite decoded with (the task's default or set)
    )
    # Teacher-forced score of a reference output under the same corrected distribution (bench only).
    gold_logprob: float | None = None  # mean natural-log probability per reference token
    gold_tokens: int | None = None
    # How many characters of a long text the prompt carried (headline, title: an article's start); None: all.
    text_chars_read: int | None = None
    # The user's history items the prompt showed, each with why (asked for by `rewrite` and the TUI).
    examples: list[ShownExample] = field(default_factory=list)
    # The strength CARD's correction applied the user's token bias at (None: no token bias in it); `strength`
    # is the vector's alone, so a rewrite at strength 0 still carries the bias this says.
    bias_strength: float | None = None

    def to_json(self, *, with_steps: bool = False) -> dict[str, Any]:
        payload = asdict(self)
        if not with_steps:
            payload.pop("steps")
        payload["examples"] = [example.to_json() for example in self.examples]
        if not self.examples:
            payload.pop("examples")
        if self.gold_tokens is None:
            payload.pop("gold_logprob")
            payload.pop("gold_tokens")
        if self.text_chars_read is None:
            payload.pop("text_chars_read")
        return payload


@dataclass
class FitReport:
    """What `fit` did, stored in the user's state and printed by the CLI."""

    mode: str  # "vector", "too-few-pairs" (lambda = the prior) or "cold-start"
    cluster: int | None
    cluster_similarities: list[float]
    n_items: int
    n_pairs: int
    n_identical_skipped: int
    train_accuracy: float | None
    heldout_accuracy: float | None
    heldout_accuracy_default: float | None
    n_heldout: int
    regularisation: float | None
    vector_norm: float | None
    seconds: dict[str, float]
    bundle_sha256: str
    habits: list[str] = field(default_factory=list)  # the surface habits the fit found, in words
    n_too_long: int = 0  # history items left out: their pairs would not fit the model's context
    # `history_digest` of the whole stored history the fit was made from (None in fits made before it was kept)
    history_sha256: str | None = None
    # Not stored: true on the report of the fit a user imported without its history came with, which a fit of no
    # items keeps (`user_fit.fit_without_history`), so callers need not read the state again after the fit.
    kept_without_history: bool = False

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        payload.pop("kept_without_history")
        return payload
