"""The publisher's training precision: what an explicit or `auto` choice gives on a CPU without bf16 instructions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from localpers.publish import sft  # noqa: E402


def context_asking(precision: str) -> SimpleNamespace:
    logged: list[str] = []
    return SimpleNamespace(options=SimpleNamespace(precision=precision), log=logged.append, logged=logged)


def test_explicit_bf16_without_cpu_support_is_kept_and_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sft, "cpu_has_bf16", lambda: False)
    context = context_asking("bf16")
    info = sft.measure_precision(context, torch.nn.Linear(2, 2), [])
    assert info["chosen"] == "bf16"
    assert info["warning"] == "no avx512_bf16/amx_bf16"
    assert len(context.logged) == 1 and "--precision auto" in context.logged[0]


def test_auto_without_cpu_support_picks_fp32_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sft, "cpu_has_bf16", lambda: False)
    context = context_asking("auto")
    info = sft.measure_precision(context, torch.nn.Linear(2, 2), [])
    assert info["chosen"] == "fp32" and context.logged == []


def test_explicit_bf16_with_cpu_support_is_kept_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sft, "cpu_has_bf16", lambda: True)
    context = context_asking("bf16")
    info = sft.measure_precision(context, torch.nn.Linear(2, 2), [])
    assert info == {"chosen": "bf16", "measured": {}} and context.logged == []
