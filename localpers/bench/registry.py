"""Every method the benchmark can run, by name, and which device method each one measures.

The list is explicit: adding a benchmark method is one class (in `prompt_methods`, `card_methods`,
`extra_methods` or a module of its own) and one line in `_METHODS`. A class that measures what
`localpers rewrite --method NAME` does sets `device_method = NAME`; `unmeasured_device_methods` names the
device methods (`localpers.methods.registry`) no benchmark method measures, which the test suite keeps
empty, so a method added to the device is not silently missing from the benchmark.
"""

from __future__ import annotations

from localpers.bench.card_methods import (
    CardChosenMethod,
    CardFactoredUMethod,
    CardFullUMethod,
    CardGlobalMethod,
    CardMethod,
)
from localpers.bench.extra_methods import CopeBenchMethod, ExactBenchMethod
from localpers.bench.methods import Method
from localpers.bench.prompt_methods import ClusterMethod, GlobalHistoryMethod, GlobalMethod, RagMethod
from localpers.errors import InputError
from localpers.methods.registry import BASELINE_METHOD, DEFAULT_METHOD, compared_methods, method_names

_METHODS: tuple[type[Method], ...] = (
    GlobalMethod,
    RagMethod,
    GlobalHistoryMethod,
    ClusterMethod,
    CardMethod,
    CardChosenMethod,
    CardGlobalMethod,
    CardFactoredUMethod,
    CardFullUMethod,
    CopeBenchMethod,
    ExactBenchMethod,
)
REGISTRY: dict[str, type[Method]] = {cls.name: cls for cls in _METHODS}


def get_method(name: str) -> Method:
    """A fresh instance of the method called `name`; a one-line error naming the choices for an unknown one."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of: {', '.join(REGISTRY)}") from None


def bench_method_for(device_method: str) -> str | None:
    """The benchmark method that measures the device method `device_method` as `rewrite` runs it."""
    return next((cls.name for cls in _METHODS if cls.device_method == device_method), None)


def unmeasured_device_methods() -> list[str]:
    """Device methods that no benchmark method measures (kept empty by the tests)."""
    return [name for name in method_names() if bench_method_for(name) is None]


BASELINE: str = bench_method_for(BASELINE_METHOD) or GlobalMethod.name
"""The device's non-personalized reference as the benchmark names it; every run includes it, every delta is to it."""

DEFAULT: str = bench_method_for(DEFAULT_METHOD) or CardChosenMethod.name
"""What `rewrite` does after `fit`, as the benchmark names it: the method the product's targets are judged on."""


def product_methods() -> list[str]:
    """The methods the front ends compare side by side, as the benchmark names them, the baseline first."""
    names = [bench_method_for(name) for name in reversed(compared_methods())]
    return [name for name in names if name is not None]
