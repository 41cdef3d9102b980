"""Copies of a prompt prefix's keys and values, so a prefix evaluated once is never evaluated again.

A user's prompts all start with the same block (their recent examples, `localpers.users.history_prompt`).
`Engine.prefill` keeps that block in the KV cache from one prompt to the next, but any adapter switch clears
the cache: the TUI's side-by-side view alternates the global and the cluster adapter, and the benchmark
alternates methods. `PrefixSnapshots` keeps a copy of sequence 0's cache state right after a prefix
(llama.cpp's `llama_state_seq_get_data`, ~15 KB per token on the demo backbone) for the last few
(adapter, prefix) pairs and writes it back into an empty cache (`llama_state_seq_set_data`, well under a
millisecond). The restored keys and values are the very bytes the evaluation produced, so what follows is
bit-identical to evaluating the prefix again (tests/test_engine.py).

Snapshots live in memory for the engine's lifetime. When `files` is set (`Engine.prefixes_kept_in`, the
rewrite of a user with a folder), a prefix also goes to that user's folder (`PrefixStateFiles`) and is read from
there when memory has none, so a new process starts where the last one left off. This module evaluates nothing
itself and decides nothing about what is shared.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict

from localpers.engine.llama import llama_cpp
from localpers.engine.prefix_files import KeptPrefix, PrefixStateFiles

DEFAULT_CAPACITY = 4  # prefixes kept: a few users x adapters; ~1 MB each for a 5-example prompt on the demo


class PrefixSnapshots:
    """The last `capacity` prefix states of one llama.cpp context, keyed by adapter, scale and tokens."""

    def __init__(self, ctx: llama_cpp.llama_context_p, capacity: int = DEFAULT_CAPACITY) -> None:
        self._ctx = ctx
        self.capacity = capacity
        self._states: OrderedDict[tuple[str | None, float, tuple[int, ...]], ctypes.Array] = OrderedDict()
        self.files: PrefixStateFiles | None = None
        # states `save` made for `files`, written by `write_kept` once the rewrite is decoded
        self._unwritten: list[tuple[KeptPrefix, bytes]] = []

    def __len__(self) -> int:
        return len(self._states)

    def save(
        self, adapter: str | None, scale: float, prefix: tuple[int, ...], stored_as: KeptPrefix | None = None
    ) -> None:
        """Copy sequence 0's state, which must hold exactly `prefix`, under this adapter; with `stored_as`
        (an entry of `files`) it is written there by `write_kept`, once the output no longer waits for it."""
        on_disk = stored_as is not None and self.files is not None
        if self.capacity <= 0 and not on_disk:
            return
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, 0) != size:
            return  # nothing kept; the prefix is simply evaluated again next time
        if on_disk:
            self._unwritten.append((stored_as, bytes(buffer)))
        if self.capacity <= 0:
            return
        self._keep((adapter, scale, prefix), buffer)

    def restore(
        self, adapter: str | None, scale: float, prefix: tuple[int, ...], stored_as: KeptPrefix | None = None
    ) -> bool:
        """Write the saved state of `prefix` into sequence 0 of an empty cache, from memory or else from
        `stored_as` (an entry of `files`); False when neither holds it or llama.cpp refuses it."""
        key = (adapter, scale, prefix)
        buffer = self._states.get(key)
        from_disk = False
        if buffer is None and stored_as is not None and self.files is not None:
            data = self.files.read(stored_as)
            if data is not None:
                buffer, from_disk = (ctypes.c_uint8 * len(data)).from_buffer_copy(data), True
        if buffer is None:
            return False
        if llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(buffer), 0) == 0:
            self._states.pop(key, None)  # llama.cpp refused it (and cleared the sequence): evaluate instead
            return False
        if not from_disk:
            self._states.move_to_end(key)
        elif self.capacity > 0:
            self._keep(key, buffer)
        return True

    def _keep(self, key: tuple[str | None, float, tuple[int, ...]], buffer: ctypes.Array) -> None:
        self._states[key] = buffer
        self._states.move_to_end(key)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def write_kept(self) -> None:
        """Write the states `save` left for `files` (a failed write is skipped: `PrefixStateFiles.write`)."""
        unwritten, self._unwritten = self._unwritten, []
        if self.files is not None:
            for entry, state in unwritten:
                self.files.write(entry, state)

    def clear_unwritten(self) -> None:
        self._unwritten = []

    def clear(self) -> None:
        self._states.clear()
        self._unwritten = []
