"""The `localpers` console script: start the command line, and end quietly if Ctrl-C comes while it loads.

Importing the command line (Typer, Rich, every command module) takes a few tenths of a second; a Ctrl-C in
that time would otherwise print Python's import traceback, and one while click parses the arguments would end
the command with exit 130 and no word at all. This module (and its package's `__init__`) import nothing of
localpers until `main` runs, which first routes Ctrl-C (and SIGTERM, SIGHUP) through `localpers.interrupts`,
lets a finished command ignore them (`interrupts.settle_when_done`) and makes the standard streams usable
(`localpers.cli.streams`). With `--json` among the options (told by the word, before any `--`), a command line
Typer cannot parse also gets its verdict as JSON on stdout. It does nothing else.
"""

from __future__ import annotations

import contextlib
import sys


def main() -> None:
    from localpers import interrupts

    interrupts.install()  # a Ctrl-C that a C callback swallows is raised again when llama.cpp returns
    interrupts.settle_when_done()  # once a command's work is done, a late stop no longer turns it into exit 130
    from localpers.cli.streams import usable_standard_streams

    usable_standard_streams()
    try:
        from localpers.cli.main import app

        app()  # each command reports its own Ctrl-C (`one_line_errors`); this catches one while Typer sets up
    except KeyboardInterrupt as stop:  # also SIGTERM/SIGHUP (`interrupts.Terminated`)
        _say_stopped(stop)
    except SystemExit as exit_:
        swallowed = _ctrl_c_typer_swallowed(exit_)
        if swallowed is not None:
            _say_stopped(swallowed)
        _usage_error_as_json(exit_)
        _write_out_or_fail(exit_)
        raise
    except BrokenPipeError:
        raise
    except OSError as exc:  # outside any command: `--help` or `--version` into a full disk
        with contextlib.suppress(OSError):
            sys.stderr.write(f"error: {exc.strerror or exc}\n")
        from localpers.cli.common import discard_unwritten_output

        discard_unwritten_output()
        raise SystemExit(1) from None


def _write_out_or_fail(exit_: SystemExit) -> None:
    """Write out what a finished command left in stdout's buffer (a short `--json` answer stays there): into a
    full disk that failed only at exit, reported as "Exception ignored" with exit 120. Now it is one line and exit
    1 (a reader that left, a broken pipe, is not reported)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        from localpers.cli.common import discard_unwritten_output

        discard_unwritten_output()
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            with contextlib.suppress(OSError):
                sys.stderr.write(f"error: {exc.strerror or exc}\n")
            if exit_.code in (0, None):
                exit_.code = 1


def _ctrl_c_typer_swallowed(exit_: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C (or stop signal) Typer turned into exit 130 without a word (one while click parses the
    command line), if it did.

    Typer raises its `Exit(130)` *from* the KeyboardInterrupt and then `sys.exit`s inside that handler; a
    command's own Ctrl-C report raises `Exit(130) from None` after printing its line, so it is not matched.
    """
    typer_exit = exit_.__context__
    if exit_.code != 130 or typer_exit is None:
        return None
    cause = typer_exit.__cause__
    return cause if isinstance(cause, KeyboardInterrupt) else None


def _usage_error_as_json(exit_: SystemExit) -> None:
    """With `--json` on the command line, print the verdict on stdout for a command line Typer could not parse
    (its usage box goes to stderr), as a command's own refusals do: a script reading stdout gets JSON either way.

    Typer exits inside its handler of the usage error, so the error is the exit's context.
    """
    import typer

    error = exit_.__context__  # Typer's click exceptions (usage errors, bad parameters) are TyperExceptions
    if not isinstance(error, typer.TyperException) or "--json" not in _options_given(sys.argv[1:]):
        return
    import json

    from localpers.untrusted import one_line

    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(json.dumps({"ok": False, "error": one_line(error.format_message())}) + "\n")
        sys.stdout.flush()


def _options_given(arguments: list[str]) -> list[str]:
    """The arguments before a `--` (after it, `--json` would be a value, not the option)."""
    return arguments[: arguments.index("--")] if "--" in arguments else arguments


def _say_stopped(stop: KeyboardInterrupt) -> None:
    from localpers import interrupts

    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        sys.stderr.write(f"{interrupts.stopped_word(stop)}\n")
    raise SystemExit(interrupts.exit_code(stop)) from None
