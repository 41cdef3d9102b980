"""The device's HTTP rules for fetching bundles: follow no redirect off http(s), from https to plain http, or from
a public address to this machine or its local network; use no proxy for loopback; give up on a server that sends
its answer's head (status line and headers) too slowly.

TUF checks every byte a redirect leads to, so these rules are not about content: a hostile repository could
otherwise make the device send requests to its own network (a router's page) or read a pull in clear.

A socket's timeout bounds each read, not the head as a whole: a server sending one byte a little within it held a
pull (and the trust store's lock, so every other pull) for days before the body's pace check could start. The
head must come within `HEAD_TIMEOUTS` timeouts (`SlowHead` otherwise).

`fetcher.Fetcher` (python-tuf's fetcher, the only path that downloads over the network) opens every connection
with `opener_handlers`. Kept apart from `pull` so that `pull` -> `signed` -> `fetcher` -> `transport` runs one way.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import urllib.parse
import urllib.request

from localpers.errors import LocalpersError
from localpers.untrusted import one_line


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only as `check_redirect` allows (urllib would also follow one to ftp://, or from https to
    plain http)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        check_redirect(req.full_url, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[no-untyped-def]
        # urllib refuses a redirect to file:// itself, before `redirect_request`, as a bare HTTP 302 error
        location = headers.get("location") or headers.get("uri")
        if location:
            check_redirect(req.full_url, urllib.parse.urljoin(req.full_url, location))
        fp.close()  # urllib reads the whole 3xx body before following, with no cap; a closed response reads b""
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


HEAD_TIMEOUTS = 2  # the head's deadline, in the pull's timeouts


class SlowHead(OSError):
    """The server did not send its answer's status line and headers within the deadline."""


class _HeadDeadline:
    """Mixed into an `http.client` connection: the answer's head must arrive within `HEAD_TIMEOUTS` socket
    timeouts, or the socket is shut down and `SlowHead` raised."""

    timeout: object
    sock: socket.socket | None

    def getresponse(self) -> http.client.HTTPResponse:
        seconds = self.timeout if isinstance(self.timeout, int | float) else None
        if seconds is None:  # no timeout given: nothing to bound by
            return super().getresponse()  # type: ignore[misc]
        cut = threading.Event()

        def shut() -> None:
            cut.set()
            with contextlib.suppress(OSError, AttributeError):
                self.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]

        timer = threading.Timer(HEAD_TIMEOUTS * seconds, shut)
        timer.daemon = True
        timer.start()
        slow = SlowHead(f"no answer's head within {HEAD_TIMEOUTS * seconds:g} s")
        try:
            response = super().getresponse()  # type: ignore[misc]
        except (OSError, http.client.HTTPException):
            if cut.is_set():
                raise slow from None
            raise
        finally:
            timer.cancel()
        if cut.is_set():  # it fired as the head ended: the socket is shut, the body could not be read
            response.close()
            raise slow
        return response


class _DeadlineHTTPConnection(_HeadDeadline, http.client.HTTPConnection):
    pass


class _DeadlineHTTPSConnection(_HeadDeadline, http.client.HTTPSConnection):
    pass


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):  # type: ignore[no-untyped-def]
        return self.do_open(_DeadlineHTTPConnection, req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):  # type: ignore[no-untyped-def]
        return self.do_open(_DeadlineHTTPSConnection, req, context=self._context)


def opener_handlers(host: str | None) -> list[urllib.request.BaseHandler]:
    """The handlers every download's opener is built with: the redirect rules, the head's deadline, and no proxy
    for a loopback `host`."""
    handlers: list[urllib.request.BaseHandler] = [
        HttpOnlyRedirects(),
        _DeadlineHTTPHandler(),
        _DeadlineHTTPSHandler(),
    ]
    if host and is_loopback(host):
        handlers.append(urllib.request.ProxyHandler({}))
    return handlers


def check_redirect(url: str, target: str) -> None:
    """Refuse a redirect from `url` to `target` off http(s), from https to http, or to an address on this machine
    or its local network when `url`'s host is not one (a local repository may redirect within its network)."""
    old, new = urllib.parse.urlsplit(url), urllib.parse.urlsplit(target)
    scheme = new.scheme.lower()
    shown = one_line(target, 200)
    if scheme not in ("http", "https"):
        raise LocalpersError(f"{url}: the server redirects to {shown}, which is not http(s); refusing it")
    if old.scheme.lower() == "https" and scheme == "http":
        raise LocalpersError(f"{url}: the server redirects to {shown}, plain http from https; refusing it")
    leaves_public = not (old.hostname and is_internal(old.hostname))
    if new.hostname and new.hostname != old.hostname and leaves_public and is_internal(new.hostname):
        raise LocalpersError(
            f"{url}: the server redirects to {shown}, an address on this machine or its local network; refusing it"
        )


def is_internal(host: str) -> bool:
    """Whether `host` is, or resolves to, a loopback, private, link-local or otherwise non-public address."""
    try:
        addresses = {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        try:
            found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False  # not resolvable here: the connection that follows fails on its own
        addresses = {ipaddress.ip_address(str(entry[4][0]).split("%")[0]) for entry in found}
    return any(not address.is_global for address in addresses)
