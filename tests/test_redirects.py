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
