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

The limits are kept in two places, and a reader checking that no request escapes them reads both: this module
holds the server (`BundleServer`: the connection cap, the request deadline's setting, the files it serves, the
port it binds) and makes one for a directory (`make_server`, `start_background_server`); each request's limits
(request line, headers, the deadline's cut-off, methods, paths, byte range) and its answer are
`localpers.bundle.serve_handler`'s (`BundleRequestHandler`, `parse_range`, `MAX_REQUEST_LINE`). Which files exist
to be served is `localpers.bundle.served_files`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import socketserver
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from localpers.bundle.format import (
    GIVEN_BUNDLE_ADVICE,
    MANIFEST_NAME,
    Bundle,
    advising,
    check_given_bundle_dir,
    verify_bundle,
)
from localpers.bundle.repository_metadata import is_repository
from localpers.bundle.serve_handler import MAX_REQUEST_LINE, BundleRequestHandler, parse_range
from localpers.bundle.served_files import RepositoryFiles, ServedFile, file_stamp
from localpers.errors import InputError, LocalpersError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PORT",
    "DEFAULT_REQUEST_DEADLINE_S",
    "MAX_REQUEST_LINE",
    "BundleRequestHandler",
    "BundleServer",
    "make_server",
    "parse_range",
    "start_background_server",
]

logger = logging.getLogger("localpers.bundle.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_REQUEST_DEADLINE_S = 10.0  # to send a request line and its headers
DEFAULT_MAX_CONNECTIONS = 32


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
