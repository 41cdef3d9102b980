"""Regression tests for the hostile-input findings of issue 15 (F1-F7, F9-F12 and the message bugs).

Each test names its finding and failed on the code before the fix: a traceback, a hang, a missing
cap, a replaced device node, an unescaped byte or a misleading message.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_serve_pull import BACKBONE_SHA, make_bundle
from typer.testing import CliRunner

from localpers.bundle.format import MANIFEST_NAME, open_bundle, verify_bundle, write_manifest
from localpers.bundle.locations import CURRENT_LINK, bundles_root
from localpers.bundle.pull import pull_bundle
from localpers.bundle.serve import BundleServer, start_background_server
from localpers.cli import app
from localpers.errors import InputError, LocalpersError
from localpers.users.history_import import parse_history
from localpers.users.store import UserStore

runner = CliRunner()
DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 5000


def one_line_error(result: object, fragment: str) -> str:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.splitlines()  # splits at U+2028 too: one line means nothing broke it
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert fragment in lines[0], stderr
    return lines[0]


# -- F1: deep nesting and huge integers end in one-line errors, never RecursionError/ValueError ----------


@pytest.mark.parametrize("payload", [DEEP, '{"x": ' + HUGE_INT + "}"], ids=["deep", "huge-int"])
def test_f1_history_file_with_hostile_json_is_a_one_line_error(tmp_path: Path, payload: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('{"input": "a", "output": "b"}\n' + payload + "\n")
    UserStore().create("ann")
    result = runner.invoke(app, ["history", "import", str(path)])
    assert result.exit_code == 2
    one_line_error(result, "history.jsonl line 2: not valid JSON")


@pytest.mark.parametrize("payload", [DEEP, HUGE_INT], ids=["deep", "huge-int"])
def test_f1_bundle_manifest_with_hostile_json_is_refused(tmp_path: Path, payload: str) -> None:
    bundle = make_bundle(tmp_path / "b")
    text = (bundle / MANIFEST_NAME).read_text()
    (bundle / MANIFEST_NAME).write_text(text.replace('"format_version": 1', f'"format_version": {payload}'))
    with pytest.raises(InputError, match="manifest.json: not valid JSON"):
        verify_bundle(bundle)


def archive_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize("payload", [DEEP, HUGE_INT], ids=["deep", "huge-int"])
def test_f1_user_archive_with_hostile_json_is_refused(tmp_path: Path, payload: str) -> None:
    archive = tmp_path / "user.zip"
    archive.write_bytes(archive_bytes({"manifest.json": payload.encode()}))
    with pytest.raises(InputError, match="manifest.json is not valid JSON"):
        UserStore().import_(archive)


def test_f1_state_json_with_a_huge_integer_is_a_one_line_error() -> None:
    ann = UserStore().create("ann")
    ann.state_path.write_text('{"cluster": ' + HUGE_INT + "}")
    result = runner.invoke(app, ["user", "show", "ann"])
    assert result.exit_code == 2
    one_line_error(result, "state.json is damaged")


def test_a_state_or_active_file_saved_with_a_byte_order_mark_is_read() -> None:
    """Notepad saves UTF-8 with a BOM: a state.json or active.json edited there was refused as damaged, though
    history.jsonl was read (hand-edit audit)."""
    store = UserStore()
    ann = store.create("ann")
    ann.state_path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"cluster": 1}).encode())
    store.active_path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"user": "ann"}).encode())
    assert ann.state() == {"cluster": 1} and store.active_name() == "ann"
    result = runner.invoke(app, ["user", "show"])
    assert result.exit_code == 0 and "cluster     1" in result.stdout


def test_a_key_named_twice_in_state_active_or_an_archive_manifest_is_refused(tmp_path: Path) -> None:
    """History files refused a key named twice, but state.json, active.json and an archive's manifest took the last
    one silently (audit88): which was meant is unknown, so each is refused as damaged (exit 2)."""
    store = UserStore()
    ann = store.create("ann")
    ann.state_path.write_text('{"cluster": 0, "cluster": 2}')
    result = runner.invoke(app, ["user", "show", "ann"])
    assert result.exit_code == 2, result.output
    one_line_error(result, f"{ann.state_path} is damaged (not valid JSON: duplicate key 'cluster')")
    ann.state_path.write_text('{"cluster": 0}')

    store.active_path.write_text('{"user": "bob", "user": "ann"}')
    result = runner.invoke(app, ["user", "show"])
    assert result.exit_code == 2, result.output
    one_line_error(result, f"{store.active_path} is damaged (not valid JSON: duplicate key 'user')")
    store.use("ann")

    state = b'{"cluster": 0}'
    files = json.dumps({"state.json": hashlib.sha256(state).hexdigest()})
    head = '{"format": "localpers-user", "format_version": 1, "name": "bob", "name": "eve", "files": '
    manifest = head + files + "}"
    archive = tmp_path / "twice.zip"
    archive.write_bytes(archive_bytes({"manifest.json": manifest.encode(), "state.json": state}))
    result = runner.invoke(app, ["user", "import", str(archive)])
    assert result.exit_code == 2, result.output
    one_line_error(result, "manifest.json is not valid JSON (duplicate key 'name')")
    assert store.list() == ["ann"]


@pytest.mark.parametrize("pointer", ["[]", '{"user": 7}', '{"user": "../ann"}'])
def test_an_active_pointer_damaged_either_way_exits_2(pointer: str) -> None:
    """A bad 'user' value exited 1 while `[]` exited 2: both are malformed content of the same file (audit88)."""
    store = UserStore()
    store.create("ann")
    store.active_path.write_text(pointer)
    result = runner.invoke(app, ["user", "show"])
    assert result.exit_code == 2, result.output
    one_line_error(result, f"{store.active_path} is damaged")


# -- serve: F1 (AttributeError in logging), F2 (400/414/505), F9 (slowloris, cap), F10 (log) -----------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[BundleServer, str]]:
    server, url = start_background_server(make_bundle(tmp_path / "served"), max_connections=3)
    try:
        yield server, url
    finally:
        server.close()


def exchange(url: str, data: bytes, timeout: float = 10) -> bytes:
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GARBAGE\r\n", b"400"),
        (b"GET /manifest.json\r\n", b"400"),  # HTTP/0.9: no version
        (b"GET  /manifest.json HTTP/1.1\r\n", b"400"),
        (b"GET /manifest.json HTTP/1.1 extra\r\n", b"400"),
        (b"GET manifest.json HTTP/1.1\r\n", b"400"),
        (b"GET /manifest.json HTTP/x.y\r\n", b"400"),
        (b"GET /manifest.json HTTP/2.0\r\n", b"505"),
        (b"GET /manifest.json HTTP/3.0\r\n", b"505"),
        (b"PRI * HTTP/2.0\r\n", b"505"),  # the HTTP/2 connection preface
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", b"414"),
        (b"G\x1bT /manifest.json HTTP/1.1\r\n", b"400"),
    ],
)
def test_f1_f2_malformed_request_lines_get_an_error_status_and_no_handler_failure(
    served: tuple[BundleServer, str], caplog: pytest.LogCaptureFixture, request_line: bytes, status: bytes
) -> None:
    _, url = served
    with caplog.at_level(logging.INFO, logger="localpers.bundle.serve"):
        response = exchange(url, request_line + b"Host: x\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 " + status), response[:80]
    assert not any("request failed" in record.getMessage() for record in caplog.records)


def test_f2_too_many_headers_get_431(served: tuple[BundleServer, str]) -> None:
    _, url = served
    headers = b"".join(b"X-%d: y\r\n" % i for i in range(200))
    response = exchange(url, b"GET /manifest.json HTTP/1.1\r\n" + headers + b"\r\n")
    assert response.startswith(b"HTTP/1.1 431")


def test_f9_a_slowloris_client_is_cut_off(served: tuple[BundleServer, str]) -> None:
    server, url = served
    server.request_deadline_s = 0.5
    parsed = urllib.parse.urlsplit(url)
    started = time.monotonic()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as connection:
        connection.sendall(b"GET /manifest.json HTTP/1.1\r\n")
        closed = False
        while time.monotonic() - started < 8:
            try:
                connection.sendall(b"X-Slow: 1\r\n")
                if connection.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.monotonic() - started < 5


def test_f9_connections_beyond_the_cap_get_503(served: tuple[BundleServer, str]) -> None:
    _, url = served
    parsed = urllib.parse.urlsplit(url)
    idle = [socket.create_connection((parsed.hostname, parsed.port), timeout=5) for _ in range(3)]
    try:
        time.sleep(0.3)  # let the server's threads take the three slots
        response = exchange(url, b"GET /manifest.json HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        assert response.startswith(b"HTTP/1.1 503")
    finally:
        for connection in idle:
            connection.close()
    time.sleep(0.3)
    assert exchange(url, b"GET /manifest.json HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200"
    )


def test_f10_log_escapes_control_bytes_and_never_has_the_client_address(
    served: tuple[BundleServer, str],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, url = served
    with caplog.at_level(logging.INFO, logger="localpers.bundle.serve"):
        exchange(url, b"G\x1b[31mT\x00 /x HTTP/1.1\r\n\r\n")

        def explode(self: object) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(server.RequestHandlerClass, "do_GET", explode)
        exchange(url, b"GET /manifest.json HTTP/1.1\r\nConnection: close\r\n\r\n")
    lines = [record.getMessage() for record in caplog.records if record.name == "localpers.bundle.serve"]
    assert "G\\x1b[31mT\\x00 /x 400" in lines
    assert "a request failed: RuntimeError" in lines
    everything = "\n".join(lines) + capfd.readouterr().err
    assert "\x1b" not in everything and "\x00" not in everything and "127.0.0.1" not in everything


# -- F3: export never replaces a device node or FIFO --------------------------------------------------


def fitted_user() -> None:
    UserStore().create("ann").save_fit(np.zeros(8, np.float32), {"cluster": 0})


def test_f3_export_force_refuses_a_fifo(tmp_path: Path) -> None:
    fitted_user()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["user", "export", "ann", "-o", str(fifo), "--force"])
    # a bad --output, as a missing folder is (exit 1 before the ninetieth session)
    assert result.exit_code == 2
    one_line_error(result, "is not a regular file")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_export_refuses_a_state_json_that_is_no_file(tmp_path: Path, kind: str) -> None:
    """Reading the state and vector as one pair read state.json's bytes before any check: a FIFO there hung
    `user export`, a folder gave 'Is a directory' with no advice (found by a review)."""
    import threading

    fitted_user()
    state = UserStore().get("ann").state_path
    state.unlink()
    os.mkfifo(state) if kind == "fifo" else state.mkdir()
    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            runner.invoke(app, ["user", "export", "ann", "-o", str(tmp_path / "a.zip")])
        ),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=30)
    assert outcome, "user export hung on state.json"
    result = outcome[0]
    assert result.exit_code == 1  # type: ignore[attr-defined]
    one_line_error(result, "move it away")  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mknod needs root")
def test_f3_export_force_refuses_our_own_null_device(tmp_path: Path) -> None:
    fitted_user()
    null = tmp_path / "null"  # our own node, never the real /dev/null
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:  # root without CAP_MKNOD (a rootless container)
        pytest.skip("cannot make a device node here")
    result = runner.invoke(app, ["user", "export", "ann", "-o", str(null), "--force"])
    assert result.exit_code == 2  # a bad --output (exit 1 before the ninetieth session)
    one_line_error(result, "is not a regular file")
    assert stat.S_ISCHR(null.lstat().st_mode)


# -- F4: zip bombs in user import ---------------------------------------------------------------------


def test_f4_archive_with_many_members_is_refused_before_unpacking(tmp_path: Path) -> None:
    members = {f"vector-{i:016x}.safetensors": b"\0" * 1000 for i in range(500)}
    archive = tmp_path / "many.zip"
    archive.write_bytes(archive_bytes({"manifest.json": b"{}", **members}))
    with pytest.raises(InputError, match="501 members"):
        UserStore().import_(archive)


def test_f4_archive_unpacking_to_more_than_the_total_cap_is_refused(tmp_path: Path) -> None:
    zeros = b"\0" * (40 << 20)  # two members under the per-member cap, 80 MiB together
    archive = tmp_path / "bomb.zip"
    archive.write_bytes(archive_bytes({"state.json": zeros, "history.jsonl": zeros, "manifest.json": b"{}"}))
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(InputError, match="unpack to"):
        UserStore().import_(archive)
    assert UserStore().list() == []


def test_f4_repeated_member_names_are_refused(tmp_path: Path) -> None:
    archive = tmp_path / "twice.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        zipped.writestr("state.json", b"{}")
        with pytest.warns(UserWarning):
            zipped.writestr("state.json", b"{}")
        zipped.writestr("manifest.json", b"{}")
    archive.write_bytes(buffer.getvalue())
    with pytest.raises(InputError, match="appears twice"):
        UserStore().import_(archive)


# -- F5 / F6: pull caps what a manifest may declare, and follows no redirect off http(s) -------------


def test_f5_a_manifest_declaring_a_gigantic_file_is_refused_before_downloading(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["files"]["adapters/global.gguf"]["size"] = 10**30
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="more than the"):
        pull_bundle(str(bundle), backbone_sha256=BACKBONE_SHA, unsigned=True)
    assert not (bundles_root() / "versions").exists()


class _Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", "ftp://127.0.0.1/manifest.json")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_f6_a_redirect_to_ftp_is_refused() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(LocalpersError, match="not http"):
            pull_bundle(f"http://127.0.0.1:{server.server_address[1]}/", backbone_sha256=BACKBONE_SHA)
    finally:
        server.shutdown()
        server.server_close()


# -- F7: temp files of killed writers are removed -----------------------------------------------------


def test_f7_partial_files_of_a_killed_history_import_are_cleaned_up(tmp_path: Path) -> None:
    ann = UserStore().create("ann")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = ann.dir / f".history.jsonl.{dead.pid}.k1ll3d.partial"
    leftover.write_bytes(b"x" * 1000)
    history = tmp_path / "h.jsonl"
    history.write_text('{"input": "a", "output": "b"}\n')
    assert runner.invoke(app, ["history", "import", str(history)]).exit_code == 0
    assert not leftover.exists()
    assert [p.name for p in ann.dir.glob("*.partial")] == []


def test_f7_a_running_writers_temp_file_is_left_alone() -> None:
    ann = UserStore().create("ann")
    mine = ann.dir / f".history.jsonl.{os.getpid()}.inuse.partial"
    mine.write_bytes(b"x")
    ann.save_history([])
    assert mine.exists()


def test_f7_an_export_leaves_other_files_temp_like_names_in_the_users_folder_alone(tmp_path: Path) -> None:
    # the sweep took every `.X.<digits>.Y.partial` whose number was no running process: a user's own files too
    UserStore().create("ann")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    theirs = [downloads / f".backup.{dead.pid}.tar.partial", downloads / ".photos.2024.zip.partial"]
    for path in theirs:
        path.write_bytes(b"the user's own")
    left_by_a_killed_export = downloads / f".ann.zip.{dead.pid}.k1ll3d.partial"
    left_by_a_killed_export.write_bytes(b"half")
    assert runner.invoke(app, ["user", "export", "ann", "-o", str(downloads / "ann.zip")]).exit_code == 0
    assert all(path.read_bytes() == b"the user's own" for path in theirs)
    assert not left_by_a_killed_export.exists()


# -- F11 / F12: terminal escapes in history text, FIFOs ------------------------------------------------


def test_f11_escape_sequences_are_not_stored_or_printed(tmp_path: Path) -> None:
    UserStore().create("ann")
    history = tmp_path / "h.jsonl"
    evil = "Big \x1b]0;pwned\x07news\x1b[2J \x9b31m\u2028now"
    history.write_text(json.dumps({"input": "article", "output": evil}) + "\n")
    assert runner.invoke(app, ["history", "import", str(history)]).exit_code == 0
    stored = (UserStore().get("ann").history_path).read_text()
    listed = runner.invoke(app, ["history", "list"]).stdout
    for text in (stored, listed):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u2028" not in text
    assert "Big ]0;pwnednews[2J 31mnow" in listed


def test_f12_history_import_of_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            parse_history(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the old behaviour's read so the thread ends
        with open(fifo, "wb"):
            pass
        worker.join(5)
        pytest.fail("reading a FIFO blocked")
    assert isinstance(outcome[0], InputError) and "not a regular file" in str(outcome[0])


# -- messages ------------------------------------------------------------------------------------------


def test_a_line_separator_in_an_input_keeps_the_error_on_one_line(tmp_path: Path) -> None:
    UserStore().create("ann")
    result = runner.invoke(app, ["history", "import", str(tmp_path / "evil\u2028name\x1b[2J.jsonl")])
    line = one_line_error(result, "no such file")
    assert "\\u2028" in line and "\\x1b" in line


def test_an_archive_without_a_name_says_so_not_none(tmp_path: Path) -> None:
    state = b'{"cluster": 0}'
    manifest = {
        "format": "localpers-user",
        "format_version": 1,
        "files": {"state.json": hashlib.sha256(state).hexdigest()},
    }
    archive = tmp_path / "noname.zip"
    archive.write_bytes(archive_bytes({"manifest.json": json.dumps(manifest).encode(), "state.json": state}))
    result = runner.invoke(app, ["user", "import", str(archive)])
    assert result.exit_code == 2
    line = one_line_error(result, "field 'name' is missing; import it with --as NAME")
    assert "None" not in line
    assert runner.invoke(app, ["user", "import", str(archive), "--as", "bob"]).exit_code == 0


def test_a_string_vector_dim_is_reported_as_a_string() -> None:
    fitted_user()
    ann = UserStore().get("ann")
    state = json.loads(ann.state_path.read_text())
    state["vector_dim"] = "8"
    ann.state_path.write_text(json.dumps(state))
    with pytest.raises(InputError, match=r"field 'vector_dim' is '8' \(str\), not an integer"):
        ann.vector()


def test_a_dangling_current_link_is_an_error_not_the_demo_bundle(tmp_path: Path) -> None:
    pull_bundle(str(make_bundle(tmp_path / "b")), backbone_sha256=BACKBONE_SHA, unsigned=True)
    link = bundles_root() / CURRENT_LINK
    target = link.resolve()
    for path in sorted(target.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    target.rmdir()
    with pytest.raises(LocalpersError, match="which is missing; run `localpers pull URL` again"):
        open_bundle()


def test_write_manifest_still_skips_temp_files(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / ".head.safetensors.123.abc.partial").write_bytes(b"half")
    write_manifest(bundle, json.loads((bundle / MANIFEST_NAME).read_text()))
    assert (
        ".head.safetensors.123.abc.partial" not in json.loads((bundle / MANIFEST_NAME).read_text())["files"]
    )


# -- a full disk or a read-only folder: one line, the previous file intact -----------------------------


def _disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


def test_a_full_disk_leaves_the_history_as_it_was_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = UserStore().create("ann")
    history = tmp_path / "h.jsonl"
    history.write_text('{"input": "first article", "output": "First"}\n')
    assert runner.invoke(app, ["history", "import", str(history)]).exit_code == 0
    before = ann.history_path.read_bytes()
    history.write_text('{"input": "second article", "output": "Second"}\n')
    monkeypatch.setattr(os, "fsync", _disk_full)
    result = runner.invoke(app, ["history", "import", str(history)])
    assert result.exit_code == 1
    line = one_line_error(result, "No space left on device")
    assert f"cannot write {ann.history_path}" in line and "it was left as it was" in line
    assert ann.history_path.read_bytes() == before
    assert [p.name for p in ann.dir.glob("*.partial")] == []


def test_creating_a_user_on_a_full_disk_names_the_users_folder_not_a_staging_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "fsync", _disk_full)
    result = runner.invoke(app, ["user", "create", "bob"])
    line = one_line_error(result, "No space left on device")
    assert "/users/bob/state.json" in line and ".creating" not in line
    assert UserStore().list() == []


def test_an_os_error_outside_the_atomic_writer_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from localpers.cli.common import one_line_errors

    @one_line_errors
    def command() -> None:
        raise PermissionError(13, "Permission denied", "/srv/bench/report.md")

    with pytest.raises(typer.Exit) as exited:
        command()
    assert exited.value.exit_code == 1
    assert capsys.readouterr().err == "error: Permission denied (/srv/bench/report.md)\n"


def test_importing_a_user_on_a_full_disk_names_the_folder_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    UserStore().create("ann")
    archive = tmp_path / "ann.zip"
    assert runner.invoke(app, ["user", "export", "ann", "--output", str(archive)]).exit_code == 0
    from localpers.users import staging

    monkeypatch.setattr(staging, "write_synced", _disk_full)  # each staged file is written (and synced) there
    result = runner.invoke(app, ["user", "import", str(archive), "--as", "bob"])
    line = one_line_error(result, "No space left on device")
    assert f"cannot write user 'bob' into {UserStore().users_dir}" in line and "free some disk space" in line
    assert UserStore().list() == ["ann"]
