"""Sequence 0 of the `Engine`'s KV cache: evaluating tokens into it, truncating it, and teacher-forced scoring.

`Evaluation` is a base class of `localpers.engine.model.Engine`. It keeps the cache's bookkeeping true, in one
place: `n_past` (the positions sequence 0 holds), the remembered prompt (`prefill` answers the same prompt again by
truncating the cache back to it) and the shared prefix the cache starts with (restored from `prefix_snapshots`
after an adapter switch, and kept in a user's folder within `prefixes_kept_in`). `eval` appends tokens batch by
batch through `_decode`, which drops a batch a Ctrl-C or a failed tap left half-recorded; `score` gives the
teacher-forced log-probs and features of continuations after one prompt.

What it does not do: load the model or create the context (`Engine._construct` sets every attribute named below,
this class none), load or switch adapters (`localpers.engine.loaded_adapters`, which clears the cache through
`reset`), or evaluate the batched sequences 1.. (`localpers.engine.batched_sequences`, which reads logits through
`_read_logits`). What an evaluation returns (`Step`, `ScoredContinuation`) is `localpers.engine.steps`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine.backend import raise_pending_interrupt
from localpers.engine.llama import llama_cpp
from localpers.engine.prefix_files import KeptPrefix, PrefixStateFiles
from localpers.engine.prefix_snapshots import PrefixSnapshots
from localpers.engine.steps import ScoredContinuation, Step, check_tokens, log_softmax_at
from localpers.engine.taps import LayerTaps
from localpers.errors import LocalpersError, TextTooLong


class Evaluation:
    """Evaluate tokens into sequence 0 of one llama.cpp context's KV cache, and keep track of what it holds."""

    _ctx: Any
    _batch: Any
    _taps: LayerTaps | None
    n_vocab: int
    n_ctx: int
    batch_capacity: int
    n_past: int
    _prompt_memo: tuple[tuple[tuple[int, ...], int], Step] | None
    _shared_prefix: tuple[int, ...] | None
    prefix_snapshots: PrefixSnapshots
    state_fingerprint: str
    active_adapter: str | None
    active_scale: float
    _adapter_identities: dict[str, list[object]]

    def reset(self) -> None:
        """Forget everything in the KV cache."""
        memory = llama_cpp.llama_get_memory(self._ctx)
        # first: a Ctrl-C is raised as the clear returns, and a memo kept then matched a prompt the cache had lost
        self.n_past, self._prompt_memo, self._shared_prefix = 0, None, None
        llama_cpp.llama_memory_clear(memory, True)

    def truncate(self, n_keep: int) -> None:
        """Drop KV positions >= n_keep so evaluation continues from there (shared-prefix reuse)."""
        if n_keep >= self.n_past:
            return
        if n_keep <= 0:
            self.reset()
            return
        if self._prompt_memo is not None and n_keep < len(self._prompt_memo[0][0]):
            self._prompt_memo = None
        if self._shared_prefix is not None and n_keep < len(self._shared_prefix):
            self._shared_prefix = None
        memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_past = n_keep  # first: a Ctrl-C is raised as the removal returns, the positions already gone
        if not llama_cpp.llama_memory_seq_rm(memory, 0, n_keep, -1):
            self.reset()  # what the cache still holds is not known
            raise LocalpersError("llama.cpp could not truncate the KV cache")

    def eval(
        self, tokens: Sequence[int], *, all_positions: bool = False, copy_logits: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Append `tokens` to the KV cache.

        Returns `(logits, features)`: for the last position only, shapes `(n_vocab,)` and
        `(n_taps, n_embd)`, or with `all_positions` for every token, `(n, n_vocab)` and `(n, n_taps, n_embd)`.
        `copy_logits=False` returns a read-only view of llama.cpp's logits buffer instead of a copy when the tokens
        fit one batch (over several with `all_positions`, a new array): valid until the next evaluation, it saves
        the decode loop a 1 MB copy per token.
        """
        check_tokens(self, tokens, "eval's tokens")
        if self.n_past + len(tokens) > self.n_ctx:
            raise TextTooLong(
                f"text too long: {self.n_past + len(tokens)} tokens exceed the model's context of"
                f" {self.n_ctx}; shorten the text (or the history items it is shown with)"
            )
        logit_rows: list[np.ndarray] = []
        feature_rows: list[np.ndarray] = []
        for start in range(0, len(tokens), self.batch_capacity):
            chunk = tokens[start : start + self.batch_capacity]
            is_last_chunk = start + len(chunk) == len(tokens)
            n_out = self._decode(chunk, all_positions=all_positions, want_last=is_last_chunk)
            if n_out:
                # a view of an earlier batch's rows would be overwritten by the next batch: copy those
                logit_rows.append(self._read_logits(n_out, copy=copy_logits or not is_last_chunk))
                if self._taps is not None:
                    feature_rows.append(self._taps.collect(len(chunk), n_out))
        logits = logit_rows[0] if len(logit_rows) == 1 else np.concatenate(logit_rows, axis=0)
        features = np.concatenate(feature_rows, axis=0) if feature_rows else None
        if all_positions:
            return logits, features
        return logits[-1], (features[-1] if features is not None else None)

    def step(self, token: int, *, copy_logits: bool = True) -> Step:
        """Evaluate one token; the logits array is a copy the caller may modify (a view without `copy_logits`)."""
        logits, features = self.eval([token], copy_logits=copy_logits)
        return Step(logits=logits, features=features)

    def prefill(self, tokens: Sequence[int], *, shared: int = 0) -> Step:
        """Evaluate a prompt from an empty cache; returns the step that predicts the first new token.

        `shared` > 0 says the first `shared` tokens are a prefix many prompts start with (a user's recent
        examples): they are always evaluated as a batch of their own, and when the cache already holds exactly
        them (same adapter) only the rest is evaluated; after an adapter switch the prefix's keys and values
        come back from `prefix_snapshots`. Cold or warm, a prompt gives the same numbers, since llama.cpp's
        results depend on how a prompt is split into batches (docs/PERFORMANCE.md).
        When the cache still starts with exactly this prompt (the last one prefilled, same adapter), it is
        truncated back to it and the remembered step is returned instead: same result, no recomputation.
        """
        key = tuple(int(t) for t in tokens)
        shared = shared if 0 < shared < len(key) else 0
        memo = self._prompt_memo
        if memo is not None and memo[0] == (key, shared) and self.n_past >= len(key):
            self.truncate(len(key))
            return Step(memo[1].logits.copy(), None if memo[1].features is None else memo[1].features.copy())
        prefix = key[:shared]
        if shared and self._shared_prefix == prefix and self.n_past >= shared:
            self.truncate(shared)
            self._prompt_memo = None
        else:
            self.reset()
            if shared:
                stored_as = self._prefix_file(prefix)
                if self.prefix_snapshots.restore(self.active_adapter, self.active_scale, prefix, stored_as):
                    self.n_past = shared
                else:
                    self.eval(prefix, copy_logits=False)
                    self.prefix_snapshots.save(self.active_adapter, self.active_scale, prefix, stored_as)
                self._shared_prefix = prefix
        logits, features = self.eval(key[shared:])
        self._prompt_memo = (
            (key, shared),
            Step(logits.copy(), None if features is None else features.copy()),
        )
        return Step(logits=logits, features=features)

    @contextlib.contextmanager
    def prefixes_kept_in(
        self, folder: Path | None, lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    ) -> Iterator[None]:
        """While open, shared prefixes are also kept in and read from `folder` (`PrefixStateFiles`, each write
        under `lock`; None: in memory only), so the next process that prefills the same prefix restores it
        instead of evaluating it."""
        before = self.prefix_snapshots.files
        fingerprint = self.state_fingerprint if folder is not None else ""
        self.prefix_snapshots.files = None if folder is None else PrefixStateFiles(folder, fingerprint, lock)
        try:
            yield
            self.prefix_snapshots.write_kept()  # after the block: the output never waits for the disk
        finally:
            self.prefix_snapshots.clear_unwritten()
            self.prefix_snapshots.files = before

    def _prefix_file(self, prefix: tuple[int, ...]) -> KeptPrefix | None:
        files = self.prefix_snapshots.files
        if files is None:
            return None
        adapter = None if self.active_adapter is None else self._adapter_identities[self.active_adapter]
        return files.entry_for(adapter, self.active_scale, prefix)

    def score(
        self,
        prompt_tokens: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        keep_logits: bool = False,
        logprob_rows: int | None = None,
    ) -> list[ScoredContinuation]:
        """Teacher-forced log-probs and features of each continuation after the same prompt.

        The prompt is evaluated once; each continuation reuses its KV cache entries.
        Row t of a result belongs to continuation token t and holds what the model saw
        before choosing it. `logprob_rows` limits the log-probabilities to the first rows (a full-vocabulary
        softmax per token is a large share of the cost when only the features are wanted).
        """
        if logprob_rows is not None and logprob_rows < 1:
            raise ValueError(f"logprob_rows must be at least 1 (or None for every row), not {logprob_rows}")
        first = self.prefill(prompt_tokens)
        n_prompt = self.n_past
        results: list[ScoredContinuation] = []
        for continuation in continuations:
            cont = list(continuation)
            check_tokens(self, cont, "a continuation")
            self.truncate(n_prompt)
            logits_rows = [first.logits[None, :]]
            feature_rows = [first.features[None]] if first.features is not None else []
            if len(cont) > 1:
                logits, features = self.eval(cont[:-1], all_positions=True)
                logits_rows.append(logits)
                if features is not None:
                    feature_rows.append(features)
            all_logits = np.concatenate(logits_rows, axis=0)
            rows = len(cont) if logprob_rows is None else min(logprob_rows, len(cont))
            logprobs = log_softmax_at(all_logits[:rows], np.asarray(cont[:rows]))
            results.append(
                ScoredContinuation(
                    tokens=cont,
                    logprobs=logprobs,
                    features=np.concatenate(feature_rows, axis=0) if feature_rows else None,
                    logits=all_logits if keep_logits else None,
                )
            )
        return results

    # ----------------------------------------------------------------- internals
    def _decode(self, tokens: Sequence[int], *, all_positions: bool, want_last: bool) -> int:
        context = self._ctx  # refused once closed, before the (then freed) batch is touched
        batch = self._batch
        n_out = 0
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            wants = all_positions or (want_last and i == len(tokens) - 1)
            batch.logits[i] = wants
            n_out += wants
        batch.n_tokens = len(tokens)
        if self._taps is not None:
            self._taps.clear()
        start = self.n_past
        try:
            result = llama_cpp.llama_decode(context, batch)
            # a Ctrl-C the Python tap callback swallowed (ctypes reports it and answers 0, which stops the graph):
            # raised here, not taken for an empty tap or returned with stale logits
            raise_pending_interrupt()
            if result != 0:
                raise LocalpersError(f"llama.cpp decode failed (code {result}) at position {start}")
            self.n_past = start + len(tokens)
            if self._taps is not None and self._taps.error:
                raise LocalpersError(f"layer tap failed: {self._taps.error}")
        except BaseException:
            # A Ctrl-C during the C call is raised only after it returned, when the cache already holds the
            # batch; a failed tap leaves it there too. Drop it, or n_past and the cache disagree and the next
            # prefill of the same prompt collides with those cells.
            self.n_past = start
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), 0, start, -1)
            raise
        return n_out

    def _read_logits(self, n_out: int, *, copy: bool = True) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits(self._ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(n_out, self.n_vocab))
        if copy:
            return rows.copy()
        rows.flags.writeable = False
        return rows
