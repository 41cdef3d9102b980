"""What the engine refuses before llama.cpp could abort the process or misbehave (engine audit, eighty-fourth
session): a grammar and a logit bias that rule out every token (llama.cpp's grammar threw across its C API:
SIGABRT), a grammar nested deep enough to overflow its recursive parser (SIGSEGV), a +inf bias (sampling picked
the last id of the vocabulary), a grammar file that is a FIFO or too large."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fifo_helpers import fed_fifo
from typer.testing import CliRunner

from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.engine.decoding import MAX_GRAMMAR_CHARACTERS, MAX_GRAMMAR_NESTING, SamplerSettings
from localpers.errors import LocalpersError

EVERY_TOKEN_RULED_OUT = """
import sys
from localpers.engine import Engine
from localpers.engine.decoding import SamplerSettings
from localpers.engine.generation import generate
from localpers.errors import LocalpersError

engine = Engine(sys.argv[1], n_threads=1, tap_layers=None)
ends = tuple((t, float("-inf")) for t in range(engine.n_vocab) if engine.is_end_of_generation(t))
for temperature in (0.0, 0.7):  # after "x" the grammar allows only the end, which the bias bans
    settings = SamplerSettings(grammar='root ::= "x"', logit_bias=ends, temperature=temperature, seed=3)
    try:
        generate(engine, "The quick brown fox", max_tokens=4, sampling=settings)
    except LocalpersError as exc:
        print(exc.exit_code, exc)
"""


def test_a_grammar_and_bans_that_rule_out_every_token_are_a_one_line_error(
    backbone: Backbone, tmp_path: Path
) -> None:
    environment = {**os.environ, "LOCALPERS_HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", EVERY_TOKEN_RULED_OUT, str(backbone.path)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]  # not -6 (SIGABRT)
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("2 no token is allowed") for line in lines), run.stdout


def test_a_grammar_nested_too_deep_or_too_long_and_an_infinite_bias_are_refused() -> None:
    nested = "root ::= " + "(" * (MAX_GRAMMAR_NESTING + 1) + '"x"' + ")" * (MAX_GRAMMAR_NESTING + 1)
    with pytest.raises(LocalpersError, match="nests 257 levels") as refused:
        SamplerSettings(grammar=nested).validated()
    assert refused.value.exit_code == 2
    SamplerSettings(grammar="root ::= " + "(" * 50 + '"x"' + ")" * 50).validated()  # deep enough to be usable
    with pytest.raises(LocalpersError, match="characters, more than"):
        SamplerSettings(grammar='root ::= "' + "x" * MAX_GRAMMAR_CHARACTERS + '"').validated()
    for bias in (math.inf, 1e39, -101.0, math.nan):
        with pytest.raises(LocalpersError, match="logit bias"):
            SamplerSettings(logit_bias=((5, bias),)).validated()
    for bias in (-math.inf, -100.0, 100.0, 0.5):
        SamplerSettings(logit_bias=((5, bias),)).validated()


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"top_k": 2.5}, "top_k must be a whole number, got 2.5"),
        ({"penalty_last_n": 1.5}, "penalty_last_n must be a whole number, got 1.5"),
        ({"dry_allowed_length": 2.0}, "dry_allowed_length must be a whole number, got 2.0"),
        ({"seed": True}, "seed must be a whole number, got True"),
        ({"temperature": "0.7"}, "temperature must be a number, got '0.7'"),
        ({"top_p": None}, "top_p must be a number, got None"),
        ({"dry_base": "1.75"}, "dry_base must be a number, got '1.75'"),
        ({"logit_bias": ((5.0, 1.0),)}, r"logit bias \(5.0, 1.0\) is invalid: .*whole-number token id"),
        ({"logit_bias": ((5, "1"),)}, r"logit bias \(5, '1'\) is invalid"),
        ({"logit_bias": (5,)}, "logit bias 5 is invalid: give .token id, bias. pairs"),
        ({"grammar": b'root ::= "x"'}, "the grammar must be GBNF text, got bytes"),
        ({"dry_multiplier": math.inf}, "dry_multiplier must be a finite number >= 0, got inf"),
        ({"dry_multiplier": math.nan}, "dry_multiplier must be a finite number >= 0, got nan"),
        ({"dry_base": 0.5}, "dry_base must be a finite number >= 1, got 0.5"),
        ({"dry_base": math.inf}, "dry_base must be a finite number >= 1, got inf"),
        ({"dry_allowed_length": -1}, "dry_allowed_length must be in"),
    ],
)
def test_a_setting_of_the_wrong_type_or_range_is_one_line_naming_it(settings: dict, refusal: str) -> None:
    """Only ranges were checked (audit90 #5): a float top-k or logit-bias id and a text temperature failed in
    llama.cpp's ctypes or a comparison with a traceback, and DRY's base and allowed length went unchecked."""
    with pytest.raises(LocalpersError, match=refusal) as refused:
        SamplerSettings(**settings).validated()
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)


def test_numbers_of_other_numeric_types_are_taken() -> None:
    import numpy as np

    SamplerSettings(
        temperature=1,
        top_k=np.int64(40),
        top_p=np.float32(0.9),
        seed=np.uint32(7),
        dry_multiplier=0.8,
        dry_base=1.0,
        dry_allowed_length=0,
        logit_bias=((np.int32(5), -1),),
    ).validated()


def test_a_grammar_file_that_is_a_fifo_or_too_large_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "grammar.fifo"
    os.mkfifo(fifo)
    large = tmp_path / "large.gbnf"
    large.write_text('root ::= "' + "x" * (4 * MAX_GRAMMAR_CHARACTERS) + '"', encoding="utf-8")
    for path, problem in ((fifo, "not a regular file"), (large, "262,155 bytes, more than the")):
        result = CliRunner().invoke(app, ["generate", "hi", "--grammar", str(path)])
        assert result.exit_code == 2 and f"cannot read grammar file {path}: {problem}" in result.output, (
            result.output
        )


def test_a_text_of_exactly_the_context_is_not_refused_by_the_window_count(backbone: Backbone) -> None:
    """The count of a long text's windows allowed 2 tokens a cut where a cut can add 3: a text of exactly the
    context's tokens was refused (engine audit)."""
    from localpers.engine import Engine
    from localpers.engine.context_bound import WINDOW_CHARACTERS, tokens_within_context

    engine = Engine(backbone.path, n_threads=1, tap_layers=None)
    try:
        exact = engine.detokenize(engine.tokenize(" ".join(["word"] * 3000))[1 : engine.n_ctx])
        assert len(exact) > WINDOW_CHARACTERS and len(engine.tokenize(exact)) == engine.n_ctx
        assert len(tokens_within_context(engine, exact)) == engine.n_ctx
        # a cut inside " unprecedented" adds 3 tokens (" ", "un", "pre" for " unpre"): each shift of the text moves it
        base = "The committee's unprecedented internationalization strategy " * 400
        for shift in range(60):
            text = base[shift:]
            whole = len(engine.tokenize(text))
            assert len(tokens_within_context(engine, text, limit=whole)) == whole, shift
    finally:
        engine.close()


def test_a_hash_stamp_that_is_a_fifo_is_no_stamp(tmp_path: Path) -> None:
    """`cached_sha256` read the stamp beside a model with read_text: a FIFO there blocked every command that opened
    the backbone (engine audit)."""
    import hashlib

    from localpers.engine.backbone import _stamp_path, cached_sha256

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))

    with fed_fifo(_stamp_path(model), b'{"size": 64, "mtime_ns": 0, "sha256": "wrong"}'):
        assert cached_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()
