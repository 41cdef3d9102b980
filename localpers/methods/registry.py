"""Every personalization method the device offers, by name: the one list the CLI, TUI and API consult.

Adding a method is one module with a `Method` subclass (`localpers.methods.base`) and one line in
`_METHODS` below; `localpers fit/rewrite --method NAME` then offer it, with its `summary` in `--help`.
"""

from __future__ import annotations

from localpers.errors import LocalpersError
from localpers.methods.base import Method
from localpers.methods.baselines import CardGlobalMethod, ClusterMethod, GlobalHistoryMethod, GlobalMethod
from localpers.methods.card.method import CardMethod
from localpers.methods.cope_method import CopeMethod
from localpers.methods.exact_method import ExactMethod

_METHODS: tuple[type[Method], ...] = (
    CardMethod,
    ClusterMethod,
    GlobalMethod,
    CardGlobalMethod,
    GlobalHistoryMethod,
    CopeMethod,
    ExactMethod,
)
METHODS: dict[str, Method] = {cls.name: cls() for cls in _METHODS}


def method_names(*, fitted: bool | None = None) -> tuple[str, ...]:
    """All names, or only those that `fit` learns something for (`fitted=True`)."""
    return tuple(name for name, method in METHODS.items() if fitted is None or method.fits == fitted)


def get_method(name: str, *, for_fit: bool = False) -> Method:
    """The method called `name`; a one-line error naming the choices for an unknown (or unfittable) one."""
    choices = method_names(fitted=True if for_fit else None)
    if name not in choices:
        raise LocalpersError(f"unknown method {name!r}; choose one of: {', '.join(choices)}")
    return METHODS[name]
