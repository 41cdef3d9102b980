"""The `Engine`'s batched sequences: tokens of several llama.cpp sequences evaluated in one `llama_decode`.

With `batch_sequences` > 0 the engine's KV cache is unified and holds, besides sequence 0 (the prompt that
`Evaluation` keeps), sequences 1..batch_sequences with room for `SEQUENCE_CELLS` positions each.
`BatchedSequences` is a base class of `localpers.engine.model.Engine` that evaluates tokens at given positions of
given sequences (`eval_sequences`), drops a sequence's positions (`forget_sequence`) and hands cache cells from one
sequence to another without a copy (`share_sequence`, `branch_sequence`).

What it does not do: decide what the sequences hold or keep track of their lengths (its callers do:
`localpers.engine.batch`, `localpers.engine.candidates`, `localpers.methods.scoring_batch`), or touch sequence 0
and `n_past`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localpers.engine.backend import raise_pending_interrupt
from localpers.engine.evaluation import Evaluation
from localpers.engine.llama import llama_cpp
from localpers.errors import LocalpersError

SEQUENCE_CELLS = 320  # KV positions of one batched sequence (a conditioned prompt + its continuation)


class BatchedSequences(Evaluation):
    """Evaluate and rearrange sequences 1..`batch_sequences` of the KV cache `Evaluation` keeps sequence 0 of."""

    batch_sequences: int
    tap_layers: tuple[int, ...]
    n_layer: int

    def eval_sequences(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        sequences: Sequence[int],
        *,
        all_outputs: bool = False,
        outputs: Sequence[bool] | None = None,
        logits: bool = True,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """One llama_decode of tokens at given positions of given sequences (1..batch_sequences).

        Returns the logits (a read-only view, valid until the next evaluation) and tap features of every
        token with `all_outputs`, of the tokens marked True in `outputs` (in order), else of the last token only.
        Sequence 0 and `n_past` are not touched.
        `logits=False` (features only) skips the vocabulary projection when the deepest tap is the model's
        last layer, about half of a multi-token pass on Gemma 3's 262k vocabulary, and returns None for them.
        """
        if not 0 < len(tokens) <= self.batch_capacity:
            raise ValueError(f"eval_sequences takes 1 to {self.batch_capacity} tokens")
        wanted = _output_mask(len(tokens), all_outputs, outputs)
        context = self._ctx  # refused once closed, before the (then freed) batch is touched
        batch = self._batch
        for i, (token, position, sequence) in enumerate(zip(tokens, positions, sequences, strict=True)):
            if not 0 < sequence <= self.batch_sequences or position >= self.n_ctx + SEQUENCE_CELLS:
                raise LocalpersError(f"batched sequence {sequence} position {position} is out of range")
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = wanted[i]
        batch.n_tokens = len(tokens)
        skip_logits = not logits and self._taps is not None and self.tap_layers[-1] == self.n_layer - 1
        if self._taps is not None:
            self._taps.clear()
            self._taps.stop_after_deepest(skip_logits)
        try:
            result = llama_cpp.llama_decode(context, batch)
            raise_pending_interrupt()  # as in `_decode`
            if result != 0:
                raise LocalpersError("llama.cpp decode of a batch of sequences failed")
        finally:
            if skip_logits:
                self._taps.stop_after_deepest(False)
        if self._taps is not None and self._taps.error:
            raise LocalpersError(f"layer tap failed: {self._taps.error}")
        picked = [i for i, wants in enumerate(wanted) if wants]
        features = None
        if self._taps is not None:
            features = self._taps.collect(len(tokens), len(picked), None if outputs is None else picked)
        return (None if skip_logits else self._read_logits(len(picked), copy=False)), features

    def forget_sequence(self, sequence: int, start: int = 0) -> None:
        """Drop positions >= `start` of a batched sequence from the KV cache."""
        if not 0 < sequence <= self.batch_sequences:
            raise ValueError(f"sequence {sequence} is not a batched sequence")
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), sequence, start, -1)

    def share_sequence(self, source: int, target: int, length: int) -> None:
        """Give batched sequence `target` the cache entries of `source`'s positions 0..length-1 (no copy).

        The KV cache is unified, so the cells simply belong to both sequences: what `target` evaluates next
        attends to exactly the keys and values `source` computed.
        """
        for sequence in (source, target):
            if not 0 < sequence <= self.batch_sequences:
                raise ValueError(f"sequence {sequence} is not a batched sequence")
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), source, target, 0, length)

    def branch_sequence(self, target: int, length: int) -> None:
        """Give batched sequence `target` sequence 0's cache entries of positions 0..length-1 (no copy).

        `target` then continues the prompt sequence 0 holds (`localpers.engine.candidates`); sequence 0 is
        left as it was.
        """
        if not 0 < target <= self.batch_sequences:
            raise ValueError(f"sequence {target} is not a batched sequence")
        if length > self.n_past:
            raise ValueError(f"sequence 0 holds {self.n_past} positions, not {length}")
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), 0, target, 0, length)


def _output_mask(n_tokens: int, all_outputs: bool, outputs: Sequence[bool] | None) -> list[bool]:
    """Which tokens of an `eval_sequences` batch return logits and features: all, the marked ones, or the last."""
    if outputs is None:
        return [all_outputs or i == n_tokens - 1 for i in range(n_tokens)]
    if all_outputs:
        raise ValueError("eval_sequences takes all_outputs or outputs, not both")
    wanted = [bool(wants) for wants in outputs]
    if len(wanted) != n_tokens or not any(wanted):
        raise ValueError("outputs marks one flag per token, at least one of them True")
    return wanted
