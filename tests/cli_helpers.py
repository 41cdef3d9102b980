"""What the command-line tests share: running a command through Typer's runner and reading a one-line refusal."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from localpers.cli import app

runner = CliRunner()


def invoke(*args: str, stdin: str | bytes | None = None) -> Any:
    """`localpers ARGS` in this process, with `stdin` as its standard input."""
    return runner.invoke(app, list(args), input=stdin)


def one_line_error(result: Any, fragment: str, code: int = 2) -> str:
    """The one `error: ...` line a refused command wrote on stderr, checked to hold `fragment` and to come with
    exit code `code`."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
    return lines[0]
