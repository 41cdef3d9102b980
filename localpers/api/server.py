"""Binding `localpers api`: which addresses are loopback, the refusal of other binds without a key, which requests
come from a web page or a name that is not loopback (`foreign_request`, for a keyless server), uvicorn.

`check_bind` refuses a non-loopback host unless the caller passed an explicit flag and an API key (both are
needed: the flag says it is meant, the key keeps strangers out). `serve` runs uvicorn with its access log off
(request lines carry no text, but nothing about requests is logged at all) until interrupted, with guards
uvicorn lacks: at most MAX_CONNECTIONS connections at once (one more is answered 503 and closed as it opens; the
accept queue is as short, so a burst cannot take every file descriptor before the guard sees it), and deadlines:
HEADER_SECONDS for a request's headers, then BODY_SECONDS for its body, and WRITE_SECONDS for a client to read
what the server sends it.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from localpers.errors import LocalpersError

if TYPE_CHECKING:
    from starlette.requests import Request

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) only accepts connections from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(value: str) -> str:
    """The host name or address in a `Host` header or an origin (`http://[::1]:8000` -> `::1`); the value as
    given when anything but a port follows the host (`127.0.0.1:80@evil.com`, `127.0.0.1, evil.com`), which no
    loopback check then passes."""
    value = value.partition("://")[2] if "://" in value else value
    value = value.split("/", 1)[0]
    if value.startswith("["):
        end = value.find("]")
        host, rest = (value[1:end], value[end + 1 :]) if end > 0 else (value, "")
    elif value.count(":") > 1:
        return value  # an IPv6 address without brackets, and no port
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return value
    return host


def foreign_request(request: Request) -> str | None:
    """Why a keyless server must refuse `request` as not coming from this machine's own clients, or None.

    Browsers send `Origin` on cross-origin requests (and `null` from sandboxed frames and local files); command-line
    clients and the OpenAI libraries send none. `Host` is what the client asked for: a name that is not loopback
    means the page reached 127.0.0.1 through a name an attacker controls."""
    host = request.headers.get("host")
    if host is not None and not is_loopback(host_of(host)):
        return f"Host {host!r} is not a loopback name or address"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or not is_loopback(host_of(origin)):
        return f"requests from web pages of origin {origin!r} are not served"
    # A page on another port of this machine (a dev server, a notebook) is another site to the browser: its
    # text/plain POST needs no preflight, so without this it had the server generate for it (API audit, s88).
    server = request.scope.get("server")
    if server is not None and server[1] is not None and origin_port(origin) != int(server[1]):
        return f"requests from web pages of origin {origin!r}, another port of this machine, are not served"
    return None


def origin_port(origin: str) -> int | None:
    """The port an origin names, or its scheme's default (`http://localhost` -> 80); None when it names none."""
    try:
        parts = urlsplit(origin)
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


def check_bind(host: str, *, allow_remote: bool, api_key: str | None) -> None:
    """Refuse (one-line error, exit code 2) a bind that other machines could reach, unless flagged and keyed."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise LocalpersError(
            f"refusing to listen on {host}: other machines could reach it; pass --allow-remote and --api-key KEY",
            exit_code=2,
        )
    if not api_key:
        raise LocalpersError(
            f"listening on {host} needs an API key: pass --api-key KEY (or LOCALPERS_API_KEY)", exit_code=2
        )


def check_port_free(host: str, port: int) -> None:
    """A one-line error when the port is taken, before the model is loaded."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            # a port another program holds is a state (exit 1, as `localpers serve` says it); a --host not on this
            # machine or a port below 1024 is the argument's (exit 2)
            raise LocalpersError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port or --host",
                exit_code=1 if exc.errno == errno.EADDRINUSE else 2,
            ) from None


MAX_CONNECTIONS = 32  # connections served at once; one more is answered 503 and closed as it opens
HEADER_SECONDS = 10.0  # a connection whose request headers have not fully arrived by then is closed
BODY_SECONDS = 60.0  # one whose body has not, this long after its headers (4 MiB at ~0.5 Mbit/s)
WRITE_SECONDS = 60.0  # one that has left this long unread what the server has to send it is dropped
ACCEPT_BACKLOG = MAX_CONNECTIONS  # connections the kernel queues, and asyncio accepts in one go
# An OpenAI-style error object, as every other refusal (written before any request is read, so by hand here)
_BUSY_BODY = (
    b'{"error": {"message": "localpers api is busy; try again shortly", "type": "server_error", "param": null,'
    b' "code": "server_busy"}}'
)
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


def _guarded_protocol() -> type:
    """uvicorn's HTTP/1.1 protocol with the guards it lacks: a connection beyond MAX_CONNECTIONS is answered 503
    and closed at once (uvicorn's own limit answers only complete requests, so half-sent ones held every file
    descriptor); one whose request headers are not complete within HEADER_SECONDS of its start (or of the end of
    its previous response), or whose body is not complete within BODY_SECONDS of its headers, is closed (a body
    sent a byte at a time held its place for as long as the client liked); and one that leaves its answers
    unread for WRITE_SECONDS is dropped (a client that never read held its place for ever). Each request on a
    kept-alive connection, pipelined ones included, has its own deadlines; time in which uvicorn has stopped
    reading because the app has not yet taken the body it holds does not count against the client."""
    import h11
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedFlowControl(FlowControl):  # type: ignore[misc]
        """uvicorn's flow control, counting how long reading has been paused (the server behind, not the
        client)."""

        paused_at: float | None = None
        paused_before: float = 0.0

        def pause_reading(self) -> None:
            if not self.read_paused:
                self.paused_at = time.monotonic()
            super().pause_reading()

        def resume_reading(self) -> None:
            if self.read_paused and self.paused_at is not None:
                self.paused_before += time.monotonic() - self.paused_at
                self.paused_at = None
            super().resume_reading()

        def paused_seconds(self) -> float:
            running = time.monotonic() - self.paused_at if self.paused_at is not None else 0.0
            return self.paused_before + running

    class GuardedH11Protocol(H11Protocol):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        # what the deadline waits for: the h11 state (IDLE: a request's headers, SEND_BODY: its body) and the
        # request it belongs to (uvicorn's `cycle`), so that each request on a kept-alive connection gets its own
        _waiting_for: tuple[object, object] | None = None
        _started = 0.0  # when the awaited phase began, and reading's paused seconds then
        _paused_then = 0.0
        _write_deadline: asyncio.TimerHandle | None = None
        _closing_watch: asyncio.TimerHandle | None = None
        _closing_seen = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > MAX_CONNECTIONS:
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            self.flow = TimedFlowControl(transport)  # before any request: each takes the protocol's
            self._follow_request()
            self._closing_watch = self.loop.call_later(WRITE_SECONDS, self._watch_closing)

        def handle_events(self) -> None:
            # uvicorn runs this for data that arrives and, after a response, for a request pipelined behind it
            super().handle_events()
            self._follow_request()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_deadline is None:
                self._write_deadline = self.loop.call_later(WRITE_SECONDS, self._drop_unread)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_watching()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._stop_watching()  # the connection is the websocket protocol's from here
            super().handle_websocket_upgrade(event)

        def _stop_watching(self) -> None:
            self._cancel_deadline()
            for timer in (self._write_deadline, self._closing_watch):
                if timer is not None:
                    timer.cancel()
            self._write_deadline = self._closing_watch = None

        def _phase(self) -> tuple[object, object]:
            return self.conn.their_state, self.cycle

        def _follow_request(self) -> None:
            phase = self._phase()
            if phase == self._waiting_for:
                return  # the same request, still within its deadline
            self._cancel_deadline()
            if phase[0] is h11.IDLE or phase[0] is h11.SEND_BODY:
                self._started, self._paused_then = self.loop.time(), self._paused_seconds()
                # a request's headers are awaited, or its headers are in and its body is on its way
                self._arm_deadline(phase, HEADER_SECONDS if phase[0] is h11.IDLE else BODY_SECONDS)

        def _paused_seconds(self) -> float:
            flow = self.flow
            return flow.paused_seconds() if isinstance(flow, TimedFlowControl) else 0.0

        def _arm_deadline(self, phase: tuple[object, object], seconds: float) -> None:
            self._waiting_for = phase
            self._deadline = self.loop.call_later(seconds, self._close_if_still_waiting)

        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._waiting_for = None, None

        def _close_if_still_waiting(self) -> None:
            phase, self._deadline, self._waiting_for = self._waiting_for, None, None
            if phase is None or phase != self._phase() or self.transport.is_closing():
                return
            if phase[0] is h11.SEND_BODY:
                # time in which uvicorn stopped reading until the app takes the body it holds is the server's
                client_seconds = (
                    self.loop.time() - self._started - (self._paused_seconds() - self._paused_then)
                )
                if client_seconds < BODY_SECONDS:
                    self._arm_deadline(phase, BODY_SECONDS - client_seconds)
                    return
            self.transport.close()

        def _drop_unread(self) -> None:
            self._write_deadline = None
            self.transport.abort()  # closing would wait to send what the client does not read

        def _watch_closing(self) -> None:
            """Abort a connection closed (by uvicorn's keep-alive timer, a deadline, a finished answer) that has
            stayed open a whole WRITE_SECONDS since, waiting to send what its client does not read."""
            self._closing_watch = None
            if self.transport.is_closing():
                if self._closing_seen:
                    self.transport.abort()
                    return
                self._closing_seen = True
            self._closing_watch = self.loop.call_later(WRITE_SECONDS, self._watch_closing)

    return GuardedH11Protocol


def serve(app: object, host: str, port: int, shutdown_seconds: float | None = None) -> None:
    """Run uvicorn until Ctrl+C; warnings and errors only, no access log, at most MAX_CONNECTIONS at once; once
    stopped, it waits at most `shutdown_seconds` (None: without end) for the requests still open."""
    import uvicorn

    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=host.strip("[]"),
        port=port,
        log_level="warning",
        access_log=False,
        http=_guarded_protocol(),
        limit_concurrency=MAX_CONNECTIONS + 1,  # the guard answers the next connection itself
        # asyncio accepts up to `backlog` waiting connections at once, before the guard sees any: uvicorn's 2048
        # let a burst take every file descriptor
        backlog=ACCEPT_BACKLOG,
        timeout_graceful_shutdown=None if shutdown_seconds is None else max(1, round(shutdown_seconds)),
    )
