"""The benchmark's prompt-level methods: the global adapter, RAG, the global adapter with history, the cluster adapter.

Each generates through `Personalizer.rewrite` with the device's own prompt functions
(`localpers.users.history_prompt`), so the bench measures the prompt `localpers rewrite` builds.
`rag` is the bench's own few-shot baseline (whole past items as examples, untrained); it has no device
counterpart.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from localpers.bench.methods import (
    PENALTY_DEFAULTS,
    PENALTY_PARAMS,
    Method,
    MethodSpec,
    ParamValue,
    UserProfile,
    penalty_sampling,
)
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.reports import RewriteResult
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat


class GlobalMethod(Method):
    name = "global"
    device_method = "global"
    scores_gold = True
    description = "global adapter, no personalization (the baseline)"
    # `candidates=N`: N outputs decoded side by side and the consensus one kept (`Personalizer.rewrite`); like
    # every parameter without a default, naming it makes another method of the run (an old run's cache stays valid)
    params = {"candidates": int, **PENALTY_PARAMS}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        return dict(PENALTY_DEFAULTS)

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        return self.global_rewrite(
            personalizer, text, reference, int(spec.get("candidates") or 1), penalty_sampling(spec)
        )


class RagMethod(Method):
    name = "rag"
    scores_gold = True
    description = "global adapter with the k history items most similar to the query (BM25) as examples"
    uses_history = True
    params = {"k": int}
    max_example_chars = 1000

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        return {"k": 4}

    def prepare(self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec) -> Any:
        from localpers.users.retrieval import Bm25Index

        return Bm25Index([f"{item.input} {item.output}" for item in profile.items]) if profile.items else None

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        k = int(spec.get("k", 4) or 4)
        prefix = ""
        if prepared is not None:
            examples = [profile.items[i] for i in prepared.top(text, k)]
            prefix = few_shot_prefix(examples, self.max_example_chars)
        return personalizer.rewrite(text, method="global", prompt_prefix=prefix, reference=reference)


def few_shot_prefix(examples: list[HistoryItem], max_chars: int = 1000) -> str:
    """The examples as completed prompts, most relevant last (nearest the query), one blank line apart."""
    parts = []
    for item in reversed(examples):
        prompt = get_task(item.task).prompt_for(item.input[:max_chars])
        parts.append(f"{prompt} {item.output}\n\n")
    return "".join(parts)


def history_index(profile: UserProfile, task: str = "headline", retrieval: str = "bm25") -> HistoryIndex:
    """The user's examples for `task`, as the device's history index holds them."""
    pool = [(i.input, i.output) for i in profile.items if i.task == task]
    return HistoryIndex(get_task(task), pool, retrieval)


FORMAT_PARAMS = ("examples", "recent", "described", "series")


def format_variant(base: PromptFormat, spec: MethodSpec) -> PromptFormat:
    """`base` with the spec's `examples`, `recent`, `described` and `series` where given (counts capped at
    `examples`; `series=0` shows no series)."""
    examples = int(spec.get("examples") or base.examples)
    recent = base.recent if spec.get("recent") is None else int(spec.get("recent") or 0)
    described = base.described if spec.get("described") is None else int(spec.get("described") or 0)
    series = base.series if spec.get("series") is None else int(spec.get("series") or 0)
    return replace(
        base,
        examples=examples,
        recent=min(recent, examples),
        described=min(described, examples),
        series=series,
    )


class HistoryPromptMethod(Method):
    """A method whose prompt may show the user's past outputs: it prepares their history index once per user.

    `dense=1` retrieves the per-text examples by MiniLM similarity instead of BM25 (an ablation).
    """

    def prepare(self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec) -> Any:
        return history_index(profile, retrieval="minilm" if spec.get("dense") else "bm25")


class GlobalHistoryMethod(HistoryPromptMethod):
    name = "global-history"
    device_method = "global-history"
    scores_gold = True
    description = (
        "global adapter with the user's past outputs in the prompt (history-conditioned), as the device"
    )
    uses_history = True
    # `described=N`: the closest N examples shown with their content (the bundle's value by default); `recent=N`:
    # N of the examples are the user's most recent outputs (the device's value by default; 0 = all retrieved, the
    # training format, which this method used before the seventeenth session)
    # `candidates=N`: N outputs decoded side by side and the consensus one kept (`Personalizer.rewrite`);
    # `series=N`: a series of N or more outputs shown by its members (the device's value by default; 0 = never)
    params = {
        "examples": int,
        "described": int,
        "recent": int,
        "series": int,
        "candidates": int,
        **PENALTY_PARAMS,
    }

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        chosen = personalizer.prompt_format
        if chosen is None:
            return {"examples": 5, "described": 0, "recent": 0, "series": 0, **PENALTY_DEFAULTS}
        return {
            "examples": chosen.examples,
            "described": chosen.described,
            "recent": chosen.recent,
            "series": chosen.series,
            **PENALTY_DEFAULTS,
        }

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        # Always an explicit format: on a plain bundle this is the "same prompt, adapter not trained on it" ablation.
        base = personalizer.prompt_format or PromptFormat()
        chosen = format_variant(
            PromptFormat(
                examples=base.examples, described=base.described, recent=base.recent, series=base.series
            ),
            spec,
        )
        return personalizer.rewrite(
            text,
            method="global-history",
            history=prepared,
            prompt_format=chosen,
            reference=reference,
            candidates=int(spec.get("candidates") or 1),
            sampling=penalty_sampling(spec),
        )


class ClusterMethod(HistoryPromptMethod):
    name = "cluster"
    device_method = "cluster"
    scores_gold = True
    description = "the user's cluster adapter only (history-conditioned prompt when the bundle has one)"
    needs = "cluster"
    uses_history = True
    # `examples=K,recent=N`: K examples in the prompt, N of them the user's most recent outputs instead of retrieved
    # ones (the device's default: the bundle's K, N = K less `CLOSEST_PER_TEXT`); others for choosing on the dev split
    params = {"examples": int, "recent": int, "dense": int, "described": int, "series": int}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        chosen = personalizer.prompt_format
        if chosen is None:
            return {"examples": 0, "recent": 0, "dense": 0, "described": 0, "series": 0}
        return {
            "examples": chosen.examples,
            "recent": chosen.recent,
            "dense": 0,
            "described": chosen.described,
            "series": chosen.series,
        }

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        if profile.cluster is None:  # no history: the device falls back to the global adapter
            return self.global_rewrite(personalizer, text, reference)
        chosen = personalizer.prompt_format
        variant = None
        if chosen is not None and any(spec.get(key) is not None for key in FORMAT_PARAMS):
            variant = format_variant(chosen, spec)
        return personalizer.rewrite(
            text,
            method="cluster",
            cluster=profile.cluster,
            history=prepared,
            prompt_format=variant,
            reference=reference,
        )
