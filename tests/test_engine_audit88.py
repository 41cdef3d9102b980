"""The engine's third audit (eighty-eighth session): each test is a case that failed before.

A model or adapter file whose name is not UTF-8 (legal on Linux) ended every command in a traceback; a folder or an
unreadable file given as a GGUF was "does not exist" or an OSError; out-of-range tap layers wrapped silently; a
token that is not an integer, an empty continuation and `logprob_rows=0` failed deep inside numpy or ctypes; an
engine made with a small `n_batch` refused the batched jobs `fits` accepted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from localpers.engine import Engine
from localpers.engine.adapters import random_lora
from localpers.engine.backbone import Backbone, resolve_backbone
from localpers.engine.batch import PromptJob, fits, run_jobs
from localpers.engine.gguf_layout import check_gguf_file
from localpers.errors import InputError, LocalpersError


@pytest.fixture(scope="module")
def engine(backbone: Backbone) -> Engine:
    with Engine(backbone.path, n_ctx=256, tap_layers=None, n_batch=64, batch_sequences=2) as shared:
        yield shared


@pytest.mark.skipif(sys.platform != "linux", reason="a file name of any bytes is a Linux file system's")
def test_a_model_and_an_adapter_whose_names_are_not_utf8_load(
    backbone: Backbone, engine: Engine, tmp_path: Path
) -> None:
    folder = os.fsencode(tmp_path)
    model = folder + b"/caf\xe9.gguf"
    os.symlink(os.fsencode(backbone.path), model)
    adapter = folder + b"/adapt\xe9.gguf"
    random_lora(backbone.path, tmp_path / "lora.gguf", rank=2, std=0.01)
    os.symlink(os.fsencode(tmp_path / "lora.gguf"), adapter)
    assert resolve_backbone(os.fsdecode(model)).sha256 == backbone.sha256
    with Engine(os.fsdecode(model), n_ctx=32, tap_layers=None) as odd:
        assert odd.load_adapter(os.fsdecode(adapter), "odd") == "odd"


def test_a_folder_or_an_unreadable_file_as_a_gguf_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"model file .* is not a regular file"):
        check_gguf_file(tmp_path)
    with pytest.raises(InputError, match=r"does not exist"):
        check_gguf_file(tmp_path / "nothere.gguf")
    if Path(
        "/proc/self/mem"
    ).is_file():  # reading its first bytes fails (EIO): an unreadable file, even as root
        with pytest.raises(InputError, match=r"adapter file /proc/self/mem cannot be read"):
            check_gguf_file(Path("/proc/self/mem"), what="adapter")


def test_a_tap_layer_the_model_lacks_is_refused(backbone: Backbone, engine: Engine) -> None:
    for layer in (engine.n_layer, -engine.n_layer - 1):
        with pytest.raises(
            LocalpersError, match=rf"tap layer {layer} does not exist: .* has {engine.n_layer} layers"
        ):
            Engine(backbone.path, n_ctx=32, tap_layers=(layer,))


@pytest.mark.parametrize("token", [1.5, True, "7", None])
def test_a_token_that_is_not_an_integer_is_refused_in_one_line(engine: Engine, token: object) -> None:
    engine.reset()
    with pytest.raises(ValueError, match="is not a token id"):
        engine.eval([2, token])  # type: ignore[list-item]
    assert engine.n_past == 0


def test_scoring_refuses_empty_continuations_and_no_rows(engine: Engine) -> None:
    prompt = engine.tokenize("Write a headline: the town hall gets solar panels.")
    with pytest.raises(ValueError, match="logprob_rows must be at least 1"):
        engine.score(prompt, [[100, 200]], logprob_rows=0)
    job = PromptJob(prompt=prompt, generate=False, continuations=lambda text: [[]])
    with pytest.raises(ValueError, match="a continuation: no token given"):
        run_jobs(engine, [job], max_tokens=4)
    scored = PromptJob(prompt=prompt, generate=False, continuations=lambda text: [[100, 200]])
    with pytest.raises(ValueError, match="logprob_rows must be at least 1"):
        run_jobs(engine, [scored], max_tokens=4, logprob_rows=0)


def test_an_engine_with_a_small_batch_runs_the_jobs_fits_accepts(engine: Engine) -> None:
    prompt = engine.tokenize(" ".join(["word"] * 150))
    assert len(prompt) > engine.batch_capacity == 64
    job = PromptJob(prompt=prompt, generate=True, continuations=lambda text: [[100, 200, 300]])
    assert fits(job, 4, 3)
    (outcome,) = run_jobs(engine, [job], max_tokens=4, logprob_rows=3)
    assert len(outcome.scored) == 1 and outcome.scored[0].logprobs.shape == (3,)
