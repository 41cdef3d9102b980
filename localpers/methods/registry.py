"""Every personalization method the device offers, by name: the one list the CLI, TUI, API and demo consult.

Adding a method is one module with a `Method` subclass (`localpers.methods.base`) and one `Listed(...)` line
in `_METHODS` below; `localpers fit/rewrite --method NAME` and the API's `method` then offer it, with its
`summary` in `--help`. The line also says how the front ends show it: its `label` in prose and tables,
whether it is one of the methods compared side by side (the TUI's method selector, `localpers demo`'s
columns), and whether the correction's strength α and top-k (the TUI's steppers) apply to it. What a method
does (fits, needs a user, uses the fit's chosen strengths, decodes on its own) is on its class.

The list names each class by its module and loads it on first use (`get_method`): the command line's help and
completion read the names, summaries and options from here without loading llama.cpp and numpy. So the line
repeats the few class facts the front ends read before loading (`summary`, `fits`, `takes_strength`,
`takes_top_k`); a test checks them against the classes.

Front ends name no method themselves: they ask here for the default (`DEFAULT_METHOD`), the
non-personalized reference (`BASELINE_METHOD`) and the compared ones (`compared_methods`).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localpers.errors import InputError

if TYPE_CHECKING:
    from localpers.methods.base import Method


@dataclass(frozen=True)
class Listed:
    """One method as the front ends show it, read without loading its module."""

    name: str
    implementation: str  # "module:Class", loaded by `get_method`
    label: str  # its name in prose, tables and panel titles ("CARD", "cluster adapter")
    summary: str  # the class's `summary`: what it learns and how it changes decoding (`--help`)
    fits: bool = False  # the class's `fits`: whether `localpers fit --method NAME` learns anything
    takes_strength: bool = False  # the class's `takes_strength`
    takes_top_k: bool = False  # the class's `takes_top_k`
    compared: bool = False  # shown side by side: the TUI's method selector, `localpers demo`'s columns
    tuned: bool = False  # the correction's strength α and top-k apply (the TUI's steppers)


_METHODS: tuple[Listed, ...] = (
    Listed(
        "card",
        "localpers.methods.card.method:CardMethod",
        "CARD",
        "the bundle's base adapter (global, or your cluster's) with your history in the prompt + a top-k logit"
        " correction from your vector and token bias (fitted here)",
        fits=True,
        takes_strength=True,
        takes_top_k=True,
        compared=True,
        tuned=True,
    ),
    # CARD's base adapter uncorrected, where the bundle's `head.base` is global (the demo bundle's): shown beside
    # CARD so its correction's effect is visible
    Listed(
        "global-history",
        "localpers.methods.baselines:GlobalHistoryMethod",
        "adapter with your history",
        "the global adapter with your own earlier outputs in the prompt",
        compared=True,
    ),
    Listed(
        "cluster",
        "localpers.methods.baselines:ClusterMethod",
        "cluster adapter",
        "your cluster's adapter, without CARD's correction",
    ),
    Listed(
        "global",
        "localpers.methods.baselines:GlobalMethod",
        "global",
        "the shared global adapter: no personalization (the baseline)",
        compared=True,
    ),
    Listed(
        "card-global",
        "localpers.methods.baselines:CardGlobalMethod",
        "CARD on the global adapter",
        "CARD's correction on the global adapter (the 'without cluster LoRA' ablation)",
        takes_strength=True,
        takes_top_k=True,
        tuned=True,
    ),
    Listed(
        "cope",
        "localpers.methods.cope_method:CopeMethod",
        "CoPe",
        "a LoRA trained on your history here, decoded contrastively against its base adapter",
        fits=True,
        takes_strength=True,
    ),
    Listed(
        "exact",
        "localpers.methods.exact_method:ExactMethod",
        "EXACT",
        "the style attributes of your closest earlier inputs of the same task, written into the prompt",
        fits=True,
    ),
)
LISTED: dict[str, Listed] = {entry.name: entry for entry in _METHODS}

DEFAULT_METHOD = "card"  # what `rewrite`, `fit`, the API and the TUI use unless told otherwise
BASELINE_METHOD = "global"  # the non-personalized reference every comparison shows
UNFITTED_METHOD = "global-history"  # what CARD decodes before a fit: the user's history in the prompt


def method_names(*, fitted: bool | None = None) -> tuple[str, ...]:
    """All names, or only those that `fit` learns something for (`fitted=True`)."""
    return tuple(name for name, entry in LISTED.items() if fitted is None or entry.fits == fitted)


def methods_taking(option: str) -> tuple[str, ...]:
    """The methods a rewrite option means something to: `option` is "strength" or "top_k" (`Method.takes_*`)."""
    return tuple(name for name, entry in LISTED.items() if getattr(entry, f"takes_{option}"))


def compared_methods() -> tuple[str, ...]:
    """The methods shown side by side, personalized first and `BASELINE_METHOD` last."""
    return tuple(name for name, entry in LISTED.items() if entry.compared)


def get_method(name: str, *, for_fit: bool = False) -> Method:
    """The method called `name`, loaded on first use; a one-line error (exit 2) naming the choices for an
    unknown (or unfittable) one."""
    choices = method_names(fitted=True if for_fit else None)
    if name not in choices:
        if name in LISTED:  # a method with nothing to fit, asked of `fit`
            raise InputError(
                f"method {name!r} has no fit of its own (the methods on the adapters use CARD's, made by"
                f" `localpers fit`); fit takes: {', '.join(choices)}"
            )
        raise InputError(f"unknown method {name!r}; choose one of: {', '.join(choices)}")
    return _loaded(name)


@functools.cache
def _loaded(name: str) -> Method:
    module_name, _, class_name = LISTED[name].implementation.partition(":")
    return getattr(importlib.import_module(module_name), class_name)()  # type: ignore[no-any-return]


def listed(name: str) -> Listed:
    """How the front ends show the method called `name` (a KeyError for an unknown one)."""
    return LISTED[name]
