"""A user's prompt-prefix states kept on disk, so a new process need not evaluate the user's examples block again.

Every history-conditioned prompt of a user starts with the same block (their recent examples,
`localpers.users.history_prompt`). Within one process `PrefixSnapshots` keeps that block's keys and values in
memory; a one-shot `localpers rewrite`, the first rewrite in the TUI and the API's first request for a user start
empty and evaluate it again (on the demo backbone ~100 of a conditioned prompt's ~150 tokens). `PrefixStateFiles`
keeps the same bytes (llama.cpp's `llama_state_seq_get_data` of sequence 0 right after the block) in the user's
own folder, one file per (engine, adapter, scale, block):

    prefix-<sha256 of the key, 32 hex>.kv     b"LPKV2\\n" + sha256(key) + sha256(state) + state

The key covers everything that shapes the bytes: the backbone file and each adapter file (path, size,
modification time), llama.cpp's version and CPU features, and the context's shape and threads
(`Engine.state_fingerprint`). Restoring those bytes gives the very keys and values the evaluation would, so a
rewrite is bit-identical either way (tests/test_engine.py). A file that is damaged, truncated, of another
version or of another key (copied or linked under this name) reads as absent and is written again; only a
regular file of the folder's own is read (`localpers.regular_files`: no link, FIFO or device, never past its
size). A failed write (a full disk, a read-only folder, the user's write lock busy or the user deleted
meanwhile: `lock`) is skipped: this is a cache, never the user's data. The newest `MAX_FILES` are kept. The
files hold the user's text in a derived form, so they live only in that user's folder: every change to the
history removes them all (`remove_kept`: a removed item is not kept in another form), `localpers user delete`
removes them with the folder and `localpers user export` never packs them. This module evaluates nothing and
decides nothing about what is shared.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localpers.atomic import atomic_write_bytes
from localpers.errors import LocalpersError
from localpers.regular_files import read_regular_file

MAGIC = b"LPKV2\n"
FILE_PATTERN = "prefix-*.kv"
MAX_FILES = 4  # the global adapter's block and the user's cluster's, with room for a history that changed
MAX_FILE_BYTES = 256 * 1024 * 1024  # a 1024-token context's whole state is ~15 MB on the demo backbone
_DIGEST_BYTES = 32
_HEADER_BYTES = len(MAGIC) + 2 * _DIGEST_BYTES


def file_identity(path: Path) -> list[object]:
    """What names a model or adapter file's content without reading it: resolved path, size, mtime (ns)."""
    info = path.stat()
    return [str(path.resolve()), info.st_size, info.st_mtime_ns]


def remove_kept(folder: Path) -> None:
    """Remove every kept prefix state of `folder` (the user's history changed: the blocks it held may show
    an item that is gone); one that cannot be removed is left to eviction."""
    for path in Path(folder).glob(FILE_PATTERN):
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass(frozen=True)
class KeptPrefix:
    """Where one prefix state is kept, and the sha256 of its key, which the file must carry to be read."""

    path: Path
    key: bytes


class PrefixStateFiles:
    """The prefix states of one user folder, for one engine (`fingerprint`)."""

    def __init__(
        self,
        folder: Path,
        fingerprint: str,
        lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        # the folder owner's write lock, taken without waiting around each write (it raises when the folder
        # is busy or no longer the one this command started with)
        self.lock = lock or contextlib.nullcontext

    def entry_for(self, adapter: Sequence[object] | None, scale: float, prefix: Sequence[int]) -> KeptPrefix:
        key = json.dumps([self.fingerprint, adapter, repr(float(scale)), list(prefix)])
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        return KeptPrefix(self.folder / f"prefix-{digest.hex()[:32]}.kv", digest)

    def read(self, entry: KeptPrefix) -> bytes | None:
        """The state kept for `entry`, or None when there is none or it is not intact and of this key."""
        try:  # a regular file of this folder's own only: a FIFO would block, a device never end
            data = read_regular_file(
                entry.path, MAX_FILE_BYTES + _HEADER_BYTES, what="kept state", stored=True, follow_links=False
            )
        except LocalpersError:
            return None
        if len(data) <= _HEADER_BYTES or not data.startswith(MAGIC):
            return None
        key_end = len(MAGIC) + _DIGEST_BYTES
        state = data[_HEADER_BYTES:]
        if (
            data[len(MAGIC) : key_end] != entry.key
            or hashlib.sha256(state).digest() != data[key_end:_HEADER_BYTES]
        ):
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path, follow_symlinks=False)  # recently used: the last to be evicted
        return state

    def write(self, entry: KeptPrefix, state: bytes) -> None:
        """Keep `state` for `entry` atomically and evict the oldest beyond `MAX_FILES`; failures are skipped."""
        if not self.folder.is_dir() or len(state) > MAX_FILE_BYTES:
            return
        try:
            with self.lock():
                atomic_write_bytes(entry.path, MAGIC + entry.key + hashlib.sha256(state).digest() + state)
                self._evict(keep=entry.path)
        except (LocalpersError, OSError):
            return

    def _evict(self, keep: Path) -> None:
        """Remove all but the newest `MAX_FILES` (a link counts as a file and goes first when it is dangling;
        what cannot be removed, e.g. a folder of that name, is neither counted nor kept track of)."""
        stored: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for path in self.folder.glob(FILE_PATTERN):
                with contextlib.suppress(OSError):
                    info = path.lstat()
                    if path != keep and (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                        stored.append((info.st_mtime_ns if stat.S_ISREG(info.st_mode) else -1, path))
        stored.sort(reverse=True)
        for _, path in stored[MAX_FILES - 1 :]:
            with contextlib.suppress(OSError):
                path.unlink()
