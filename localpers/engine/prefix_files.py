"""A user's prompt-prefix states kept on disk, so a new process need not evaluate the user's examples block again.

Every history-conditioned prompt of a user starts with the same block (their recent examples,
`localpers.users.history_prompt`). Within one process `PrefixSnapshots` keeps that block's keys and values in
memory; a one-shot `localpers rewrite`, the first rewrite in the TUI and the API's first request for a user start
empty and evaluate it again (on the demo backbone ~100 of a conditioned prompt's ~150 tokens). `PrefixStateFiles`
keeps the same bytes (llama.cpp's `llama_state_seq_get_data` of sequence 0 right after the block) in the user's
own folder, one file per (engine, adapter, scale, block):

    prefix-<sha256 of the key, 32 hex>.kv     b"LPKV1\\n" + sha256(state) + state

The key covers everything that shapes the bytes: the backbone file and each adapter file (path, size,
modification time), llama.cpp's version and CPU features, and the context's shape and threads
(`Engine.state_fingerprint`). Restoring those bytes gives the very keys and values the evaluation would, so a
rewrite is bit-identical either way (tests/test_engine.py). A file that is damaged, truncated or of another
version reads as absent and is written again; a failed write (a full disk, a read-only folder, the user's write
lock busy or the user deleted meanwhile: `lock`) is skipped: this is a cache, never the user's data. The newest
`MAX_FILES` are kept. The files hold the user's text in a derived form, so they live only in that user's folder:
every change to the history removes them all (`remove_kept`: a removed item is not kept in another form), `localpers
user delete` removes them with the folder and `localpers user export` never packs them. This module evaluates
nothing and decides nothing about what is shared.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from localpers.atomic import atomic_write_bytes
from localpers.errors import LocalpersError

MAGIC = b"LPKV1\n"
FILE_PATTERN = "prefix-*.kv"
MAX_FILES = 4  # the global adapter's block and the user's cluster's, with room for a history that changed
MAX_FILE_BYTES = 256 * 1024 * 1024  # a 1024-token context's whole state is ~15 MB on the demo backbone
_DIGEST_BYTES = 32


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

    def path_for(self, adapter: Sequence[object] | None, scale: float, prefix: Sequence[int]) -> Path:
        key = json.dumps([self.fingerprint, adapter, repr(float(scale)), list(prefix)])
        return self.folder / f"prefix-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}.kv"

    def read(self, path: Path) -> bytes | None:
        """The state stored at `path`, or None when there is none or it is not intact."""
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                return None
            data = path.read_bytes()
        except OSError:
            return None
        header = len(MAGIC) + _DIGEST_BYTES
        if len(data) <= header or not data.startswith(MAGIC):
            return None
        state = data[header:]
        if hashlib.sha256(state).digest() != data[len(MAGIC) : header]:
            return None
        with contextlib.suppress(OSError):
            path.touch()  # recently used: the last to be evicted
        return state

    def write(self, path: Path, state: bytes) -> None:
        """Store `state` at `path` atomically and evict the oldest beyond `MAX_FILES`; failures are ignored."""
        if not self.folder.is_dir() or len(state) > MAX_FILE_BYTES:
            return
        try:
            with self.lock():
                atomic_write_bytes(path, MAGIC + hashlib.sha256(state).digest() + state)
                self._evict(keep=path)
        except (LocalpersError, OSError):
            return

    def _evict(self, keep: Path) -> None:
        try:
            stored = [(p.stat().st_mtime_ns, p) for p in self.folder.glob(FILE_PATTERN) if p != keep]
        except OSError:
            return
        stored.sort(reverse=True)
        for _, path in stored[MAX_FILES - 1 :]:
            with contextlib.suppress(OSError):
                path.unlink()
