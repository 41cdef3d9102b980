"""How `localpers serve` reads one request and answers it: `BundleRequestHandler`, GET or HEAD of a listed file,
optionally with one byte range (`parse_range`), and nothing else.

What it does: parse the request line strictly (`METHOD SP /target SP HTTP/1.x`: anything else is 400, a line
over `MAX_REQUEST_LINE` bytes 414, HTTP/2 and later 505) and the headers (too many or too long: 431), cut off a
client that has not sent both within its server's `request_deadline_s`, answer every method other than GET and
HEAD with 405 and every path not in the server's `files` with 404 (request paths are looked up there, never
joined onto a directory), never read a request body, refuse a file changed on disk since it was verified or
listed, and log method, path and status only, escaped: never request bodies, headers or client addresses.

What it does not do: bind a port, cap the number of connections, verify a bundle or choose the files to serve
(`localpers.bundle.serve`, with `localpers.bundle.served_files` for a repository's files). It writes no file and
loads nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import re
import socket
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO, Protocol

from localpers import __version__
from localpers.bundle.format import CHUNK_SIZE
from localpers.bundle.served_files import RepositoryFiles, ServedFile, file_stamp
from localpers.untrusted import one_line

logger = logging.getLogger("localpers.bundle.serve")

_RANGE_PATTERN = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")
MAX_REQUEST_LINE = 8192  # bytes, with the line end
# RFC 9110 token characters for the method; the target is visible ASCII without spaces.
_METHOD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The inclusive (start, end) of a single `bytes=` range within `size` bytes, or None if unusable."""
    match = _RANGE_PATTERN.fullmatch(header.strip())
    if not match or (not match[1] and not match[2]) or size == 0:
        return None
    if not match[1]:  # suffix range: the last N bytes
        count = int(match[2])
        return (max(0, size - count), size - 1) if count > 0 else None
    start = int(match[1])
    end = int(match[2]) if match[2] else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


def _printable(text: str, limit: int = 300) -> str:
    """A request method or path made safe for one log line (control characters escaped, length capped). Unlike
    text a user wrote, a path from the network keeps no invisible character (`one_line` keeps a soft hyphen or a
    joiner): every one is escaped, so the log shows exactly what was asked."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in one_line(text, limit))


class HandlerServer(Protocol):
    """What `BundleRequestHandler` reads of the server that runs it: `localpers.bundle.serve.BundleServer`, which
    imports this module."""

    request_deadline_s: float
    files: dict[str, ServedFile] | RepositoryFiles


class BundleRequestHandler(BaseHTTPRequestHandler):
    """GET/HEAD of whitelisted bundle files; everything else refused."""

    server: HandlerServer
    server_version = f"localpers-serve/{__version__}"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # error answers always carry a status line
    timeout = 30  # seconds one read or write may stall
    # Set before a request line is parsed, so logging a refused request never meets a missing attribute.
    command = ""
    path = ""

    # -- reading one request: strict request line, capped headers, a deadline for both ---------------

    def handle_one_request(self) -> None:
        self.command, self.path, self.request_version = "", "", self.default_request_version
        deadline = threading.Timer(self.server.request_deadline_s, self._cut_off_slow_client)
        deadline.daemon = True
        deadline.start()
        try:
            if not self._read_request_head():
                return
        except (TimeoutError, ConnectionError, OSError):
            self.close_connection = True
            return
        finally:
            deadline.cancel()
        try:
            getattr(self, "do_" + self.command)()
            self.wfile.flush()
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def _cut_off_slow_client(self) -> None:
        """The request head did not arrive in time: unblock the reading thread by shutting the socket."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _refuse(self, status: HTTPStatus) -> bool:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._send_text(status, close=True)
        return False

    def _read_request_head(self) -> bool:
        """Parse the request line and headers; on anything malformed answer 400/414/431/505 and say False."""
        self.close_connection = True
        raw = self.rfile.readline(MAX_REQUEST_LINE + 1)
        if not raw:
            return False
        if len(raw) > MAX_REQUEST_LINE:
            self.path = one_line(raw[:80].decode("latin-1")) + "..."
            return self._refuse(HTTPStatus.REQUEST_URI_TOO_LONG)
        if not raw.endswith(b"\n"):  # the client closed, or was cut off, mid-line
            return False
        self.raw_requestline = raw
        self.requestline = raw.rstrip(b"\r\n").decode("latin-1")
        parts = raw.rstrip(b"\r\n").split(b" ")
        if len(parts) != 3:
            self.path = self.requestline
            return self._refuse(HTTPStatus.BAD_REQUEST)
        method, target, version = parts
        self.path = target.decode("latin-1")
        version_match = _VERSION.fullmatch(version)
        if (
            version_match is not None and int(version_match[1]) >= 2
        ):  # e.g. the HTTP/2 preface `PRI * HTTP/2.0`
            self.command = method.decode("latin-1")
            return self._refuse(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)
        if not (
            _METHOD.fullmatch(method)
            and _TARGET.fullmatch(target)
            and target.startswith((b"/", b"http://", b"https://"))
        ):
            self.command = method.decode("latin-1")
            return self._refuse(HTTPStatus.BAD_REQUEST)
        self.command = method.decode("ascii")
        if version_match is None:
            return self._refuse(HTTPStatus.BAD_REQUEST)
        if version_match[1] != b"1":
            return self._refuse(HTTPStatus.BAD_REQUEST)
        self.request_version = version.decode("ascii")
        try:
            self.headers = http.client.parse_headers(self.rfile, _class=self.MessageClass)
        except (http.client.LineTooLong, http.client.HTTPException):
            return self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        connection = self.headers.get("Connection", "").lower()
        self.close_connection = self.request_version == "HTTP/1.0" or "close" in connection
        return True

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def __getattr__(self, name: str) -> Any:
        # http.server dispatches method FOO to do_FOO and answers 501 when it is missing; every
        # method other than GET and HEAD is a refused write or probe here, so answer 405 instead.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self._send_text(HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"}, close=True)

    # -- responses ----------------------------------------------------------------------------------

    def _send_text(
        self, status: HTTPStatus, headers: dict[str, str] | None = None, *, close: bool = False
    ) -> None:
        body = f"{status.value} {status.phrase}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _carries_body(self) -> bool:
        length = self.headers.get("Content-Length")
        return self.headers.get("Transfer-Encoding") is not None or (length not in (None, "0"))

    @staticmethod
    def _open(served: ServedFile) -> tuple[BinaryIO | None, bool]:
        """The served file opened, and whether it is no longer the one listed (its size, or its stamp)."""
        assert served.path is not None
        try:
            handle = served.path.open("rb")
        except OSError:
            return None, True
        info = os.fstat(handle.fileno())
        if info.st_size != served.size or (served.stamp is not None and file_stamp(info) != served.stamp):
            return handle, True
        return handle, False

    def _serve(self, *, send_body: bool) -> None:
        # A body on GET/HEAD is never read; closing afterwards keeps it from being parsed as a request.
        close = self._carries_body()
        raw_path = self.path.split("?", 1)[0].split("#", 1)[0]
        try:
            decoded = urllib.parse.unquote(raw_path, errors="strict")
        except UnicodeDecodeError:
            decoded = ""
        served = self.server.files.get(decoded[1:]) if decoded.startswith("/") else None
        if served is None:
            self._send_text(HTTPStatus.NOT_FOUND, close=close)
            return

        handle = None
        if served.path is not None:
            handle, changed = self._open(served)
            # a repository file replaced since listed: list it again (a plain bundle's listing stays as verified)
            if changed and isinstance(self.server.files, RepositoryFiles):
                if handle:
                    handle.close()
                served = self.server.files.get(decoded[1:])
                if served is None:
                    self._send_text(HTTPStatus.NOT_FOUND, close=close)
                    return
                handle, changed = self._open(served)
            if changed:
                if handle:
                    handle.close()
                logger.warning(
                    "%s changed on disk since it was verified or listed; not serving it", served.path
                )
                self._send_text(HTTPStatus.INTERNAL_SERVER_ERROR, close=close)
                return
        start, end, status = 0, served.size - 1, HTTPStatus.OK
        range_header = self.headers.get("Range")
        if range_header is not None:
            wanted = parse_range(range_header, served.size)
            if wanted is None:
                if handle:
                    handle.close()
                self._send_text(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                    {"Content-Range": f"bytes */{served.size}"},
                    close=close,
                )
                return
            (start, end), status = wanted, HTTPStatus.PARTIAL_CONTENT
        length = end - start + 1
        try:
            self.send_response(status)
            self.send_header("Content-Type", served.content_type)
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{served.sha256}"')
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Content-Type-Options", "nosniff")
            if status == HTTPStatus.PARTIAL_CONTENT:
                self.send_header("Content-Range", f"bytes {start}-{end}/{served.size}")
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if not send_body:
                return
            if served.data is not None:
                self.wfile.write(served.data[start : end + 1])
                return
            assert handle is not None
            handle.seek(start)
            remaining = length
            while remaining > 0:
                block = handle.read(min(CHUNK_SIZE, remaining))
                if (
                    not block
                ):  # the file shrank mid-response: cut the connection, the client sees a short body
                    self.close_connection = True
                    return
                self.wfile.write(block)
                remaining -= len(block)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            if handle:
                handle.close()

    # -- logging: method, path and status only --------------------------------------------------------

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        logger.info("%s %s %s", _printable(self.command or "-", 40), _printable(self.path or "-"), status)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        pass  # the status line is already logged by log_request; error details could echo request data

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass
