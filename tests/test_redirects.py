"""Where a bundle's server may redirect a pull: only to another http(s) URL, each refusal one line naming the
target (a redirect to file:// was reported as "HTTP 302" by urllib before localpers saw it)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from localpers.bundle.fetcher import Fetcher
from localpers.errors import LocalpersError


@pytest.fixture
def redirecting() -> Iterator[str]:
    """A loopback server whose /to/<target> answers 302 to <target>, and /ok 200."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/ok":
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to/"))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://example.org/bundle", "data:,hello"])
def test_a_redirect_off_http_is_refused_naming_its_target(redirecting: str, target: str) -> None:
    with pytest.raises(LocalpersError) as refused:
        b"".join(Fetcher(timeout=10).chunks(f"{redirecting}/to/{target}"))
    message = str(refused.value)
    assert f"the server redirects to {target}, which is not http(s); refusing it" in message
    assert "\n" not in message


def test_a_redirect_to_http_is_followed(redirecting: str) -> None:
    assert b"".join(Fetcher(timeout=10).chunks(f"{redirecting}/to/{redirecting}/ok")) == b"ok"


def test_a_redirect_is_followed_without_reading_its_body() -> None:
    """urllib read a 3xx body whole, with no cap, before following it: an endless one grew memory until the OOM
    killer came. The body is now left unread."""
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/ok":
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"x" * 65536
            try:
                while not stop.is_set():  # endless, at a pace the old code survives until the test stops it
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    stop.wait(0.01)
            except OSError:
                pass  # the client closed the connection: what a fetch that follows promptly does
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    got: list[bytes] = []
    fetch = threading.Thread(
        target=lambda: got.append(
            b"".join(Fetcher(timeout=10).chunks(f"http://127.0.0.1:{server.server_address[1]}/endless"))
        ),
        daemon=True,
    )
    try:
        fetch.start()
        fetch.join(10)
        assert not fetch.is_alive(), "the fetch is still reading the redirect's body"
        assert got == [b"ok"]
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def trickling_head() -> Iterator[str]:
    """A loopback server that answers every request with its status line one byte every 0.3 s (12 s at most)."""
    import socket
    import time

    listener = socket.create_server(("127.0.0.1", 0))

    def answer(connection: socket.socket) -> None:
        with connection:
            connection.recv(4096)
            for byte in b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"[:40]:
                try:
                    connection.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.3)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_a_server_that_trickles_its_answers_head_is_given_up_on(trickling_head: str, tmp_path) -> None:
    # each read waited up to the timeout and the body's pace check starts after the head, so a status line sent a
    # byte at a time held a pull, and the trust store's lock, for days (ninetieth session's trust audit)
    import time

    fetcher = Fetcher(timeout=1.0)
    started = time.monotonic()
    with pytest.raises(
        LocalpersError, match="the server is too slow to answer .* try again, or pull from another"
    ):
        list(fetcher.chunks(f"{trickling_head}/metadata/timestamp.json"))
    assert time.monotonic() - started < 6
    started = time.monotonic()
    with pytest.raises(LocalpersError, match="too slow to answer .*; pull again to resume"):
        fetcher.resume_into(f"{trickling_head}/targets/backbone.gguf", tmp_path / "b.partial", 2)
    assert time.monotonic() - started < 6


def test_a_head_that_ends_as_its_deadline_passes_is_too_slow_not_a_cut_body(
    redirecting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline firing between the head's arrival and its timer's cancel shut the socket under the body: the
    pull said the connection closed after 0 bytes (the session's review)."""
    import http.client
    import time

    parse_head = http.client.HTTPConnection.getresponse

    def late(self: http.client.HTTPConnection) -> http.client.HTTPResponse:
        response = parse_head(self)
        time.sleep(1.5)  # past the 2 x 0.5 s deadline, before the caller cancels it
        return response

    monkeypatch.setattr(http.client.HTTPConnection, "getresponse", late)
    with pytest.raises(LocalpersError, match="the server is too slow to answer"):
        list(Fetcher(timeout=0.5).chunks(f"{redirecting}/ok"))
