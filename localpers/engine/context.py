"""How many tokens a generation or rewrite can hold: the prompt and its output share one llama.cpp context.

A constant of its own, apart from `model`, so that the command line can cap `--max-tokens` without loading
llama.cpp; with it, the check of the sizes an engine is made with (`check_engine_sizes`).
"""

from __future__ import annotations

CONTEXT_TOKENS = 1024  # prompt and output together
MAX_CONTEXT_CELLS = 2**31 - 1  # llama.cpp's context sizes are 32-bit: a larger one wrapped to a small one
MAX_BATCH_SEQUENCES = 255  # llama.cpp keeps at most 256 sequences (LLAMA_MAX_SEQ), the first one the prompt's


def check_engine_sizes(
    *, n_ctx: int, n_threads: int | None, n_batch: int, batch_sequences: int, sequence_cells: int
) -> None:
    """Refuse, in one line, sizes llama.cpp would wrap or abort on (`n_ctx=2**32+64` became a 64-token context
    that a long prompt ended in a GGML_ASSERT abort; a negative one reached numpy; `n_threads=-3` was taken)."""
    from localpers.engine.threads import MAX_THREADS
    from localpers.errors import InputError

    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for name, value, low in (
        ("n_ctx", n_ctx, 1),
        ("n_batch", n_batch, 1),
        ("batch_sequences", batch_sequences, 0),
    ):
        if not whole(value) or value < low:
            raise InputError(f"the engine's {name} must be a whole number of at least {low}, not {value!r}")
    if batch_sequences > MAX_BATCH_SEQUENCES:
        raise InputError(
            f"the engine takes at most {MAX_BATCH_SEQUENCES} batched sequences, not {batch_sequences}"
        )
    if n_ctx + batch_sequences * sequence_cells > MAX_CONTEXT_CELLS or n_batch > MAX_CONTEXT_CELLS:
        raise InputError(
            f"the engine's context of {n_ctx} tokens (n_batch {n_batch}) is past llama.cpp's 2^31 - 1"
        )
    if n_threads is not None and (not whole(n_threads) or not 1 <= n_threads <= MAX_THREADS):
        raise InputError(f"the engine's threads must be 1 to {MAX_THREADS}, not {n_threads!r}")
