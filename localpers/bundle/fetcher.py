"""Fetching a signed repository's files: http(s) under the device's transport rules, or a local directory.

`Fetcher` streams one URL in chunks (capped, with progress), resumes a partial backbone download, and
hands python-tuf a `FetcherInterface` over itself (`as_tuf_fetcher`), so every byte of a signed pull comes
through here. `repository_base` normalises the repository a user names and `is_signed_repository` tells a
signed one from an unsigned bundle directory. It verifies nothing: signatures, lengths and hashes are
python-tuf's, driven by `localpers.bundle.signed`; it only tells a body cut short by a closed connection
(fewer bytes than the server announced: a network failure, try again) from a whole file that is wrong.

Each read waits at most the pull's timeout, and a download must also keep an average of `MIN_RATE` past its first
timeout's worth of seconds: a server sending a byte a second never let a read time out, and held the pull (and its
lock) for as long as it liked, days for one metadata file.
"""

from __future__ import annotations

import http.client
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localpers import __version__
from localpers.bundle.repository_metadata import is_repository
from localpers.bundle.transport import SlowHead, opener_handlers
from localpers.errors import InputError, LocalpersError
from localpers.paths import expand_user
from localpers.untrusted import one_line

CHUNK = 1 << 20
MIN_RATE = 4096  # bytes a second a download keeps on average, once its first `timeout` seconds are spent


class Pace:
    """Gives up on a download that still sends, but too slowly ever to end."""

    def __init__(self, url: str, timeout: float, advice: str) -> None:
        self.url, self.timeout, self.advice = url, timeout, advice
        self.started = time.monotonic()

    def check(self, received: int) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.timeout + received / MIN_RATE:
            raise LocalpersError(
                f"{self.url}: the server sent {received:,} bytes in {elapsed:.0f} s, slower than"
                f" {MIN_RATE // 1024} KB/s on average; {self.advice}"
            )


def slow_head(exc: SlowHead, advice: str) -> str:
    """The one-line message for a server too slow to send even its answer's head."""
    return f"the server is too slow to answer ({exc}); {advice}"


def reason(exc: BaseException) -> str:
    """An exception as one short line: its type and message."""
    return one_line(f"{type(exc).__name__}: {exc}", 200)


def announced_length(response: Any) -> int | None:
    """The Content-Length a response announced, or None (none, or not a number)."""
    value = str(response.headers.get("Content-Length", "")).strip()
    return int(value) if value.isdigit() else None


def _amount(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def cut_short(url: str, received: int, expected: int, advice: str) -> str:
    """The one-line message for a body that stopped early because the connection closed (a network failure,
    not tampering: exit code 1)."""
    return f"the connection closed after {_amount(received)} of {_amount(expected)} of {url}; {advice}"


class Fetcher:
    """A python-tuf fetcher (subclass built lazily) over http(s) or a local directory, with progress."""

    def __init__(self, timeout: float, on_bytes: Callable[[int], None] | None = None) -> None:
        self.timeout = timeout
        self.on_bytes = on_bytes
        self.last_url = ""  # what python-tuf asked for last: the metadata file an error is about

    def chunks(self, url: str) -> Iterator[bytes]:
        from tuf.api.exceptions import DownloadHTTPError

        self.last_url = url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            yield from self._file_chunks(Path(urllib.parse.unquote(parsed.path)))
            return
        opener = urllib.request.build_opener(*opener_handlers(parsed.hostname))
        request = urllib.request.Request(
            url, headers={"User-Agent": f"localpers/{__version__}", "Accept-Encoding": "identity"}
        )
        try:
            response = opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise DownloadHTTPError(f"{url}: HTTP {exc.code}", exc.code) from None
        except SlowHead as exc:  # raised by the answer's read, which urllib does not wrap
            raise LocalpersError(
                f"{url}: {slow_head(exc, 'try again, or pull from another mirror')}"
            ) from None
        except urllib.error.URLError as exc:
            raise LocalpersError(
                f"could not reach {url}: {one_line(str(exc.reason), 200)}; check the address and that the"
                " server runs"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise LocalpersError(f"{url}: request failed ({reason(exc)}); try again") from None
        with response:
            if response.status != 200:
                raise DownloadHTTPError(f"{url}: HTTP {response.status}", response.status)
            announced = announced_length(response)
            received = 0
            pace = Pace(url, self.timeout, "try again, or pull from another mirror")
            while True:
                try:  # read1: one socket read at most, so a trickle is measured as it comes
                    block = response.read1(CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise LocalpersError(f"{url}: download failed ({reason(exc)}); try again") from None
                if not block:
                    break
                received += len(block)
                pace.check(received)
                if self.on_bytes:
                    self.on_bytes(len(block))
                yield block
            # urllib ends a body quietly where the connection closed: python-tuf would then see a file
            # shorter than signed and call it tampered, though only the network failed.
            if announced is not None and received < announced:
                raise LocalpersError(cut_short(url, received, announced, "try again"))

    def _file_chunks(self, path: Path) -> Iterator[bytes]:
        from tuf.api.exceptions import DownloadHTTPError

        try:
            info = path.lstat()
        except FileNotFoundError:
            raise DownloadHTTPError(f"{path}: no such file", 404) from None
        if not stat.S_ISREG(info.st_mode):  # no FIFOs, devices or symlinks out of the repository
            raise DownloadHTTPError(f"{path}: not a regular file", 403)
        with path.open("rb") as handle:
            while block := handle.read(CHUNK):
                if self.on_bytes:
                    self.on_bytes(len(block))
                yield block

    def resume_into(self, url: str, partial: Path, length: int) -> None:
        """Append the rest of `url` to `partial` (an HTTP range request from its size), at most `length`
        bytes in all. A server that ignores the range gets the file restarted from byte 0."""
        have = partial.stat().st_size if partial.exists() else 0
        if have > length:
            partial.unlink()
            have = 0
        if have == length:
            return
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            source = Path(urllib.parse.unquote(parsed.path))
            if not source.is_file() or source.is_symlink():
                raise LocalpersError(f"{source}: missing or not a regular file in the repository")
            with source.open("rb") as handle, partial.open("ab") as out:
                handle.seek(have)
                self._copy_capped(handle, out, length - have, url)
            return
        headers = {"User-Agent": f"localpers/{__version__}", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            response = urllib.request.build_opener(*opener_handlers(parsed.hostname)).open(
                urllib.request.Request(url, headers=headers), timeout=self.timeout
            )
        except urllib.error.HTTPError as exc:
            raise LocalpersError(f"{url}: HTTP {exc.code}; the repository does not hold this file") from None
        except SlowHead as exc:
            raise LocalpersError(f"{url}: {slow_head(exc, 'pull again to resume')}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise LocalpersError(f"could not reach {url} ({reason(exc)}); pull again to resume") from None
        with response:
            resumed = response.status == 206 and str(response.headers.get("Content-Range", "")).startswith(
                f"bytes {have}-"
            )
            mode = "ab" if resumed else "wb"
            remaining = length - have if resumed else length
            announced = announced_length(response)
            with partial.open(mode) as out:
                pace = Pace(url, self.timeout, "pull again to resume, or pull from another mirror")
                copied = self._copy_capped(response, out, remaining, url, pace)
        if announced is not None and copied < announced:  # the .partial stays for the next pull
            start = have if resumed else 0
            raise LocalpersError(cut_short(url, start + copied, length, "pull again to resume"))

    def _copy_capped(self, stream: Any, out: Any, remaining: int, url: str, pace: Pace | None = None) -> int:
        """Copy `stream` to `out` until it ends; refuses more than `remaining` bytes (and, with `pace`, a stream
        too slow ever to end). Returns the count."""
        copied = 0
        while True:
            try:
                block = stream.read1(min(CHUNK, remaining + 1))
            except (OSError, http.client.HTTPException) as exc:
                raise LocalpersError(
                    f"{url}: download failed ({reason(exc)}); pull again to resume"
                ) from None
            if not block:
                return copied
            if len(block) > remaining:
                raise InputError(f"{url}: the server sends more than the signed length; refusing it")
            out.write(block)
            out.flush()
            remaining -= len(block)
            copied += len(block)
            if pace is not None:
                pace.check(copied)
            if self.on_bytes:
                self.on_bytes(len(block))

    def as_tuf_fetcher(self) -> Any:
        from tuf.ngclient import FetcherInterface

        outer = self

        class _TufFetcher(FetcherInterface):
            def _fetch(self, url: str) -> Iterator[bytes]:
                return outer.chunks(url)

        return _TufFetcher()


def repository_base(source: str) -> str:
    """The base URL (ending in /) of a repository given as an http(s) URL or a local directory."""
    if source.startswith(("http://", "https://")):
        try:
            parsed = urllib.parse.urlsplit(source)
            hostname, _ = parsed.hostname, parsed.port  # both raise ValueError on a malformed [IPv6] or port
        except ValueError as exc:
            raise InputError(f"{one_line(source, 200)}: not a valid http(s) URL ({exc})") from None
        if not hostname:
            raise InputError(f"{one_line(source, 200)}: not an http(s) URL of a repository")
        # urllib would look `user:password@host` up as a host name, and echo the password
        if "@" in parsed.netloc:
            raise InputError(
                "a repository URL with a user name or password is not supported: give the URL without them"
            )
        path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
        return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))
    if "://" in source:
        raise InputError(f"{source}: only http://, https:// or a local directory can be pulled")
    directory = expand_user(source).resolve()
    if not directory.is_dir():
        raise LocalpersError(f"{source}: no such directory; give a repository directory or an http(s) URL")
    return directory.as_uri() + "/"


def is_signed_repository(source: str) -> bool:
    """A local directory with metadata/1.root.json, or any URL (URLs are always pulled signed)."""
    if "://" in source:
        return True
    return is_repository(expand_user(source))
