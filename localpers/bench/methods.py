"""The benchmark's method interface: a `Method` generates for one user's query, given a `UserProfile`.

A benchmark method is a name with parameters (`MethodSpec`: `card@strength=0.5`, `rag@k=2`,
`cluster@history=5`). It declares what it `needs` from the user's fit (nothing, the cluster id, or the full
CARD vector fit); the runner computes (and caches) that and hands it over as a `UserProfile`. Methods
generate through the `Personalizer` only; they never touch files, except CoPe and EXACT, whose per-user
state lives in a store of their own (`extra_methods`).

The methods themselves are in `prompt_methods` (global, rag, global-history, cluster), `card_methods`
(CARD and its variants) and `extra_methods` (CoPe, EXACT); `registry` lists them, and `method_names`
parses names, fills in defaults and expands presets. This module only defines the shapes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from localpers.engine.decoding import SamplerSettings
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.reports import RewriteResult
from localpers.tasks import get_task
from localpers.users.history import HistoryItem

Needs = Literal["none", "cluster", "vector"]
ParamValue = int | float | None
HISTORY_PARAM = "history"
# repetition penalties as method parameters (`global-history@presence=0.5`): llama.cpp's presence and frequency
# penalties in nats and DRY's multiplier (off unless named), and the word-only rule's nats (`repeated_words`,
# RESULTS 0ze; the headline task's default unless named, `@repeated_words=0` turns it off)
PENALTY_PARAMS: dict[str, type] = {
    "presence": float,
    "frequency": float,
    "dry": float,
    "repeated_words": float,
}
PENALTY_DEFAULTS: dict[str, ParamValue] = {"repeated_words": get_task("headline").repeated_word_penalty}


@dataclass(frozen=True)
class MethodSpec:
    """A method with its parameters, e.g. MethodSpec("card", (("strength", 0.5),))."""

    base: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @property
    def name(self) -> str:
        """The canonical name: "card@strength=0.5,top_k=50" (parameters sorted)."""
        if not self.params:
            return self.base
        return self.base + "@" + ",".join(f"{k}={_format_value(v)}" for k, v in self.params)

    def get(self, key: str, default: ParamValue = None) -> ParamValue:
        return dict(self.params).get(key, default)

    @property
    def history_limit(self) -> int | None:
        value = self.get(HISTORY_PARAM)
        return None if value is None else int(value)


def penalty_sampling(spec: MethodSpec) -> SamplerSettings | None:
    """Greedy decoding with the penalties `spec` names (`PENALTY_PARAMS`), or None (greedy with the task's word
    rule, as `rewrite` decodes) when it names none."""
    presence, frequency, dry = (float(spec.get(name) or 0.0) for name in ("presence", "frequency", "dry"))
    words = spec.get("repeated_words")
    if not (presence or frequency or dry) and words is None:
        return None
    return SamplerSettings(
        presence_penalty=presence,
        frequency_penalty=frequency,
        dry_multiplier=dry,
        repeated_word_penalty=None if words is None else float(words),
    ).validated()


def _format_value(value: ParamValue) -> str:
    if value is None:
        return "all"
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    if isinstance(value, float):
        short = f"{value:g}"
        # 6 digits named 0.1 and 0.1000001 alike: one cache file and one results entry for two settings
        return short if float(short) == value else repr(value)
    return str(value)


@dataclass
class UserProfile:
    """What a method may use for one user: the (possibly truncated) history and the fit it asked for."""

    name: str
    items: tuple[HistoryItem, ...]
    cluster: int | None = None
    vector: np.ndarray | None = None
    bias: TokenBias | None = None
    choice: dict[str, Any] | None = None  # the strengths `localpers fit` chose on the user's recent items
    fit_seconds: float = 0.0
    cluster_bytes: int = 0
    vector_bytes: int = 0
    fit_report: dict[str, Any] = field(default_factory=dict)


class Method(ABC):
    """One way of generating for a user. Subclasses set the class variables and `generate`."""

    name: ClassVar[str]
    description: ClassVar[str]
    needs: ClassVar[Needs] = "none"
    # the device method (`localpers.methods.registry`) this one measures as `rewrite` runs it; None for a
    # bench-only variant (an ablation, a fixed strength, the RAG baseline)
    device_method: ClassVar[str | None] = None
    uses_history: ClassVar[bool] = False
    # True when `generate` scores `reference` teacher-forced through the same correction (gold likelihood)
    scores_gold: ClassVar[bool] = False
    # parameter name -> its type (int or float); "history" is added for methods that use the history
    params: ClassVar[dict[str, type]] = {}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        """The value each parameter takes when the name does not set it."""
        return {}

    def check(self, personalizer: Personalizer) -> None:
        """Refuse (LocalpersError) if this bundle cannot run the method."""
        return None

    def prepare(self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec) -> Any:
        """Per-user work before the queries (timed as part of the fit); its result goes to `generate`."""
        return None

    @abstractmethod
    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        """The output for one query; with `reference` (methods with `scores_gold`), also its gold likelihood."""

    @staticmethod
    def global_rewrite(
        personalizer: Personalizer,
        text: str,
        reference: str | None = None,
        candidates: int = 1,
        sampling: SamplerSettings | None = None,
    ) -> RewriteResult:
        """The global adapter's output: the baseline, and what a user without history gets (as `rewrite` does)."""
        return personalizer.rewrite(
            text, method="global", reference=reference, candidates=candidates, sampling=sampling
        )

    def stored_bytes(self, profile: UserProfile) -> int:
        """Bytes the device keeps per user for this method, the user's own history not counted."""
        return {"none": 0, "cluster": profile.cluster_bytes, "vector": profile.vector_bytes}[self.needs]
