"""The engine when a Ctrl-C lands inside a llama.cpp call, and what it refuses instead of aborting (eighty-sixth
session's second audit of the engine).

CPython raises a Ctrl-C that arrives during a ctypes call as the call returns, before the next line runs: the
tests stand for it with a wrapper that makes the real call and then raises KeyboardInterrupt. Cases that failed
before: a Ctrl-C inside `close()` left a freed model for `__del__` to free again (a segfault), one inside
`set_adapter` or `reset` left the Python side out of step with llama.cpp (outputs of the wrong adapter, a prompt
memo of an emptied cache: degenerate text), a closed engine answered `prefill` and `score` from its memo, an
interrupted construction kept the model and context, a token id outside the vocabulary or a sampler chain used
after its engine closed aborted the process, sizes past 32 bits wrapped, and 16 candidates of 1,024 tokens ran the
shared KV cache out of cells after minutes of work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localpers.engine import Engine
from localpers.engine.backbone import Backbone
from localpers.engine.candidates import generate_candidates
from localpers.engine.decoding import GREEDY, SamplerSettings
from localpers.engine.generation import generate
from localpers.engine.llama import llama_cpp
from localpers.errors import InputError, LocalpersError

PROMPT = "The capital of France is"
ADAPTERS = Path(__file__).resolve().parents[1] / "models" / "demo-bundle" / "adapters"


@pytest.fixture(scope="module")
def engine(backbone: Backbone) -> Iterator[Engine]:
    with Engine(backbone.path, n_threads=1, tap_layers=None) as shared:
        shared.load_adapter(ADAPTERS / "cluster-0.gguf", "a1")
        yield shared


def interrupted_after(monkeypatch: pytest.MonkeyPatch, name: str) -> Callable[[], None]:
    """Make llama_cpp.NAME raise KeyboardInterrupt once, after the real call returned; returns the undo."""
    real = getattr(llama_cpp, name)
    calls = {"n": 0}

    def wrapper(*args: Any) -> Any:
        result = real(*args)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return result

    context = monkeypatch.context()
    patched = context.__enter__()  # not monkeypatch.undo(): that would undo the isolated home too
    patched.setattr(llama_cpp, name, wrapper)
    return lambda: context.__exit__(None, None, None)


def run_script(script: str, backbone: Backbone, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`script` in a process of its own (an abort or a segfault there is a return code here, not a lost session),
    given the backbone's path."""
    return subprocess.run(
        [sys.executable, "-c", script, str(backbone.path)],
        env={**os.environ, "LOCALPERS_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )


DOUBLE_FREE = """
import gc, sys
from localpers.engine import Engine
from localpers.engine.llama import llama_cpp

real, freed = llama_cpp.llama_model_free, []

def free_then_interrupt(handle):
    address = getattr(handle, "value", handle)
    if address in freed:
        print("freed twice")  # the old close() went on to free it again; not done here, it would segfault
        sys.stdout.flush()
        return
    real(handle)
    freed.append(address)
    raise KeyboardInterrupt

llama_cpp.llama_model_free = free_then_interrupt
engine = Engine(sys.argv[1], n_threads=1, tap_layers=None)
try:
    engine.close()
except KeyboardInterrupt:
    print("interrupted")
del engine
gc.collect()
print("done")
"""


def test_a_ctrl_c_inside_close_frees_nothing_twice(backbone: Backbone, tmp_path: Path) -> None:
    run = run_script(DOUBLE_FREE, backbone, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["interrupted", "done"]


def test_a_ctrl_c_inside_set_adapter_leaves_a_known_adapter(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens, other = engine.tokenize(PROMPT), engine.tokenize("Rain is expected over the weekend")
    engine.set_adapter(None)
    plain = engine.prefill(tokens).logits.copy()
    engine.prefill(other)  # the prompt memo now holds another prompt
    undo = interrupted_after(monkeypatch, "llama_set_adapters_lora")
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.set_adapter("a1")
    finally:
        undo()
    engine.set_adapter(None)  # returned early before, with a1 still applied
    np.testing.assert_array_equal(engine.prefill(tokens).logits, plain)
    engine.set_adapter("a1")
    assert np.abs(engine.prefill(tokens).logits - plain).max() > 0.01
    engine.set_adapter(None)


def test_a_ctrl_c_inside_reset_leaves_no_memo_of_the_emptied_cache(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.set_adapter(None)
    fresh = generate(engine, PROMPT, max_tokens=8, sampling=GREEDY).text
    undo = interrupted_after(monkeypatch, "llama_memory_clear")
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.reset()
    finally:
        undo()
    assert generate(engine, PROMPT, max_tokens=8, sampling=GREEDY).text == fresh


def test_a_ctrl_c_inside_truncate_keeps_the_count_of_positions(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.set_adapter(None)
    tokens = engine.tokenize(PROMPT)
    expected = engine.prefill(tokens).logits.copy()
    engine.prefill(tokens + engine.tokenize(" Paris, and", add_bos=False))
    undo = interrupted_after(monkeypatch, "llama_memory_seq_rm")
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.truncate(len(tokens) - 1)
    finally:
        undo()
    assert engine.n_past == len(tokens) - 1
    np.testing.assert_array_equal(engine.prefill(tokens).logits, expected)


def test_a_closed_engine_answers_nothing_from_its_memo(backbone: Backbone) -> None:
    closed = Engine(backbone.path, n_threads=1, tap_layers=None)
    tokens = closed.tokenize(PROMPT)
    closed.prefill(tokens)
    closed.close()
    with pytest.raises(LocalpersError, match="was closed"):
        closed.prefill(tokens)
    with pytest.raises(LocalpersError, match="was closed"):
        closed.score(tokens, [closed.tokenize(" Paris", add_bos=False)])


def test_an_interrupted_construction_frees_what_it_loaded(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    freed: list[str] = []
    real_model_free, real_free = llama_cpp.llama_model_free, llama_cpp.llama_free
    with monkeypatch.context() as patched:
        patched.setattr(llama_cpp, "llama_batch_init", _raise_keyboard_interrupt)
        patched.setattr(llama_cpp, "llama_model_free", lambda h: (freed.append("model"), real_model_free(h)))
        patched.setattr(llama_cpp, "llama_free", lambda h: (freed.append("context"), real_free(h)))
        with pytest.raises(KeyboardInterrupt):
            Engine(backbone.path, n_threads=1, tap_layers=None)
    assert freed == ["context", "model"]  # before: neither (about 310 MiB kept per try)


def _raise_keyboard_interrupt(*args: Any) -> None:
    raise KeyboardInterrupt


ABORTS = """
import sys
from localpers.engine import Engine
from localpers.engine.decoding import GREEDY

engine = Engine(sys.argv[1], n_threads=1, tap_layers=None)
for call in (lambda: engine.detokenize([10**7]), lambda: engine.token_bytes(-1),
             lambda: engine.is_end_of_generation(2**31)):
    try:
        call()
    except ValueError as exc:
        print("refused:", exc)
chain = engine.sampler_chain(GREEDY)
step = engine.prefill(engine.tokenize("Hello"))
engine.close()
try:
    chain.sample(step.logits)
except Exception as exc:
    print("refused:", exc)
"""


def test_an_id_outside_the_vocabulary_and_a_chain_of_a_closed_engine_are_refused(
    backbone: Backbone, tmp_path: Path
) -> None:
    run = run_script(ABORTS, backbone, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]  # not -6 (std::out_of_range, std::bad_alloc)
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("refused:") for line in lines), run.stdout
    assert "outside the vocabulary" in lines[0] and "sampler chain was closed" in lines[3]


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            {"n_ctx": 2**32 + 64},
            r"context of 4294967360 tokens \(n_batch 512\) is past llama.cpp's 2\^31 - 1",
        ),
        ({"n_ctx": -5}, "n_ctx must be a whole number of at least 1"),
        ({"n_threads": -3}, "threads must be 1 to 512"),
        ({"batch_sequences": 300}, "at most 255 batched sequences"),
    ],
)
def test_engine_sizes_past_what_llama_cpp_holds_are_refused(
    backbone: Backbone, sizes: dict[str, int], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        Engine(backbone.path, tap_layers=None, **sizes)


def test_candidates_share_the_cache_cells_instead_of_running_out(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 candidates of up to 1,024 tokens (the API's bounds) needed ~16,000 cells of 6,144: every candidate was
    lost after minutes ("decode of a batch of sequences failed"). Each now ends at its even part of the cells, as
    `context`; a cache of 40 cells a sequence stands for the real one here (a run to 6,144 cells takes minutes)."""
    with Engine(backbone.path, n_threads=1, tap_layers=None, n_ctx=64, batch_sequences=4) as small:
        tokens = small.tokenize(PROMPT)
        no_end = SamplerSettings(
            logit_bias=tuple(
                (t, float("-inf")) for t in range(small.n_vocab) if small.is_end_of_generation(t)
            )
        )
        monkeypatch.setitem(small._context_shape, "n_ctx", 64 + 4 * 40)
        results = generate_candidates(
            small, tokens, count=4, sampling=no_end, method=lambda: None, max_tokens=64, seed=1
        )
        room = (small.cache_cells - len(tokens)) // 4
        assert room < 64 - len(tokens)
        # `room` tokens evaluated each, and one more drawn (it needs no cell), as `generate` ends (s88)
        assert [len(result.tokens) for result in results] == [room + 1] * 4
        assert {result.stop_reason for result in results} == {"context"}


@pytest.mark.parametrize("batched", [False, True])
def test_a_ctrl_c_a_callback_swallowed_during_a_decode_is_raised_after_it(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """Without the compiled tap extension the taps are a Python callback, where nearly every Ctrl-C of a decode
    lands; ctypes swallows it and ggml stops the graph: the command said "layer tap l_out-14 produced nothing; is
    this a supported architecture?" (exit 1), or returned stale logits. Stands for it: a stop noted during the
    decode, as the handler notes one before raising it in the callback."""
    from localpers import interrupts

    real = llama_cpp.llama_decode

    def decode_with_a_swallowed_ctrl_c(*args: Any) -> Any:
        interrupts.note()
        return real(*args)

    with Engine(backbone.path, n_threads=1, tap_layers=None, batch_sequences=1) as small:
        tokens = small.tokenize(PROMPT)
        small.prefill(tokens)
        try:
            with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
                patched.setattr(llama_cpp, "llama_decode", decode_with_a_swallowed_ctrl_c)
                if batched:
                    small.branch_sequence(1, len(tokens))
                    small.eval_sequences([tokens[-1]], [len(tokens)], [1], all_outputs=False)
                else:
                    small.step(tokens[-1])
        finally:
            interrupts.take_pending()  # never left for a later test
        assert small.n_past == len(tokens)  # the interrupted step's cell was dropped
