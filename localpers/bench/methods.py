"""The benchmark's methods: one small class each, in a registry, selectable by name with parameters.

A method name is `base` or `base@key=value,key=value`, e.g. `card@strength=0.5`, `rag@k=2`,
`card@history=5`, `card@reg=0.1`, `card@prior=1`. Every method that uses the history accepts
`history=N|all` (fit on the N most recent items only); the CARD methods also take `strength`, `top_k`,
`reg` (the L2 weight of the vector fit), `prior` (the fit shrinks lambda towards prior x the
cluster's default vector; 0 by default) and `bias` (the strength of the user's token bias; 0 = vector only). `parse_method` checks the name and its parameters;
`canonical_spec` drops parameters equal to the method's default, so `card@strength=<bundle alpha>`
and `card` share one cache. Adding a method (CoPe, EXACT) is one subclass of `Method` decorated
with `@register`.

A method declares what it `needs` from the user's fit: nothing, the cluster id, or the full CARD
vector fit; the runner computes (and caches) that and hands it over as a `UserProfile`. Methods
generate through the `Personalizer` only; they never touch files.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from localpers.errors import LocalpersError
from localpers.methods.card.correction import DEFAULT_BIAS_STRENGTH
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT, DEFAULT_REGULARISATION
from localpers.methods.card.personalizer import Personalizer, RewriteResult
from localpers.methods.card.token_bias import TokenBias
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import HistoryIndex, PromptFormat

Needs = Literal["none", "cluster", "vector"]
ParamValue = int | float | None
HISTORY_PARAM = "history"
POSITIVE_PARAMS = frozenset({"reg"})
_PARAM_PATTERN = re.compile(r"([a-z_]+)=([^,=@]+)")


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


def _format_value(value: ParamValue) -> str:
    if value is None:
        return "all"
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


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

    def stored_bytes(self, profile: UserProfile) -> int:
        """Bytes the device keeps per user for this method, the user's own history not counted."""
        return {"none": 0, "cluster": profile.cluster_bytes, "vector": profile.vector_bytes}[self.needs]


REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make the method selectable by its `name`."""
    if cls.name in REGISTRY:
        raise ValueError(f"method {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_method(name: str) -> Method:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise LocalpersError(f"unknown method {name!r}; choose one of: {', '.join(REGISTRY)}") from None


def allowed_params(method: Method) -> dict[str, type]:
    allowed = dict(method.params)
    if method.uses_history:
        allowed[HISTORY_PARAM] = int
    return allowed


def parse_method(text: str) -> MethodSpec:
    """`"card@strength=0.5,top_k=50"` -> MethodSpec; a one-line error for unknown names or parameters."""
    text = text.strip()
    base, _, param_text = text.partition("@")
    method = get_method(base)
    allowed = allowed_params(method)
    params: dict[str, ParamValue] = {}
    if param_text:
        for piece in param_text.split(","):
            match = _PARAM_PATTERN.fullmatch(piece.strip())
            if not match:
                raise LocalpersError(
                    f"method {text!r}: cannot read {piece!r}; write key=value, e.g. card@strength=0.5"
                )
            key, raw = match.groups()
            if key not in allowed:
                choices = ", ".join(allowed) or "none"
                raise LocalpersError(
                    f"method {text!r}: {base} has no parameter {key!r} (it takes: {choices})"
                )
            params[key] = _parse_value(text, key, raw, allowed[key])
    return MethodSpec(base, tuple(sorted(params.items())))


def _parse_value(text: str, key: str, raw: str, kind: type) -> ParamValue:
    """`raw` as `kind`; `history=all` is None. Counts (k, top_k) are >= 1, strength and history >= 0,
    the fit's regularisation `reg` > 0 (without it a separable set of pairs has no finite optimum)."""
    if key == HISTORY_PARAM and raw == "all":
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise LocalpersError(f"method {text!r}: {key}={raw} is not a valid {kind.__name__}") from None
    if key in POSITIVE_PARAMS:
        if not value > 0:  # also refuses nan
            raise LocalpersError(f"method {text!r}: {key}={raw} must be greater than 0")
        return value
    minimum = 0 if kind is float or key == HISTORY_PARAM else 1
    if not value >= minimum:  # also refuses nan
        raise LocalpersError(f"method {text!r}: {key}={raw} must be at least {minimum}")
    return value


def canonical_spec(spec: MethodSpec, personalizer: Personalizer, history_limit: int | None) -> MethodSpec:
    """`spec` with the run-wide history limit filled in and parameters at their defaults dropped."""
    method = get_method(spec.base)
    defaults = {**method.defaults(personalizer), HISTORY_PARAM: history_limit}
    params = dict(spec.params)
    if method.uses_history and HISTORY_PARAM not in params:
        params[HISTORY_PARAM] = history_limit
    kept = {k: v for k, v in params.items() if not _same(v, defaults.get(k, object()))}
    return MethodSpec(spec.base, tuple(sorted(kept.items())))


def effective_params(
    spec: MethodSpec, personalizer: Personalizer, history_limit: int | None
) -> dict[str, Any]:
    """Every parameter of `spec` with its value in this run (defaults filled in; history None = all)."""
    method = get_method(spec.base)
    values: dict[str, Any] = dict(method.defaults(personalizer))
    if method.uses_history:
        values[HISTORY_PARAM] = history_limit
    values.update(dict(spec.params))
    return values


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return isinstance(b, int | float) and float(a) == float(b)


# --------------------------------------------------------------------------------------------------
# The methods


@register
class GlobalMethod(Method):
    name = "global"
    scores_gold = True
    description = "global adapter, no personalization (the baseline)"

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        return personalizer.rewrite(text, method="global", reference=reference)


@register
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


def history_index(profile: UserProfile, task: str = "headline") -> HistoryIndex:
    """The user's examples for `task`, as the device's history index holds them."""
    return HistoryIndex(get_task(task), [(i.input, i.output) for i in profile.items if i.task == task])


class HistoryPromptMethod(Method):
    """A method whose prompt may show the user's past outputs: it prepares their history index once per user."""

    def prepare(self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec) -> Any:
        return history_index(profile)


@register
class GlobalHistoryMethod(HistoryPromptMethod):
    name = "global-history"
    scores_gold = True
    description = "global adapter with the user's closest past outputs in the prompt (history-conditioned)"
    uses_history = True
    params = {"examples": int}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        chosen = personalizer.prompt_format
        return {"examples": chosen.examples if chosen is not None else 5}

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
        examples = spec.get("examples", self.defaults(personalizer)["examples"])
        chosen = PromptFormat(examples=int(examples or 5))
        return personalizer.rewrite(
            text, method="global-history", history=prepared, prompt_format=chosen, reference=reference
        )


@register
class ClusterMethod(HistoryPromptMethod):
    name = "cluster"
    scores_gold = True
    description = "the user's cluster adapter only (history-conditioned prompt when the bundle has one)"
    needs = "cluster"
    uses_history = True

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
            return personalizer.rewrite(text, method="global", reference=reference)
        return personalizer.rewrite(
            text, method="cluster", cluster=profile.cluster, history=prepared, reference=reference
        )


@register
class CardMethod(HistoryPromptMethod):
    name = "card"
    scores_gold = True
    description = "cluster adapter + the user's vector correcting the top-k logits (CARD)"
    needs = "vector"
    uses_history = True
    params = {"strength": float, "top_k": int, "reg": float, "prior": float, "bias": float}
    adapter_method = "card"
    head_type: ClassVar[str | None] = None  # set by the full/factored-U variants

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        config = personalizer.head_config
        return {
            "strength": float(config.default_strength),
            "top_k": int(config.top_k),
            "reg": float(DEFAULT_REGULARISATION),
            "prior": float(DEFAULT_PRIOR_WEIGHT),
            "bias": float(DEFAULT_BIAS_STRENGTH),
        }

    def check(self, personalizer: Personalizer) -> None:
        actual = personalizer.head_config.u
        if self.head_type is not None and actual != self.head_type:
            raise LocalpersError(
                f"method {self.name} needs a bundle with a {self.head_type} U, but "
                f"{personalizer.bundle.directory} has a {actual} U; run it with --bundle pointing at such a bundle"
            )

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        if profile.cluster is None and self.adapter_method == "card":
            return personalizer.rewrite(
                text, method="global", reference=reference
            )  # cold start, as `rewrite` does
        strength = spec.get("strength")
        top_k = spec.get("top_k")
        bias_strength = spec.get("bias")
        return personalizer.rewrite(
            text,
            method=self.adapter_method,
            cluster=profile.cluster,
            vector=profile.vector,
            strength=None if strength is None else float(strength),
            top_k=None if top_k is None else int(top_k),
            history=prepared,
            bias=profile.bias,
            bias_strength=None if bias_strength is None else float(bias_strength),
            reference=reference,
        )


@register
class CardChosenMethod(CardMethod):
    name = "card-auto"
    description = (
        "CARD with the strengths `localpers fit` chose on the user's own recent items (what rewrite does)"
    )
    params = {"top_k": int, "reg": float, "prior": float}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        values = super().defaults(personalizer)
        values.pop("strength")
        values.pop("bias")
        return values

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        from localpers.methods.card.choice import stored_choice

        vector_strength, bias_strength, _ = stored_choice({"choice": profile.choice})
        chosen = MethodSpec(
            spec.base,
            tuple(
                (key, value)
                for key, value in (*spec.params, ("strength", vector_strength), ("bias", bias_strength))
                if value is not None
            ),
        )
        return super().generate(personalizer, profile, prepared, text, chosen, reference)


@register
class CardGlobalMethod(CardMethod):
    name = "card-global"
    description = "the user's vector on the global adapter (the paper's 'w/o LoRA' ablation)"
    adapter_method = "card-global"


@register
class CardFactoredUMethod(CardMethod):
    name = "card-factored-u"
    description = "CARD, requiring a bundle whose head has a factored U (E Q)"
    head_type = "factored"


@register
class CardFullUMethod(CardMethod):
    name = "card-full-u"
    description = "CARD, requiring a bundle whose head has a full (sparse) U"
    head_type = "full"


# --------------------------------------------------------------------------------------------------
# Presets: names that expand to several methods

LOW_RESOURCE_HISTORY = (1, 2, 5, 10, 20)
STRENGTH_MULTIPLIERS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
TOP_K_VALUES = (5, 10, 20, 50, 100)


def _strength_sweep(personalizer: Personalizer) -> list[str]:
    default = personalizer.head_config.default_strength
    return [f"card@strength={m * default:g}" for m in STRENGTH_MULTIPLIERS]


PRESETS: dict[str, Callable[[Personalizer], list[str]]] = {
    "main": lambda p: ["global", "rag", "cluster", "card"],
    "low-resource": lambda p: (
        [f"{base}@history={h}" for h in LOW_RESOURCE_HISTORY for base in ("cluster", "card")]
        + ["cluster", "card"]
    ),
    "alpha-sweep": _strength_sweep,
    "topk-sweep": lambda p: [f"card@top_k={k}" for k in TOP_K_VALUES],
    "related": lambda p: ["cope", "exact"],
}


def split_method_list(text: str) -> list[str]:
    """`"cluster,card@bias=2,history=20,rag"` -> `["cluster", "card@bias=2,history=20", "rag"]`.

    Commas separate methods and also a method's parameters; a piece that is only `key=value` continues the
    method before it.
    """
    names: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if names and "@" in names[-1] and "@" not in piece and _PARAM_PATTERN.fullmatch(piece):
            names[-1] += "," + piece
        else:
            names.append(piece)
    return names


def check_method_names(names: list[str]) -> None:
    """Refuse unknown methods or parameters before anything is loaded (presets are always valid)."""
    for name in names:
        for piece in split_method_list(name):
            if piece not in PRESETS:
                parse_method(piece)


def expand_methods(
    names: list[str], personalizer: Personalizer, history_limit: int | None
) -> list[MethodSpec]:
    """Presets expanded, names parsed and canonicalised, duplicates dropped, `global` first."""
    texts: list[str] = []
    for name in names:
        for piece in split_method_list(name):
            texts.extend(PRESETS[piece](personalizer) if piece in PRESETS else [piece])
    specs: list[MethodSpec] = [MethodSpec("global")]
    for text in texts:
        spec = canonical_spec(parse_method(text), personalizer, history_limit)
        get_method(spec.base).check(personalizer)
        if spec not in specs:
            specs.append(spec)
    return specs
