"""SIGTERM and SIGHUP end a command as a Ctrl-C does: its clean-up runs, one line says so, exit 128 + the signal.

Before, `kill` ended a command where it stood (exit 143 with no word, a `.partial` file left behind) and left
`localpers tui`'s terminal in the alternate screen. The signals are sent to child processes, never to pytest.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import pytest
import typer

from localpers import interrupts
from localpers.cli.common import one_line_errors

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
TESTS = Path(__file__).parent


def _default_stop_signals() -> None:
    """In the child before it starts: Ctrl-C, SIGTERM and SIGHUP with their default actions, whatever the test
    process left them at (a child inherits an ignored signal, and Python then never raises KeyboardInterrupt: a
    full run once left SIGINT ignored and `serve` waited out the test's 60 s)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _cli(home: Path, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "LOCALPERS_HOME": str(home)}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "localpers.cli", *args],
        text=True,
        env=env,
        preexec_fn=_default_stop_signals,  # noqa: PLW1509 - only signal dispositions, no threads touched
        **popen,
    )


def _unread_bytes(pipe_write_end: int) -> int:
    """How much written to a pipe its reader has not taken yet."""
    count = array.array("i", [0])
    fcntl.ioctl(pipe_write_end, termios.FIONREAD, count)
    return count[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_command_stopped_by_a_signal_says_so_and_exits_128_plus_its_number(
    tmp_path: Path, signum: int
) -> None:
    home = tmp_path / "home"
    created = _cli(home, "user", "create", "ann", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert created.wait(timeout=120) == 0, created.communicate()
    importing = _cli(
        home,
        "history",
        "import",
        "-",
        "--user",
        "ann",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert importing.stdin is not None
    importing.stdin.write('{"input": "Council approves budget", "output": "Budget approved"}\n')
    importing.stdin.flush()
    deadline = time.monotonic() + 120
    while _unread_bytes(importing.stdin.fileno()) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the command is reading its standard input (its end never comes)
    importing.send_signal(signum)
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == 128 + signum, err
    assert err.startswith("terminated; no file was left half-written"), err
    history = home / "users" / "ann" / "history.jsonl"
    assert not history.exists() or history.read_text() == ""
    assert not list((home / "users" / "ann").glob("*.partial")) and not list(home.rglob(".*.partial"))


def test_the_handler_raises_terminated_which_is_handled_as_a_ctrl_c() -> None:
    code = textwrap.dedent(
        """
        import os, signal
        from localpers import interrupts
        interrupts.install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            raise SystemExit("not stopped")
        except KeyboardInterrupt as stop:
            print(interrupts.stopped_word(stop), interrupts.exit_code(stop))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout) == (0, "terminated 143\n"), result.stderr


def test_an_ignored_sighup_stays_ignored() -> None:
    code = textwrap.dedent(
        """
        import signal
        from localpers import interrupts
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
        interrupts.install()
        print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.stdout == "True\n", result.stderr


def test_a_stop_swallowed_by_a_c_callback_is_raised_again_as_what_it_was() -> None:
    interrupts.note(interrupts.Terminated(signal.SIGTERM))
    interrupts.note()  # the callback's own catch notes it again without knowing what it was
    with pytest.raises(interrupts.Terminated):
        interrupts.raise_pending()
    interrupts.raise_pending()  # once


@pytest.mark.parametrize(
    ("stop", "code", "word"),
    [(KeyboardInterrupt(), 130, "interrupted"), (interrupts.Terminated(signal.SIGTERM), 143, "terminated")],
)
def test_one_line_errors_reports_the_stop_by_its_kind(
    stop: KeyboardInterrupt, code: int, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def command() -> None:
        raise stop

    with pytest.raises(typer.Exit) as ended:
        one_line_errors(command)()
    assert ended.value.exit_code == code
    assert capsys.readouterr().err.startswith(f"{word}; no file was left half-written")


def test_sigterm_closes_the_tui_as_ctrl_q_does(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        from tui_fakes import FakeService
        from localpers.tui.app import LocalpersApp
        from localpers.users.store import UserStore

        service = FakeService(UserStore())
        app = LocalpersApp(service)

        async def run():
            async with app.run_test() as pilot:
                await pilot.pause()
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):
                    await pilot.pause(0.05)
                    if app.stopped_by_signal is not None:
                        break

        asyncio.run(run())
        app.close_service()
        print(app.stopped_by_signal, service.closed)
        """
    )
    env = {**os.environ, "LOCALPERS_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env, timeout=300
    )
    assert (result.returncode, result.stdout) == (0, f"{int(signal.SIGTERM)} True\n"), result.stderr[-2000:]


def test_run_app_raises_the_signal_that_closed_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.tui import app as tui_app
    from localpers.users.store import UserStore

    sys.path.insert(0, str(TESTS))
    from tui_fakes import FakeService

    def closed_by_sigterm(self: tui_app.LocalpersApp) -> None:
        self.stopped_by_signal = signal.SIGTERM

    monkeypatch.setattr(tui_app.LocalpersApp, "run", closed_by_sigterm)
    reinstalled = []
    monkeypatch.setattr(
        interrupts, "install_stop_handlers", lambda: reinstalled.append(True)
    )  # not in pytest
    service = FakeService(UserStore())
    with pytest.raises(interrupts.Terminated) as stopped:
        tui_app.run_app(service)
    assert stopped.value.signum == signal.SIGTERM and service.closed
    assert reinstalled  # a stop while the engine closes is handled again once the app's loop is gone


def test_a_sigterm_while_click_parses_the_arguments_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import typer.core

    from localpers.cli import entry

    def parsing(*args: object, **kwargs: object) -> None:
        raise interrupts.Terminated(signal.SIGTERM)  # Typer turns this into a silent exit 130

    monkeypatch.setattr(typer.core.TyperGroup, "parse_args", parsing)
    monkeypatch.setattr("localpers.interrupts.install", lambda: None)  # leave pytest's own handlers
    monkeypatch.setattr(sys, "argv", ["localpers", "user", "list"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert (stopped.value.code, capsys.readouterr().err) == (143, "terminated\n")


def test_a_ctrl_c_after_the_history_was_saved_says_it_was_saved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app, history
    from localpers.users.store import UserStore

    UserStore().create("ann")

    def ctrl_c_while_printing(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt  # lands after the save, while the summary is printed

    monkeypatch.setattr(history, "refit_hint", ctrl_c_while_printing)
    source = tmp_path / "items.jsonl"
    source.write_text('{"input": "Council approves budget", "output": "Budget approved"}\n')
    for args in (
        ["history", "import", str(source), "--user", "ann"],
        ["history", "add", "-u", "ann", "-i", "Rain expected", "-o", "Rain ahead"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 130, result.output
        assert "interrupted; this came after the work was saved: user 'ann' now has" in result.output
    assert len(UserStore().get("ann").history()) == 2


def test_a_stop_mid_streamed_line_reports_on_a_line_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    from localpers.cli.common import stdout_stream

    def streaming_command() -> None:
        sink = stdout_stream(strip_leading=True)
        sink(" Amtrak To Extend")
        sink(" Weekend Trains")
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        one_line_errors(streaming_command)()
    captured = capsys.readouterr()
    assert captured.out == "Amtrak To Extend Weekend Trains\n"
    assert captured.err.startswith("interrupted; ")

    def quiet_command() -> None:  # nothing streamed in this command: no stray newline
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        one_line_errors(quiet_command)()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_the_bundle_server_stops_on_ctrl_c_normally_and_on_a_signal_with_its_code(
    tmp_path: Path, signum: int, code: int
) -> None:
    from localpers.bundle.locations import embedded_bundle_dir

    serving = _cli(
        tmp_path / "home",
        "serve",
        str(embedded_bundle_dir()),
        "--port",
        "0",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert serving.stderr is not None
    started = serving.stderr.readline()  # "serving ..." once it listens
    assert started.startswith("serving"), started
    serving.send_signal(signum)
    _, err = serving.communicate(timeout=60)
    assert serving.returncode == code and err.strip().endswith("stopped"), err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_the_api_server_stopped_by_a_signal_exits_with_its_code_without_a_crash_log(
    tmp_path: Path, signum: int, code: int
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serving = _cli(
        tmp_path / "home", "api", "--port", str(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert serving.stderr is not None
    deadline = time.monotonic() + 240
    line = ""
    while time.monotonic() < deadline and "localpers api on" not in line:
        line = serving.stderr.readline()
    # the line comes before uvicorn takes the signals: a fixed second left a busy machine ~3x its usual 0.3 s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the API never listened"
            time.sleep(0.05)
    time.sleep(0.2)  # uvicorn's handlers are set before it listens; a little more for its loop to run
    serving.send_signal(signum)
    _, err = serving.communicate(timeout=120)
    assert serving.returncode == code, err
    assert "terminated; the API stopped" in err and "Traceback" not in err, err


def test_a_stop_after_the_command_finished_does_not_turn_it_into_a_failure() -> None:
    """A Ctrl-C or SIGTERM landing after a command's work was done (its output written, its history saved) ended
    it 130 with no word while the process exited, so a script read the import as failed (device audit). A command
    called as a step of another leaves the stop handlers in place until the outer one is done."""
    script = textwrap.dedent(
        """
        import os, signal
        from localpers import interrupts
        from localpers.cli.common import one_line_errors

        interrupts.install()
        interrupts.settle_when_done()

        @one_line_errors
        def step():
            return 1

        @one_line_errors
        def command():
            step()
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN, "a step settled the command"
            print("imported", flush=True)

        command()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        print("exits 0", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported", "exits", "0"] and done.stderr == ""


def test_a_finished_command_leaves_handlers_it_did_not_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (a test running the console script with `install` left out), pytest's handlers stay."""
    monkeypatch.setattr(interrupts, "_settle_when_done", True)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert one_line_errors(lambda: 1)() == 1
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_stop_still_ends_the_wait_for_a_worker_left_running() -> None:
    """A command that returns while a thread exit waits for still runs (a TUI worker stuck in llama.cpp) kept the
    process alive past SIGTERM once stops were ignored (the session's diff review): they are not, then."""
    script = textwrap.dedent(
        """
        import os, signal, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from localpers import interrupts
        from localpers.cli.common import one_line_errors

        interrupts.install()
        interrupts.settle_when_done()
        pool = ThreadPoolExecutor(1)

        @one_line_errors
        def command():
            pool.submit(time.sleep, 60)  # a worker exit joins, still running

        command()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 30, done.stderr  # the worker alone would hold it for 60 s


def test_a_draft_the_signal_stopped_opens_again_at_the_next_start(tmp_path: Path) -> None:
    """SIGTERM and SIGHUP (a closed terminal) closed the TUI without asking, and the draft was gone (eighty-eighth
    session's TUI audit): it is kept in the data folder and the next start without --text opens with it."""
    code = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        from tui_fakes import FakeService
        from localpers.tui.app import LocalpersApp
        from localpers.tui.kept_draft import kept_draft_path
        from localpers.users.store import UserStore

        async def stopped(app):
            async with app.run_test() as pilot:
                await pilot.pause()
                os.kill(os.getpid(), signal.SIGHUP)
                for _ in range(600):  # up to 30 s on a loaded machine
                    await pilot.pause(0.05)
                    if app.stopped_by_signal is not None:
                        break

        async def opened(app):
            async with app.run_test() as pilot:
                await pilot.pause()
                await pilot.pause()
                return app.main.draft.text

        first = LocalpersApp(FakeService(UserStore()), text="Half a page of my own words")
        asyncio.run(stopped(first))
        first.close_service()
        print(first.draft_kept, repr(kept_draft_path().read_text()))
        given = LocalpersApp(FakeService(UserStore()), text="a text of its own")
        print(repr(asyncio.run(opened(given))), kept_draft_path().exists())
        given.close_service()
        later = LocalpersApp(FakeService(UserStore()))
        print(repr(asyncio.run(opened(later))), kept_draft_path().exists())
        later.close_service()
        """
    )
    env = {**os.environ, "LOCALPERS_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "True 'Half a page of my own words'",
        "'a text of its own' True",
        "'Half a page of my own words' False",
    ], result.stderr[-2000:]


def test_a_stopped_json_command_answers_in_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal printed `{"ok": false, ...}` for a --json command but a stop printed nothing on stdout, so a
    script reading it got a decoding error instead of the reason."""
    from localpers.cli.common import stopped_exit

    def command(as_json: bool = False) -> None:
        raise KeyboardInterrupt

    def command_saying_what_it_kept(as_json: bool = False) -> None:
        try:
            raise interrupts.Terminated(signal.SIGTERM)
        except KeyboardInterrupt as stop:
            raise stopped_exit(stop, "the fit's caches are kept") from None

    def command_running_a_step(as_json: bool = False) -> None:
        one_line_errors(command)()  # a step, not given --json: it answers in its caller's format

    for run, json_line in (
        (lambda: one_line_errors(command)(as_json=True), "interrupted; no file was left half-written"),
        (
            lambda: one_line_errors(command_saying_what_it_kept)(as_json=True),
            "terminated; the fit's caches are kept",
        ),
        (
            lambda: one_line_errors(command_running_a_step)(as_json=True),
            "interrupted; no file was left half-written",
        ),
    ):
        with pytest.raises(typer.Exit):
            run()
        captured = capsys.readouterr()
        verdict = json.loads(captured.out)
        assert verdict["ok"] is False and verdict["error"].startswith(json_line)
        assert captured.err.strip() == verdict["error"]
    for run in (lambda: one_line_errors(command)(), lambda: one_line_errors(command)(as_json=False)):
        with pytest.raises(typer.Exit):
            run()
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("interrupted; ")


def test_a_stop_after_the_json_answer_adds_no_second_document(capsys: pytest.CaptureFixture[str]) -> None:
    from localpers.cli.common import print_json

    def answering_command(as_json: bool = False) -> None:
        print_json({"ok": True}, indent=None)
        raise KeyboardInterrupt  # lands after the answer was printed

    def command_stopped_before_answering(as_json: bool = False) -> None:
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        one_line_errors(answering_command)(as_json=True)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ok": True} and captured.err.startswith("interrupted; ")
    with pytest.raises(typer.Exit):  # the next command, not answered yet, answers the stop
        one_line_errors(command_stopped_before_answering)(as_json=True)
    assert json.loads(capsys.readouterr().out)["ok"] is False
