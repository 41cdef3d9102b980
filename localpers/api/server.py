"""Binding `localpers api`: which addresses are loopback, the refusal of other binds without a key, uvicorn.

`check_bind` refuses a non-loopback host unless the caller passed an explicit flag and an API key (both are
needed: the flag says it is meant, the key keeps strangers out). `serve` runs uvicorn with its access log off
(request lines carry no text, but nothing about requests is logged at all) until interrupted, at most
MAX_CONNECTIONS connections at once (others get 503). uvicorn has no deadline for a request's headers, so a
client that sends half a request holds its slot until it closes: `--allow-remote` belongs behind a proxy that
has one.
"""

from __future__ import annotations

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


MAX_CONNECTIONS = (
    32  # more at once get 503 (as `localpers serve`): open sockets stay far below a process's fds
)
IDLE_SECONDS = 5  # a kept-alive connection with no next request is closed after this


def serve(app: object, host: str, port: int) -> None:
    """Run uvicorn until Ctrl+C; warnings and errors only, no access log, at most MAX_CONNECTIONS at once."""
    import uvicorn

    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=host.strip("[]"),
        port=port,
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=IDLE_SECONDS,
    )
