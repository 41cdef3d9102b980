"""Every personalization method the device offers, by name: the one list the CLI, TUI, API and demo consult.

Adding a method is one module with a `Method` subclass (`localpers.methods.base`) and one `Listed(...)` line
in `_METHODS` below; `localpers fit/rewrite --method NAME` and the API's `method` then offer it, with its
`summary` in `--help`. The line also says how the front ends show it: its `label` in prose and tables,
whether it is one of the methods compared side by side (the TUI's method selector, `localpers demo`'s
columns), and whether the correction's strength α and top-k (the TUI's steppers) apply to it. What a method
does (fits, needs a user, uses the fit's chosen strengths, decodes on its own) is on its class.

Front ends name no method themselves: they ask here for the default (`DEFAULT_METHOD`), the
non-personalized reference (`BASELINE_METHOD`) and the compared ones (`compared_methods`).
"""

from __future__ import annotations

from dataclasses import dataclass

from localpers.errors import InputError
from localpers.methods.base import Method
from localpers.methods.baselines import CardGlobalMethod, ClusterMethod, GlobalHistoryMethod, GlobalMethod
from localpers.methods.card.method import CardMethod
from localpers.methods.cope_method import CopeMethod
from localpers.methods.exact_method import ExactMethod


@dataclass(frozen=True)
class Listed:
    """One method as the front ends show it."""

    method: type[Method]
    label: str  # its name in prose, tables and panel titles ("CARD", "cluster adapter")
    compared: bool = False  # shown side by side: the TUI's method selector, `localpers demo`'s columns
    tuned: bool = False  # the correction's strength α and top-k apply (the TUI's steppers)


_METHODS: tuple[Listed, ...] = (
    Listed(CardMethod, "CARD", compared=True, tuned=True),
    # CARD's base adapter uncorrected, where the bundle's `head.base` is global (the demo bundle's): shown beside
    # CARD so its correction's effect is visible
    Listed(GlobalHistoryMethod, "adapter with your history", compared=True),
    Listed(ClusterMethod, "cluster adapter"),
    Listed(GlobalMethod, "global", compared=True),
    Listed(CardGlobalMethod, "CARD on the global adapter", tuned=True),
    Listed(CopeMethod, "CoPe"),
    Listed(ExactMethod, "EXACT"),
)
METHODS: dict[str, Method] = {entry.method.name: entry.method() for entry in _METHODS}
LISTED: dict[str, Listed] = {entry.method.name: entry for entry in _METHODS}

DEFAULT_METHOD = CardMethod.name  # what `rewrite`, `fit`, the API and the TUI use unless told otherwise
BASELINE_METHOD = GlobalMethod.name  # the non-personalized reference every comparison shows
UNFITTED_METHOD = GlobalHistoryMethod.name  # what CARD decodes before a fit: the user's history in the prompt


def method_names(*, fitted: bool | None = None) -> tuple[str, ...]:
    """All names, or only those that `fit` learns something for (`fitted=True`)."""
    return tuple(name for name, method in METHODS.items() if fitted is None or method.fits == fitted)


def methods_taking(option: str) -> tuple[str, ...]:
    """The methods a rewrite option means something to: `option` is "strength" or "top_k" (`Method.takes_*`)."""
    return tuple(name for name, method in METHODS.items() if getattr(method, f"takes_{option}"))


def compared_methods() -> tuple[str, ...]:
    """The methods shown side by side, personalized first and `BASELINE_METHOD` last."""
    return tuple(name for name, entry in LISTED.items() if entry.compared)


def get_method(name: str, *, for_fit: bool = False) -> Method:
    """The method called `name`; a one-line error (exit 2) naming the choices for an unknown (or unfittable)
    one."""
    choices = method_names(fitted=True if for_fit else None)
    if name not in choices:
        raise InputError(f"unknown method {name!r}; choose one of: {', '.join(choices)}")
    return METHODS[name]


def listed(name: str) -> Listed:
    """How the front ends show the method called `name` (a KeyError for an unknown one)."""
    return LISTED[name]
