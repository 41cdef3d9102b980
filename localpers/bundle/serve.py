"""`localpers serve`: serve a signed bundle repository, or one verified bundle, read-only over HTTP.

For local use (any static web server can host a repository too). A repository directory (made with
`localpers repo`) is served as its TUF metadata and hash-named targets only (`served_files.RepositoryFiles`:
regular files, no symlinks or `.partial` files, never a keys folder or any other file put there), listed again
when the publisher re-signs while it runs; a plain bundle directory is verified at start and then only `manifest.json`
(the verified bytes, held in memory) and the files the manifest lists can be fetched. Either way GET or HEAD
only, optionally with one byte range. Every other path is 404 (no directory listings, no traversal: request
paths are looked up in those lists, never joined onto the directory), every other method is 405, and request
bodies are never read. Request lines are parsed strictly (`METHOD SP /target SP HTTP/1.x`): anything
else is 400, a line over `MAX_REQUEST_LINE` bytes 414, HTTP/2 and later 505, too many or too long
headers 431. A client must finish its request line and headers within `request_deadline_s` (slowloris
clients are cut off), and at most `max_connections` connections are served at once (others get 503).
The log holds method, path and status only, escaped: never request bodies, headers or client
addresses. This module does not pull, write or load anything.

It is one module of some 460 lines on purpose: the request handler and the server enforce one set of
limits together (request line, headers, deadline, connection cap, byte range), and a reader checking that no
request escapes them should find every one of them here; which files exist to be served is
`localpers.bundle.served_files`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import socket
import socketserver
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from localpers import __version__
from localpers.bundle.format import (
    CHUNK_SIZE,
    GIVEN_BUNDLE_ADVICE,
    MANIFEST_NAME,
    Bundle,
    advising,
    check_given_bundle_dir,
    verify_bundle,
)
from localpers.bundle.repository_metadata import is_repository
from localpers.bundle.served_files import RepositoryFiles, ServedFile, file_stamp
from localpers.errors import InputError, LocalpersError
from localpers.untrusted import one_line

logger = logging.getLogger("localpers.bundle.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
_RANGE_PATTERN = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")
MAX_REQUEST_LINE = 8192  # bytes, with the line end
DEFAULT_REQUEST_DEADLINE_S = 10.0  # to send a request line and its headers
DEFAULT_MAX_CONNECTIONS = 32
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


class BundleRequestHandler(BaseHTTPRequestHandler):
    """GET/HEAD of whitelisted bundle files; everything else refused."""

    server: BundleServer
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


class BundleServer(ThreadingHTTPServer):
    """A threading HTTP server over one verified bundle."""

    daemon_threads = True

    request_deadline_s = DEFAULT_REQUEST_DEADLINE_S

    def __init__(
        self,
        bundle: Bundle | None,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        files: dict[str, ServedFile] | RepositoryFiles | None = None,
    ) -> None:
        self.bundle = bundle
        self.max_connections = max_connections
        self._connection_slots = threading.BoundedSemaphore(max_connections)
        self.files = files if files is not None else self._bundle_files(bundle)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), BundleRequestHandler)

    @staticmethod
    def _bundle_files(bundle: Bundle | None) -> dict[str, ServedFile]:
        if bundle is None:
            raise ValueError("BundleServer needs a bundle or the files to serve")
        manifest_bytes = (bundle.directory / MANIFEST_NAME).read_bytes()
        files: dict[str, ServedFile] = {
            MANIFEST_NAME: ServedFile(
                size=len(manifest_bytes),
                sha256=hashlib.sha256(manifest_bytes).hexdigest(),
                content_type="application/json",
                data=manifest_bytes,
            )
        }
        for relative, entry in bundle.manifest["files"].items():
            path = bundle.directory / relative
            files[relative] = ServedFile(
                size=entry["size"],
                sha256=entry["sha256"],
                content_type="application/octet-stream",
                path=path,
                # as verified: a file rewritten since, whatever its size, is not served under the manifest's hash
                stamp=file_stamp(path.stat()),
            )
        return files

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a thread if a slot is free; otherwise answer 503 and close it."""
        if not self._connection_slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 5\r\n"
                    b"Connection: close\r\n\r\n"
                )
            self.shutdown_request(request)
            logger.info("- - 503 (more than %d connections)", self.max_connections)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line naming the failure, without the client's address or a traceback."""
        error = sys.exc_info()[1]
        logger.warning("a request failed: %s", type(error).__name__ if error else "unknown error")

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn), slow or hanging offline; skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}/"

    def close(self) -> None:
        """Stop a server started with `start_background_server` and release its port."""
        self.shutdown()
        self.server_close()


def make_server(
    bundle_dir: Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> BundleServer:
    """Bind a server (not yet serving) for a repository directory, or a bundle directory it verifies."""
    directory = Path(bundle_dir)
    if not directory.is_dir():
        problem = "not a directory" if directory.exists() else "no such directory"
        raise InputError(
            f"{directory}: {problem}; give a repository (`localpers repo init`) or a bundle directory"
        )
    if is_repository(directory):
        bundle, files = None, RepositoryFiles(directory)
    else:
        check_given_bundle_dir(directory)
        with advising(GIVEN_BUNDLE_ADVICE):
            bundle, files = verify_bundle(directory), None
    try:
        return BundleServer(bundle, host, port, max_connections=max_connections, files=files)
    except OSError as exc:
        raise LocalpersError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host"
        ) from None


def start_background_server(
    bundle_dir: Path,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> tuple[BundleServer, str]:
    """Serve `bundle_dir` from a daemon thread (port 0: an ephemeral port); returns (server, url).

    Call `server.close()` when done.
    """
    server = make_server(bundle_dir, host, port, max_connections=max_connections)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="localpers-serve", daemon=True
    )
    thread.start()
    return server, server.url
