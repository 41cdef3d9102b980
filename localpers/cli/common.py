"""What every `localpers` command shares: the Typer app, one-line errors, text arguments, common options.

This module imports no command module (the command modules import it), so the command line has no import
circle: `localpers.cli.main` imports the command modules, and each of them registers itself on `app`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from localpers import __version__, interrupts
from localpers.cli import completion
from localpers.cli.streams import escaping_standard_output, is_utf8
from localpers.errors import InputError, LocalpersError
from localpers.paths import expand_user
from localpers.strict_json import strict_json_text
from localpers.untrusted import one_line

app = typer.Typer(
    name="localpers",
    help="An LLM that writes the way you write, without your writing leaving your machine.",
    epilog=(
        "Environment: LOCALPERS_HOME=DIR keeps every file of localpers under DIR; LOCALPERS_MODEL=PATH picks the"
        " backbone GGUF (as --model does); LOCALPERS_THREADS=N sets llama.cpp's threads; LOCALPERS_CPU_BUFFERS="
        "auto|repack|plain|all picks the weights' CPU layout; LOCALPERS_API_KEY=KEY guards `localpers api`;"
        " LOCALPERS_LLAMA_LOG=1 prints llama.cpp's log. `localpers doctor` shows what they give; README.md says"
        " more."
    ),
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=True,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """`typer.echo` onto standard output (`err`: standard error) as the process has it, so every line the
    command line prints is written as streamed text and Rich's are. On an ASCII one (`PYTHONIOENCODING=ascii`,
    a C locale without UTF-8 mode) Click's own default writes UTF-8 instead, which that output cannot show;
    written here, a character the output's encoding lacks becomes an escape (`\\u2014`): the stream escapes it
    once `localpers.cli.streams` has set it up (the console script, then the app's root callback),
    and this function does where nothing has yet (`--version`, handled while the command line is parsed)."""
    stream = sys.stderr if err else sys.stdout
    try:
        typer.echo(message, file=stream, nl=nl)
    except UnicodeEncodeError:  # raised before anything is written: the whole line is encoded at once
        encoding = getattr(stream, "encoding", None) or "ascii"
        typer.echo(message.encode(encoding, "backslashreplace").decode(encoding), file=stream, nl=nl)


def one_line_errors(func: F) -> F:
    """Print a LocalpersError as `error: ...` on stderr and exit with its code, never a traceback.

    A command given `--json` (its `as_json` argument) also prints `{"ok": false, "error": ...}` on stdout, so
    a script reading its output gets JSON either way. Path arguments arrive with `~` expanded: the shell leaves
    it in `--out=~/x` and in quotes."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved_now, streamed_now, depth_now = (
            _saved.set(None),
            _streamed_line.set(False),
            _depth.set(_depth.get() + 1),
        )
        kwargs = {name: _expanded(value) for name, value in kwargs.items()}
        # a step another command runs answers in its caller's format
        answered_now = _answered.set(False) if _depth.get() == 1 else None  # a step's answer is its caller's
        json_now = _json_verdict.set(
            kwargs.get("as_json") is True if _depth.get() == 1 else _json_verdict.get()
        )
        try:
            result = func(*args, **kwargs)
            if _depth.get() == 1:  # the command itself, not one another command called as a step
                interrupts.command_done()
            return result
        except LocalpersError as exc:
            # Messages quote outside input (file names, fields): escape anything that would break the
            # line (\n, U+2028) or drive the terminal (ESC).
            _refusal(one_line(str(exc)), as_json=kwargs.get("as_json") is True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP (`interrupts.Terminated`)
            raise stopped_exit(stop) from None
        except BrokenPipeError:
            raise
        except OSError as exc:  # the file system said no (disk full, permissions) somewhere not wrapped
            where = f" ({one_line(str(exc.filename))})" if exc.filename else ""
            _refusal(f"{one_line(exc.strerror or str(exc))}{where}", as_json=kwargs.get("as_json") is True)
            raise typer.Exit(1) from None
        except ImportError as exc:
            # A Ctrl-C that lands while a C extension initialises (sklearn's, on a stage's first K-means) comes
            # back as "ImportError: initialization failed" caused by the KeyboardInterrupt: still a Ctrl-C.
            stop = _ctrl_c_among_causes(exc)
            if stop is None:
                raise
            raise stopped_exit(stop) from None
        finally:
            _saved.reset(saved_now)
            _streamed_line.reset(streamed_now)
            _depth.reset(depth_now)
            _json_verdict.reset(json_now)
            if answered_now is not None:
                _answered.reset(answered_now)

    return wrapper  # type: ignore[return-value]


def _refusal(message: str, *, as_json: bool) -> None:
    """`error: message` on stderr; with --json also the verdict on stdout (only for the command itself: a command
    another one runs as a step leaves its caller's output alone)."""
    echo(f"error: {message}", err=True)
    if as_json and _depth.get() == 1:
        try:
            echo(json.dumps({"ok": False, "error": message}))  # ASCII, as every --json output
        except OSError:  # stdout itself failed (a full disk): the stderr line says it, once
            discard_unwritten_output()  # else written, failing and reported again at exit


def discard_unwritten_output() -> None:
    """Point standard output at the null device, so what could not be written is not tried again at exit
    (Python would report that as "Exception ignored" and exit 120)."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def ask_yes_no(question: str, *, default: bool = False, err: bool = False) -> bool:
    """`typer.confirm`, except that a Ctrl-C stays a Ctrl-C: Click turned it into "Aborted." and exit 1, where
    every other stop says `interrupted` (exit 130). Standard input at its end is a no. `err`: the question goes
    to standard error."""
    try:
        return bool(typer.confirm(question, default=default, err=err))
    except typer.Abort as abort:  # Click's for a Ctrl-C and for an ended input alike
        if isinstance(abort.__context__, KeyboardInterrupt):
            raise abort.__context__ from None
        return False


def _expanded(value: Any) -> Any:
    """A Path with a leading `~` expanded (as given when no home folder is known); anything else as it is."""
    if not isinstance(value, Path):
        return value
    try:
        return expand_user(value)
    except InputError:
        return value


_saved: contextvars.ContextVar[str | None] = contextvars.ContextVar("localpers_saved", default=None)
# How many commands wrapped by `one_line_errors` are running in this context (one calling another: 2).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("localpers_command_depth", default=0)
# Whether streamed text left stdout mid-line (`stdout_stream`), so a stop's report starts on a line of its own.
_streamed_line: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "localpers_streamed_line", default=False
)
# Whether the command running (the outermost one) was given --json: a stop then answers in JSON on stdout too.
_json_verdict: contextvars.ContextVar[bool] = contextvars.ContextVar("localpers_json_verdict", default=False)
# Whether the command has printed its JSON answer (`print_json`): a stop after it adds no second document.
_answered: contextvars.ContextVar[bool] = contextvars.ContextVar("localpers_answered", default=False)


def note_saved(what: str) -> None:
    """Note that the command's work is saved (`what`, e.g. "user 'ann' now has 490 items"): a stop from now on
    is reported as coming after it (the command need not be run again), not as an interruption of unknown
    effect."""
    _saved.set(what)


def stopped_exit(stop: BaseException, what_was_kept: str | None = None) -> typer.Exit:
    """Say on stderr that the command was stopped (by Ctrl-C: "interrupted"; by SIGTERM/SIGHUP: "terminated")
    and what that left, and give the exit to raise: 130, or 128 + the signal's number. A command given --json
    also prints `{"ok": false, "error": ...}` with the same words on stdout, as a refusal does, so a script
    reading its output finds JSON there."""
    from localpers import interrupts

    # Not "nothing was changed": a step may have been saved just before (an import's history, a fit's
    # caches). Every save is atomic, so no file is ever half-written.
    if _streamed_line.get():  # the stop came mid-line of a streamed output: end it, not glue the word to it
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write("\n")
            sys.stdout.flush()
    saved = _saved.get()
    if saved is not None:
        kept = f"this came after the work was saved: {saved}"
    else:
        kept = what_was_kept or "no file was left half-written (each is as it was, or fully saved)"
    report = f"{interrupts.stopped_word(stop)}; {kept}"
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        echo(report, err=True)
    if _json_verdict.get() and not _answered.get():
        with contextlib.suppress(OSError, ValueError):  # a closed or failing stdout: the stderr line said it
            echo(json.dumps({"ok": False, "error": report}))
    return typer.Exit(interrupts.exit_code(stop))


def _ctrl_c_among_causes(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt among `exc`'s causes and contexts, if one is."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def read_text_argument(text: str) -> str:
    """`-` reads standard input; anything else is the text itself. Either must be UTF-8 and hold some printable
    text, not only white space or control characters (exit 2 if not). It comes back in NFC, as history items are
    stored, so a text is measured, cut and matched against the history the same way whichever form it came in."""
    if text == "-":
        data = read_stdin_utf8()
        if _blank(data):
            raise InputError("standard input was empty; pipe some text or pass it as an argument")
        return unicodedata.normalize("NFC", data)
    if _blank(text):
        raise InputError("the text is empty; pass some text or - to read standard input")
    return unicodedata.normalize("NFC", checked_utf8(text, "the text argument"))


def read_stdin_utf8() -> str:
    """Standard input read as UTF-8 bytes, whatever the locale says (as history files are read): under a Latin-1
    locale, text decoded by the locale would be stored as mojibake. Refused in one line if it is not UTF-8."""
    from localpers.users.history import MAX_HISTORY_FILE_BYTES

    stream = sys.stdin
    # bounded as `history import -` is: a pipe that never ends must not take the machine's memory first
    raw = (
        stream.buffer.read(MAX_HISTORY_FILE_BYTES + 1)
        if hasattr(stream, "buffer")
        else stream.read(MAX_HISTORY_FILE_BYTES + 1).encode("utf-8", "surrogateescape")
    )
    if len(raw) > MAX_HISTORY_FILE_BYTES:
        raise InputError(
            f"standard input holds more than the {MAX_HISTORY_FILE_BYTES:,} bytes localpers reads as one text;"
            " pass the start of the text"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"standard input is not UTF-8 (byte {exc.start} cannot be read as UTF-8); convert it first, e.g."
            " with iconv -f latin1 -t utf-8"
        ) from None


def _blank(text: str) -> bool:
    """Whether `text` holds nothing but white space and control characters (NUL, ESC, ...): no words."""
    return not any(ch.isprintable() and not ch.isspace() for ch in text)


def checked_utf8(text: str, what: str) -> str:
    """`text`, refused in one line if it came from bytes that are not UTF-8 (Python keeps those as lone
    surrogates, which no tokenizer can encode). UTF-8 that a non-UTF-8 locale could not decode (an argument
    under `LC_ALL=C` with UTF-8 mode off) is recovered, not refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        try:
            return text.encode(sys.getfilesystemencoding(), "surrogateescape").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            pass
        where = len(text[: exc.start].encode("utf-8", errors="surrogateescape"))
        raise InputError(
            f"{what} is not UTF-8 (byte {where} cannot be read as UTF-8); convert it first, e.g. with "
            "iconv -f latin1 -t utf-8"
        ) from None
    return text


def _version_callback(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:  # completing `localpers --version <TAB>` must not print it
        echo(f"localpers {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """An LLM that writes the way you write, without your writing leaving your machine."""
    escaping_standard_output()  # done by the console script already; here for the app called from Python


ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", envvar="LOCALPERS_MODEL", help="Backbone GGUF path (default: embedded Gemma 3 270M)."
    ),
]
BundleOption = Annotated[
    str | None,
    typer.Option("--bundle", help="Bundle directory (default: the pulled bundle, else the demo bundle)."),
]
UserOption = Annotated[
    str | None,
    typer.Option(
        "--user",
        "-u",
        help="The user to act on (default: the active user).",
        autocompletion=completion.user_names,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def json_text(payload: Any, *, indent: int | None = None, default: Callable[[Any], Any] | None = None) -> str:
    """`payload` as strict JSON, non-ASCII text kept as it is: a NaN or infinity becomes null
    (`localpers.strict_json`)."""
    return strict_json_text(payload, indent=indent, default=default)


def print_json(payload: Any, *, indent: int | None = 2, default: Callable[[Any], Any] | None = None) -> None:
    """`payload` as strict JSON on stdout (what `--json` prints): indented, or one line with `indent=None`.
    Non-ASCII text is kept as it is on a UTF-8 stdout and escaped (`\\u00e9`) on any other, so the JSON is
    whole and valid whatever the locale.

    It is the command's answer: an object gets `"ok": true` first, as a refusal or a stop prints
    `{"ok": false, ...}`, so a script reads `out["ok"]` either way. An object with an "ok" of its own (doctor's:
    whether the set-up has no problem, with exit 1 where not) keeps it, where it is."""
    if isinstance(payload, dict) and "ok" not in payload:
        payload = {"ok": True, **payload}
    ensure_ascii = not is_utf8(getattr(sys.stdout, "encoding", None) or "utf-8")
    text = strict_json_text(payload, indent=indent, ensure_ascii=ensure_ascii, default=default)
    if not ensure_ascii:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a path of non-UTF-8 bytes (a lone surrogate): written raw, not UTF-8
            text = strict_json_text(payload, indent=indent, ensure_ascii=True, default=default)
    echo(text)
    _answered.set(True)


def counted(count: int, noun: str) -> str:
    """ "1 duplicate", "3 duplicates": `noun` takes an s unless there is exactly one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def items_phrase(count: int) -> str:
    """ "1 item", "3 items"."""
    return counted(count, "item")


def stdout_stream(*, strip_leading: bool) -> Callable[[str], None]:
    """A sink that writes streamed text to stdout as it comes.

    `strip_leading` (one-line tasks) drops the white space the output starts with: the first token of a
    headline is " Word", which `--json` and the TUI strip too.
    """
    started = not strip_leading

    def write(piece: str) -> None:
        nonlocal started
        if not piece:  # no text, only a step of a decode that could be stopped here
            return
        if not started:
            piece = piece.lstrip()
            if not piece:
                return
            started = True
        sys.stdout.write(piece)
        sys.stdout.flush()
        _streamed_line.set(not piece.endswith("\n"))

    return write
