"""Regression tests for the fifty-fourth session's audit of interrupted commands and damaged user state.

Each failed on the code before its fix: a Ctrl-C swallowed while llama.cpp logged (the command carried on
and saved), an import traceback for a Ctrl-C while the command line loaded, a traceback for text that is not
UTF-8, for a history file with a Latin-1 byte (on the rewrite path) and for wrongly typed state.json fields.
"""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from localpers import interrupts
from localpers.cli import app
from localpers.engine import backend
from localpers.errors import LocalpersError
from localpers.methods.card.user_state import user_profile
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore


class _InterruptingList(list):
    def append(self, item: object) -> None:  # as if Ctrl-C arrived while the callback ran
        raise KeyboardInterrupt


def test_a_ctrl_c_inside_the_llama_log_callback_is_kept_and_raised_after() -> None:
    recorder = backend._log_recorder
    previous = recorder.recording
    recorder.recording = _InterruptingList()
    try:
        recorder(2, b"llama_model_loader: loaded meta data\n", None)  # must not raise inside the callback
    finally:
        recorder.recording = previous
    with pytest.raises(KeyboardInterrupt):
        backend.raise_pending_interrupt()
    backend.raise_pending_interrupt()  # raised once only


def test_recorded_llama_log_raises_a_ctrl_c_that_came_inside_it() -> None:
    with pytest.raises(KeyboardInterrupt), backend.recorded_llama_log():
        interrupts.note()


def test_the_sigint_handler_notes_a_ctrl_c_that_c_code_may_swallow(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    monkeypatch.setattr(signal, "getsignal", lambda _: signal.default_int_handler)
    installed = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.setdefault(signum, handler))
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    interrupts.install()
    handler = installed[signal.SIGINT]
    # ctypes reports the exception it drops; a Ctrl-C's report stays off the terminal, others go through
    sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt))
    sys.unraisablehook(other := types.SimpleNamespace(exc_type=ValueError))
    assert reported == [other]
    with contextlib.suppress(KeyboardInterrupt):  # ctypes drops it here
        handler(signal.SIGINT, None)  # what Python runs inside a ctypes callback
    with pytest.raises(KeyboardInterrupt):
        backend.init_backend()  # the next return from llama.cpp raises it
    interrupts.raise_pending()  # once


def test_a_ctrl_c_while_the_command_line_loads_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localpers.cli import entry

    class Loading(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            raise KeyboardInterrupt

    monkeypatch.setattr("localpers.interrupts.install", lambda: None)  # leave pytest's own SIGINT handler
    monkeypatch.setitem(sys.modules, "localpers.cli.main", Loading("localpers.cli.main"))
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130 and capsys.readouterr().err == "interrupted\n"

    def setting_up() -> None:  # a Ctrl-C while Typer builds the command, before any command runs
        raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "localpers.cli.main", types.SimpleNamespace(app=setting_up))
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def run_user_list(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """`localpers user list` through the console script: (exit code, standard error)."""
    from localpers.cli import entry

    monkeypatch.setattr("localpers.interrupts.install", lambda: None)  # leave pytest's own SIGINT handler
    monkeypatch.setattr(sys, "argv", ["localpers", "user", "list"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    return stopped.value.code, capsys.readouterr().err


def test_a_ctrl_c_while_click_parses_the_arguments_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import typer.core

    def parsing(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Typer turns this into a silent exit 130

    monkeypatch.setattr(typer.core.TyperGroup, "parse_args", parsing)
    code, err = run_user_list(monkeypatch, capsys)
    assert code == 130 and err == "interrupted\n"


def test_a_command_that_reported_its_own_ctrl_c_is_not_reported_twice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localpers.cli import users

    def listing(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(users, "UserStore", listing)
    code, err = run_user_list(monkeypatch, capsys)
    assert code == 130 and err.count("interrupted") == 1, err


@pytest.mark.parametrize(
    "args", [["rewrite", "Caf\udce9 owners protest"], ["generate", "abc \udced\udca0\udc80"]]
)
def test_text_that_is_not_utf8_is_refused_in_one_line(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output  # a malformed argument
    assert "is not UTF-8 (byte" in result.output and "Traceback" not in result.output


def test_a_history_file_with_a_latin1_byte_is_one_line_on_the_rewrite_path() -> None:
    user = UserStore().create("ann")
    user.save_history([HistoryItem.create("headline", "An article.", "Screw-Up At The Plant")])
    user.history_path.write_bytes(user.history_path.read_bytes().replace(b"Screw-Up", b"Screw\xe9Up"))
    with pytest.raises(LocalpersError, match=r"history.jsonl line 1: not UTF-8 text; save the file as UTF-8"):
        user.history_index(get_task("headline"))


@pytest.mark.parametrize("cluster", ["x", 1.5, True, -1])
def test_a_wrongly_typed_cluster_in_state_json_is_one_line(cluster: object) -> None:
    user = UserStore().create("ann")
    user.save_fit(np.ones(4, dtype=np.float32), {"cluster": cluster})
    with pytest.raises(
        LocalpersError,
        match=r"state.json is damaged: field 'cluster' is .*run `localpers fit --user ann` again",
    ):
        user_profile(user)


def test_user_show_with_a_wrongly_typed_item_count_says_so(localpers_home: Path) -> None:
    user = UserStore().create("ann")
    user.save_state({"fit": {"n_items": "x"}})
    result = CliRunner().invoke(app, ["user", "show", "ann"])
    assert result.exit_code == 0, result.output
    assert "fit.n_items is damaged" in result.output and "Traceback" not in result.output
