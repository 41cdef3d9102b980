"""Which of ggml's extra CPU buffer types the backbone's weights may use: one decision, made here.

ggml offers the CPU backend "extra" buffer types that store weights in a faster layout: `CPU_REPACK`
(interleaved quant blocks for AVX2/AVX-512/NEON kernels), `AMX` (Intel AMX tiles), `KLEIDIAI` (Arm).
llama.cpp puts each weight in the first extra type that supports it, so on an AMX CPU the AMX type
wins, and ggml's AMX mat-mul crashes in `llama_decode` (llama.cpp issue 20824, unfixed upstream).

`choose_buffer_types` turns the setting (`LOCALPERS_CPU_BUFFERS`, default `auto`) and the buffer types
this llama.cpp build offers into the list the engine lets llama.cpp choose from, with a reason:

- `auto`: every extra type except those known to be broken (AMX): on an AMX CPU the weights still
  get CPU_REPACK, which is what a CPU without AMX uses anyway;
- `repack`: CPU_REPACK only; `plain`: no extra type (plain CPU buffers: slower, always works);
- `all`: llama.cpp's own choice, AMX included (to check whether a newer llama.cpp fixed it).

This module is pure: it reads `/proc/cpuinfo` for the report but imports no llama.cpp; the engine
applies the choice. It does not decide thread counts or anything about GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "LOCALPERS_CPU_BUFFERS"
SETTINGS = ("auto", "repack", "plain", "all")
REPACK = "CPU_REPACK"
# Extra buffer types that `auto` never uses, with why. Names are ggml's `ggml_backend_buft_name`.
KNOWN_BROKEN: dict[str, str] = {
    "AMX": (
        "ggml's AMX mat-mul crashed in llama_decode on a user's Xeon (llama.cpp issue 20824);"
        " LOCALPERS_CPU_BUFFERS=all opts in"
    ),
}


class BufferSettingError(ValueError):
    """An unknown LOCALPERS_CPU_BUFFERS value."""


@dataclass(frozen=True)
class BufferChoice:
    """The extra buffer types llama.cpp may put weights in, in its order of preference, and why."""

    setting: str
    offered: tuple[str, ...]
    allowed: tuple[str, ...]
    reason: str

    @property
    def use_extra_buffers(self) -> bool:
        return bool(self.allowed)


def setting_from_environment() -> str:
    """The LOCALPERS_CPU_BUFFERS value (default `auto`), checked."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in SETTINGS:
        raise BufferSettingError(
            f"{ENV_VAR}={value!r} is not one of {', '.join(SETTINGS)}; unset it or pick one of those"
        )
    return value


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor (empty where /proc/cpuinfo is not readable)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def amx_flags(flags: Iterable[str]) -> list[str]:
    """The AMX flags among `flags`, sorted (e.g. amx_bf16, amx_int8, amx_tile)."""
    return sorted(flag for flag in flags if flag.startswith("amx"))


def choose_buffer_types(offered: Sequence[str], setting: str, flags: Iterable[str] = ()) -> BufferChoice:
    """The extra buffer types to allow among those `offered` by this llama.cpp build, for `setting`."""
    if setting not in SETTINGS:
        raise BufferSettingError(
            f"unknown CPU buffer setting {setting!r}; choose one of {', '.join(SETTINGS)}"
        )
    offered = tuple(offered)
    amx = amx_flags(flags)
    cpu_note = f"CPU has {', '.join(amx)}" if amx else "CPU has no AMX"
    if setting == "plain":
        return BufferChoice(setting, offered, (), f"{ENV_VAR}=plain: plain CPU buffers only ({cpu_note})")
    if setting == "all":
        return BufferChoice(
            setting, offered, offered, f"{ENV_VAR}=all: llama.cpp's own choice, known-broken types included"
        )
    if setting == "repack":
        if REPACK in offered:
            return BufferChoice(setting, offered, (REPACK,), f"{ENV_VAR}=repack ({cpu_note})")
        return BufferChoice(
            setting,
            offered,
            (),
            f"{ENV_VAR}=repack, but this llama.cpp build offers no {REPACK}: plain buffers",
        )
    # auto: everything offered except what is known to crash. AMX is dropped whatever the flags say, since
    # a build only offers it after it found AMX at run time.
    dropped = [name for name in offered if name in KNOWN_BROKEN]
    allowed = tuple(name for name in offered if name not in KNOWN_BROKEN)
    if dropped:
        why = "; ".join(f"{name} left out: {KNOWN_BROKEN[name]}" for name in dropped)
        return BufferChoice(setting, offered, allowed, f"auto ({cpu_note}): {why}")
    if not offered:
        return BufferChoice(
            setting, offered, (), f"auto ({cpu_note}): this llama.cpp build offers no extra type"
        )
    return BufferChoice(setting, offered, allowed, f"auto ({cpu_note}): every offered type is known to work")
