"""Device-command options that were accepted and then ignored or misreported (a report-only audit).

`rewrite --strength/--top-k` for a method with no correction printed the plain output (exit 0); a `--model`
that is not a GGUF file was reported as "the bundle was built for another backbone"; `profile --task bogus`
exited 0. Each is refused before a model loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.methods.registry import METHODS

runner = CliRunner()


@pytest.mark.parametrize("method", ["global", "cluster", "global-history", "exact"])
@pytest.mark.parametrize("flag", [["--strength", "50"], ["--top-k", "3"]])
def test_a_correction_option_for_a_method_without_one_is_refused(method: str, flag: list[str]) -> None:
    result = runner.invoke(app, ["rewrite", "An article.", "-m", method, *flag, "--model", "/nonexistent"])
    assert result.exit_code == 2, result.output
    assert f"{flag[0]} applies to" in result.stderr and f"not to {method}" in result.stderr
    assert "/nonexistent" not in result.stderr  # refused before the backbone is looked for


def test_the_methods_that_take_each_option_are_the_ones_that_read_it() -> None:
    assert {name for name, method in METHODS.items() if method.takes_strength} == {
        "card",
        "card-global",
        "cope",
    }
    assert {name for name, method in METHODS.items() if method.takes_top_k} == {"card", "card-global"}


@pytest.mark.parametrize("command", [["rewrite", "An article.", "-m", "global"], ["fit"]])
def test_a_model_that_is_not_gguf_is_named_as_such(tmp_path: Path, command: list[str]) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    if command == ["fit"]:
        assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    result = runner.invoke(app, [*command, "--model", str(fake)])
    assert result.exit_code == 2, result.output
    assert f"backbone {fake} (from argument) is not a GGUF file" in result.stderr
    assert "the bundle was built for" not in result.stderr


@pytest.mark.parametrize("extra", [[], ["--text", "An article."]])
def test_profile_refuses_an_unknown_task(extra: list[str]) -> None:
    assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    result = runner.invoke(app, ["profile", "--task", "bogus", *extra])
    assert result.exit_code == 2, result.output
    assert "unknown task 'bogus'" in result.stderr
