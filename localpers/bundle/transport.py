"""The device's HTTP rules for fetching bundles: follow no redirect off http(s), use no proxy for loopback.

`fetcher.Fetcher` (python-tuf's fetcher, the only path that downloads over the network) opens every connection
with these two helpers. Kept apart from `pull` so that `pull` -> `signed` -> `fetcher` -> `transport` runs one way.
"""

from __future__ import annotations

import ipaddress
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
    """Follow a redirect only to another http(s) URL (urllib would also follow one to ftp://)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        _refuse_unless_http(req.full_url, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[no-untyped-def]
        # urllib refuses a redirect to file:// itself, before `redirect_request`, as a bare HTTP 302 error
        location = headers.get("location") or headers.get("uri")
        if location:
            _refuse_unless_http(req.full_url, urllib.parse.urljoin(req.full_url, location))
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _refuse_unless_http(url: str, target: str) -> None:
    if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
        raise LocalpersError(
            f"{url}: the server redirects to {one_line(target, 200)}, which is not http(s); refusing it"
        )
