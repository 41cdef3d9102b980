"""Binding `localpers api`: which addresses are loopback, the refusal of other binds without a key, uvicorn.

`check_bind` refuses a non-loopback host unless the caller passed an explicit flag and an API key (both are
needed: the flag says it is meant, the key keeps strangers out). `serve` runs uvicorn with its access log off
(request lines carry no text, but nothing about requests is logged at all) until interrupted, with two guards
uvicorn lacks: at most MAX_CONNECTIONS connections at once (one more is answered 503 and closed as it opens; the
accept queue is as short, so a burst cannot take every file descriptor before the guard sees it), and deadlines:
HEADER_SECONDS for a request's headers, then BODY_SECONDS for its body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from localpers.errors import LocalpersError

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) only accepts connections from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
            raise LocalpersError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}", exit_code=2
            ) from None


MAX_CONNECTIONS = 32  # connections served at once; one more is answered 503 and closed as it opens
HEADER_SECONDS = 10.0  # a connection whose request headers have not fully arrived by then is closed
BODY_SECONDS = 60.0  # one whose body has not, this long after its headers (4 MiB at ~0.5 Mbit/s)
ACCEPT_BACKLOG = MAX_CONNECTIONS  # connections the kernel queues, and asyncio accepts in one go
_BUSY_TEXT = b"localpers api is busy; try again shortly"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


def _guarded_protocol() -> type:
    """uvicorn's HTTP/1.1 protocol with two guards it lacks: a connection beyond MAX_CONNECTIONS is answered 503
    and closed at once (uvicorn's own limit answers only complete requests, so half-sent ones held every file
    descriptor), and one whose request headers are not complete within HEADER_SECONDS of its start (or of the
    end of its previous response), or whose body is not complete within BODY_SECONDS of its headers, is closed
    (a body sent a byte at a time held its place for as long as the client liked). Each request on a kept-alive
    connection, pipelined ones included, has its own deadlines; time in which uvicorn has stopped reading
    because the app has not yet taken the body it holds does not count against the client."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        # what the deadline waits for: the h11 state (IDLE: a request's headers, SEND_BODY: its body) and the
        # request it belongs to (uvicorn's `cycle`), so that each request on a kept-alive connection gets its own
        _waiting_for: tuple[object, object] | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > MAX_CONNECTIONS:
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            self._follow_request()

        def handle_events(self) -> None:
            # uvicorn runs this for data that arrives and, after a response, for a request pipelined behind it
            super().handle_events()
            self._follow_request()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        def _phase(self) -> tuple[object, object]:
            return self.conn.their_state, self.cycle

        def _follow_request(self) -> None:
            phase = self._phase()
            if phase == self._waiting_for:
                return  # the same request, still within its deadline
            self._cancel_deadline()
            if phase[0] is h11.IDLE:
                self._arm_deadline(phase, HEADER_SECONDS)  # a request's headers are awaited
            elif phase[0] is h11.SEND_BODY:
                self._arm_deadline(phase, BODY_SECONDS)  # its headers are in; its body is on its way

        def _arm_deadline(self, phase: tuple[object, object], seconds: float) -> None:
            self._waiting_for = phase
            self._deadline = self.loop.call_later(seconds, self._close_if_still_waiting)

        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._waiting_for = None, None

        def _close_if_still_waiting(self) -> None:
            phase, self._deadline, self._waiting_for = self._waiting_for, None, None
            if phase != self._phase() or self.transport.is_closing():
                return
            if phase[0] is h11.SEND_BODY and self.flow.read_paused:
                # uvicorn stopped reading until the app takes the body it holds: the server is behind, not
                # the client, so the body gets another BODY_SECONDS
                self._arm_deadline(phase, BODY_SECONDS)
                return
            self.transport.close()

    return GuardedH11Protocol


def serve(app: object, host: str, port: int) -> None:
    """Run uvicorn until Ctrl+C; warnings and errors only, no access log, at most MAX_CONNECTIONS at once."""
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
    )
