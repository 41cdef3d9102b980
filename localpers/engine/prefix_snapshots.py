"""Copies of a prompt prefix's keys and values, so a prefix evaluated once is never evaluated again.

A user's prompts all start with the same block (their recent examples, `localpers.users.history_prompt`).
`Engine.prefill` keeps that block in the KV cache from one prompt to the next, but any adapter switch clears
the cache: the TUI's side-by-side view alternates the global and the cluster adapter, and the benchmark
alternates methods. `PrefixSnapshots` keeps a copy of sequence 0's cache state right after a prefix
(llama.cpp's `llama_state_seq_get_data`, ~15 KB per token on the demo backbone) for the last few
(adapter, prefix) pairs and writes it back into an empty cache (`llama_state_seq_set_data`, well under a
millisecond). The restored keys and values are the very bytes the evaluation produced, so what follows is
bit-identical to evaluating the prefix again (tests/test_engine.py).

Snapshots live in memory only, for the engine's lifetime: they hold the user's text in a derived form and
are never written to disk. This module evaluates nothing itself and decides nothing about what is shared.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict

import llama_cpp

DEFAULT_CAPACITY = 4  # prefixes kept: a few users x adapters; ~1 MB each for a 5-example prompt on the demo


class PrefixSnapshots:
    """The last `capacity` prefix states of one llama.cpp context, keyed by adapter, scale and tokens."""

    def __init__(self, ctx: llama_cpp.llama_context_p, capacity: int = DEFAULT_CAPACITY) -> None:
        self._ctx = ctx
        self.capacity = capacity
        self._states: OrderedDict[tuple[str | None, float, tuple[int, ...]], ctypes.Array] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def save(self, adapter: str | None, scale: float, prefix: tuple[int, ...]) -> None:
        """Copy sequence 0's state, which must hold exactly `prefix`, under this adapter."""
        if self.capacity <= 0:
            return
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, 0) != size:
            return  # nothing kept; the prefix is simply evaluated again next time
        key = (adapter, scale, prefix)
        self._states[key] = buffer
        self._states.move_to_end(key)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def restore(self, adapter: str | None, scale: float, prefix: tuple[int, ...]) -> bool:
        """Write the saved state of `prefix` into sequence 0 of an empty cache; False when none is kept."""
        key = (adapter, scale, prefix)
        buffer = self._states.get(key)
        if buffer is None:
            return False
        if llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(buffer), 0) == 0:
            del self._states[key]  # llama.cpp refused it (and cleared the sequence): evaluate instead
            return False
        self._states.move_to_end(key)
        return True

    def clear(self) -> None:
        self._states.clear()
