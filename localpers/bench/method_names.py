"""Method names for the benchmark: `base` or `base@key=value,...`, checked, canonicalised, and presets expanded.

Every method that uses the history accepts `history=N|all` (fit on the N most recent items only); the CARD
methods also take `strength`, `top_k`, `reg` (the L2 weight of the vector fit), `prior` (the fit shrinks
lambda towards prior x the cluster's default vector; 0 by default) and `bias` (the strength of the user's
token bias; 0 = vector only). `parse_method` checks the name and its parameters against the registry (an
unknown one, a parameter given twice or a value out of range or not finite is an `InputError`: exit 2);
`canonical_spec` drops parameters equal to the method's default, so `card@strength=<bundle alpha>` and `card`
share one cache. Presets (`product`, the default; `main`, `low-resource`, `alpha-sweep`,
`topk-sweep`, `related`) expand to several names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from localpers.bench.methods import HISTORY_PARAM, Method, MethodSpec, ParamValue
from localpers.bench.registry import BASELINE, get_method, product_methods
from localpers.errors import InputError
from localpers.methods.card.personalizer import Personalizer

POSITIVE_PARAMS = frozenset({"reg"})
_PARAM_PATTERN = re.compile(r"([a-z_]+)=([^,=@]+)")


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
    if "@" in text and not param_text:
        raise InputError(f"method {text!r}: nothing follows '@'; write {base}@key=value, or {base} alone")
    if param_text:
        for piece in param_text.split(","):
            match = _PARAM_PATTERN.fullmatch(piece.strip())
            if not match:
                raise InputError(
                    f"method {text!r}: cannot read {piece!r}; write key=value, e.g. card@strength=0.5"
                )
            key, raw = match.groups()
            if key not in allowed:
                choices = ", ".join(allowed) or "none"
                raise InputError(f"method {text!r}: {base} has no parameter {key!r} (it takes: {choices})")
            if key in params:
                raise InputError(f"method {text!r}: {key} is given twice; give each parameter once")
            params[key] = _parse_value(text, key, raw, allowed[key])
    return MethodSpec(base, tuple(sorted(params.items())))


def _parse_value(text: str, key: str, raw: str, kind: type) -> ParamValue:
    """`raw` as `kind`; `history=all` is None. Counts (k, top_k) are >= 1, strength, history and recent >= 0,
    the fit's regularisation `reg` > 0 (without it a separable set of pairs has no finite optimum); a float is
    finite."""
    if key == HISTORY_PARAM and raw == "all":
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise InputError(f"method {text!r}: {key}={raw} is not a valid {kind.__name__}") from None
    if isinstance(value, float) and math.isinf(value):  # "inf", or "1e400" read as inf; nan is refused below
        raise InputError(f"method {text!r}: {key}={raw} is not a finite number")
    if key in POSITIVE_PARAMS:
        if not value > 0:  # also refuses nan
            raise InputError(f"method {text!r}: {key}={raw} must be greater than 0")
        return value
    minimum = 0 if kind is float or key in (HISTORY_PARAM, "recent", "dense", "described") else 1
    if not value >= minimum:  # also refuses nan
        raise InputError(f"method {text!r}: {key}={raw} must be at least {minimum}")
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
# Presets: names that expand to several methods

LOW_RESOURCE_HISTORY = (1, 2, 5, 10, 20)
STRENGTH_MULTIPLIERS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
TOP_K_VALUES = (5, 10, 20, 50, 100)


def _strength_sweep(personalizer: Personalizer) -> list[str]:
    default = personalizer.head_config.default_strength
    return [f"card@strength={m * default:g}" for m in STRENGTH_MULTIPLIERS]


DEFAULT_PRESET = "product"  # what `localpers bench` runs without --methods
PRESETS: dict[str, Callable[[Personalizer], list[str]]] = {
    # what the device compares side by side: global, the adapter with the user's history alone, the default
    "product": lambda p: product_methods(),
    # the CARD paper's comparison
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
    """Refuse unknown methods or parameters before anything is loaded (presets are always valid), and a list that
    names none (`-m ''`, which ran the baseline alone)."""
    if not any(split_method_list(name) for name in names):
        raise InputError("--methods names no method; give one or more (e.g. -m card-auto), or leave it out")
    for name in names:
        for piece in split_method_list(name):
            if piece not in PRESETS:
                parse_method(piece)


def expand_methods(
    names: list[str], personalizer: Personalizer, history_limit: int | None
) -> list[MethodSpec]:
    """Presets expanded, names parsed and canonicalised, duplicates dropped, the baseline (`global`) first."""
    texts: list[str] = []
    for name in names:
        for piece in split_method_list(name):
            texts.extend(PRESETS[piece](personalizer) if piece in PRESETS else [piece])
    specs: list[MethodSpec] = [MethodSpec(BASELINE)]
    for text in texts:
        spec = canonical_spec(parse_method(text), personalizer, history_limit)
        get_method(spec.base).check(personalizer)
        if spec not in specs:
            specs.append(spec)
    return specs
