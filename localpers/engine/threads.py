"""How many threads llama.cpp runs, and how they wait for each other: a policy that survives a busy machine.

`default_threads()` is LOCALPERS_THREADS when set (a command's `--threads` wins over both), else the CPUs this
process may run on.

llama-cpp-python builds llama.cpp with OpenMP (libgomp), whose threads meet at a barrier after every operation
of the graph, hundreds of times per token. libgomp's default lets a waiting thread spin up to 300,000 times
before it sleeps: fastest on an idle machine, but when another program holds a core, the thread being waited
for is not running and every barrier spins away a time slice. Two localpers commands at once on 2 cores
decoded at ~1,600 ms per token instead of ~14 (docs/PERFORMANCE.md, forty-fourth session). Spinning 300 times
and then sleeping cost ~6% per token on an idle machine and held under 30 ms per token beside another decoding
process or two busy loops; sleeping at once (OMP_WAIT_POLICY=PASSIVE) cost ~75% on an idle machine.

libgomp reads its environment once, when it is loaded, and `import llama_cpp` loads it. So `load_llama_cpp`
imports llama_cpp with GOMP_SPINCOUNT set, then takes the variable out again, so that torch's own OpenMP and
the programs localpers starts see the environment the user gave. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT
wins. `localpers.engine.llama`, through which every other module reaches llama_cpp, calls it before anything
else; importing this module loads nothing (the command line reads `MAX_THREADS` from it at start).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

from localpers.errors import InputError, LocalpersError

THREADS_VARIABLE = "LOCALPERS_THREADS"
MAX_THREADS = 512  # ggml's own limit (GGML_MAX_N_THREADS)
POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
DEFAULT_SPIN_COUNT = "300"  # chosen with scripts/bench_wait_policy.py
LLAMA_CPP_PIN = (
    "llama-cpp-python==0.3.36"  # pyproject's pin (a test keeps them equal), for the reinstall advice
)


def default_threads(environ: Mapping[str, str] = os.environ) -> int:
    """LOCALPERS_THREADS if set, else the number of CPUs this process may run on (its affinity)."""
    value = environ.get(THREADS_VARIABLE, "").strip()
    if value:
        if not re.fullmatch(r"[0-9]+", value) or not 1 <= int(value) <= MAX_THREADS:
            raise InputError(  # a usage error (exit 2), as a bad LOCALPERS_MODEL is
                f"{THREADS_VARIABLE}={value[:40]!r} is not a number of threads: give a whole number from 1 to"
                f" {MAX_THREADS}, or unset it to use every CPU"
            )
        return int(value)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def choose_wait_policy(environ: MutableMapping[str, str]) -> list[str]:
    """Set GOMP_SPINCOUNT unless the user chose how OpenMP threads wait; returns the names it set."""
    if any(environ.get(name) for name in POLICY_VARIABLES):
        return []
    environ["GOMP_SPINCOUNT"] = DEFAULT_SPIN_COUNT
    return ["GOMP_SPINCOUNT"]


def load_llama_cpp() -> None:
    """Import llama_cpp (and with it libgomp) under the wait policy, leaving the environment as it was.

    A llama-cpp-python that cannot be loaded (a library missing, built for another CPU) is a one-line error
    saying how to reinstall it: only the commands that run a model need it. Its `_ggml` bindings load here too,
    for the same error."""
    added = choose_wait_policy(os.environ)
    try:
        import llama_cpp  # noqa: F401  (libgomp reads the policy now, once)
        from llama_cpp import _ggml  # noqa: F401  (loads libggml-base, which llama_cpp itself may not)
    except (
        ImportError,
        OSError,
        RuntimeError,
    ) as exc:  # llama_cpp raises RuntimeError for a library it cannot load
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise LocalpersError(
            f"llama-cpp-python cannot be loaded ({reason}); reinstall it with `pip install --force-reinstall"
            f" --no-cache-dir {LLAMA_CPP_PIN}` (it builds llama.cpp for this machine), then run `localpers doctor`"
        ) from None
    finally:
        for name in added:
            os.environ.pop(name, None)
