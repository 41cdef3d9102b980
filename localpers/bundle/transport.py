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
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise LocalpersError(
                f"{req.full_url}: the server redirects to {one_line(newurl, 200)}, which is not http(s);"
                " refusing it"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)
