"""Engine behaviour on the real embedded backbone: taps, adapters, scoring, chat prompts and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localpers.engine import Engine
from localpers.engine.adapters import random_lora
from localpers.engine.backbone import Backbone
from localpers.engine.generation import generate
from localpers.engine.token_embeddings import TokenEmbeddings
from localpers.errors import LocalpersError
from localpers.tasks import get_task

PROMPT = get_task("headline").prompt_for(
    "Generate a headline for the following article: The city council voted on Tuesday to turn an empty"
    " parking lot downtown into a public park with a playground and a community garden."
)


@pytest.fixture(scope="module")
def engine(backbone: Backbone) -> Engine:
    with Engine(backbone.path) as shared:
        yield shared


@pytest.fixture(scope="module")
def plain_engine(backbone: Backbone) -> Engine:
    with Engine(backbone.path, tap_layers=None) as shared:
        yield shared


@pytest.fixture(scope="module")
def adapter_file(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_lora(backbone.path, tmp_path_factory.mktemp("lora") / "random.gguf", rank=4, std=0.05)


def test_default_taps_are_the_last_four_layers_with_model_width(engine: Engine) -> None:
    assert engine.tap_layers == (14, 15, 16, 17)
    assert engine.tap_names == ("l_out-14", "l_out-15", "l_out-16", "l_out-17")
    step = engine.prefill(engine.tokenize(PROMPT))
    assert step.logits.shape == (engine.n_vocab,)
    assert step.features is not None and step.features.shape == (4, engine.n_embd)
    assert np.all(np.isfinite(step.features))
    # Each layer writes something different into the residual stream.
    assert not np.allclose(step.features[0], step.features[3])


def test_last_tap_is_the_state_the_logits_are_computed_from(engine: Engine, backbone: Backbone) -> None:
    """Final norm + tied embeddings applied to the l_out-17 tap reproduce the logits of that position."""
    step = engine.prefill(engine.tokenize(PROMPT))
    hidden = step.features[-1].astype(np.float64)
    normed = hidden / np.sqrt(np.mean(hidden**2) + 1e-6)
    top = np.argsort(-step.logits)[:200]
    embeddings = TokenEmbeddings(backbone.path).rows(top).astype(np.float64)
    # The final norm's per-channel weight is unknown here, so compare by correlation across tokens:
    # fit the weight by least squares on these 200 tokens and check the fit explains the logits.
    weights, *_ = np.linalg.lstsq(embeddings * normed, step.logits[top].astype(np.float64), rcond=None)
    predicted = (embeddings * normed) @ weights
    assert np.corrcoef(predicted, step.logits[top])[0, 1] > 0.9


def test_custom_tap_layers(backbone: Backbone) -> None:
    with Engine(backbone.path, tap_layers=(0, 5, -1)) as custom:
        assert custom.tap_names == ("l_out-0", "l_out-5", "l_out-17")
        step = custom.prefill(custom.tokenize("Hello there"))
        assert step.features.shape == (3, custom.n_embd)


def test_logits_with_taps_equal_logits_without(engine: Engine, plain_engine: Engine) -> None:
    tokens = engine.tokenize(PROMPT)
    tapped = engine.prefill(tokens)
    plain = plain_engine.prefill(tokens)
    assert plain.features is None
    np.testing.assert_array_equal(tapped.logits, plain.logits)
    next_token = int(np.argmax(plain.logits))
    np.testing.assert_array_equal(engine.step(next_token).logits, plain_engine.step(next_token).logits)


def test_adapter_switch_changes_logits_and_switching_back_restores_them(
    engine: Engine, adapter_file: Path
) -> None:
    tokens = engine.tokenize(PROMPT)
    engine.set_adapter(None)
    base = engine.prefill(tokens).logits
    name = engine.load_adapter(adapter_file, "random") if "random" not in engine.adapters else "random"
    engine.set_adapter(name)
    adapted = engine.prefill(tokens).logits
    assert np.abs(adapted - base).max() > 0.1
    engine.set_adapter(None)
    np.testing.assert_array_equal(engine.prefill(tokens).logits, base)
    engine.set_adapter(name)
    np.testing.assert_array_equal(engine.prefill(tokens).logits, adapted)
    engine.set_adapter(None)


def test_adapter_scale_moves_the_logits_further_from_the_backbone_as_it_grows(
    engine: Engine, adapter_file: Path
) -> None:
    """`set_adapter(name, scale)` applies the update at `scale`: 0 is the backbone (scripts/adapter_scale.py)."""
    tokens = engine.tokenize(PROMPT)
    name = engine.load_adapter(adapter_file, "random") if "random" not in engine.adapters else "random"
    engine.set_adapter(None)
    base = engine.prefill(tokens).logits
    distances = {}
    for scale in (0.0, 0.5, 1.0, 2.0):
        engine.set_adapter(name, scale)
        # a new scale is a new model: the cache is cleared
        assert engine.active_scale == scale and engine.n_past == 0
        distances[scale] = float(np.abs(engine.prefill(tokens).logits - base).mean())
    assert distances[0.0] < 1e-3  # scale 0 is the backbone, up to the added zeros' rounding
    assert distances[0.0] < distances[0.5] < distances[1.0] < distances[2.0]
    engine.set_adapter(None)


def test_adapter_switch_clears_the_kv_cache(engine: Engine, adapter_file: Path) -> None:
    name = engine.load_adapter(adapter_file, "random") if "random" not in engine.adapters else "random"
    engine.prefill(engine.tokenize(PROMPT))
    assert engine.n_past > 0
    engine.set_adapter(name)
    assert engine.n_past == 0
    engine.set_adapter(None)


def test_teacher_forced_logprobs_match_greedy_generation(engine: Engine) -> None:
    prompt_tokens = engine.tokenize(PROMPT)
    result = generate(engine, prompt_tokens, max_tokens=12)
    assert len(result.tokens) >= 3
    seen_logprobs = []
    step = engine.prefill(prompt_tokens)
    for token in result.tokens:
        logits = step.logits.astype(np.float64)
        seen_logprobs.append(logits[token] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
        assert token == int(np.argmax(step.logits))
        step = engine.step(token)
    (scored,) = engine.score(prompt_tokens, [result.tokens], keep_logits=True)
    # A batch and single-token steps use different matmul paths in llama.cpp: close, not bit-identical.
    # `python scripts/measure_batch_noise.py` over 336 tokens: max |gap| 0.098 nats with CPU_REPACK weights,
    # 0.113 with plain buffers (p99 0.07 / 0.05); 0.048 was seen on an AMX Xeon with plain buffers. 0.15 is
    # 1.3x the largest measured gap; a stale cache or a shifted position moves log-probs by nats.
    np.testing.assert_allclose(scored.logprobs, seen_logprobs, atol=0.15)
    assert list(np.argmax(scored.logits, axis=1)) == result.tokens
    assert scored.features.shape == (len(result.tokens), 4, engine.n_embd)


def test_scoring_reuses_the_prompt_for_several_continuations(engine: Engine) -> None:
    prompt_tokens = engine.tokenize(PROMPT)
    first = engine.tokenize(" City turns parking lot into park", add_bos=False)
    second = engine.tokenize(" New park downtown", add_bos=False)
    together = engine.score(prompt_tokens, [first, second])
    alone = engine.score(prompt_tokens, [second])
    np.testing.assert_allclose(together[1].logprobs, alone[0].logprobs, atol=1e-4)
    np.testing.assert_allclose(together[1].features, alone[0].features, rtol=1e-3, atol=1e-2)


def test_stop_string_ends_generation_without_streaming_it(engine: Engine) -> None:
    pieces: list[str] = []
    result = generate(
        engine, "One, two, three, four, five,", max_tokens=20, stop=[","], on_text=pieces.append
    )
    assert result.stop_reason == "stop"
    assert "," not in "".join(pieces)
    assert "".join(pieces) == result.text


def test_a_stop_that_is_not_whitespace_ends_even_a_reply_it_opens() -> None:
    """Stops were looked for after the text's leading whitespace only, so a chat reply opening with the next turn
    ("\n\nUser: ...") ran on and returned the invented turn; a one-line task's "\n" still skips a leading one."""
    from localpers.engine.generation import _StopScanner
    from localpers.methods.card.prompting import transcript_stops

    turns = _StopScanner(transcript_stops([("user", "Hello"), ("assistant", ""), ("user", "Still there?")]))
    assert turns.find_stop("\n\nUser: what?") == 0
    assert turns.find_stop("Yes.\nAssistant: no") == 4
    assert _StopScanner(("\n",)).find_stop("\nA headline\nmore") == 11
    assert _StopScanner(("\n",)).find_stop("\n\n") is None


def test_special_tokenization_parses_control_tokens_and_plain_does_not(engine: Engine) -> None:
    text = "<start_of_turn>user\nWrite a headline.<end_of_turn>\n<start_of_turn>model\n"
    special = engine.tokenize(text, add_bos=False, special=True)
    plain = engine.tokenize(text, add_bos=False)
    assert len(special) < len(plain)
    assert engine.detokenize(plain) == text  # user text is never turned into control tokens


def test_chat_prompt_of_a_model_without_a_template_is_a_clear_error(engine: Engine) -> None:
    assert not engine.has_chat_template  # the embedded Gemma 3 270M is the pretrained model
    with pytest.raises(LocalpersError, match="no chat template"):
        engine.chat_prompt([("user", "Hello")])


def test_tokenize_round_trip_and_bos(engine: Engine) -> None:
    text = "Héllo wörld: a headline!"
    tokens = engine.tokenize(text)
    assert tokens[0] == engine.bos_token
    assert engine.tokenize(text, add_bos=False) == tokens[1:]
    assert engine.detokenize(tokens) == text


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalpersError, match="does not exist"):
        Engine(tmp_path / "nope.gguf")


def test_non_gguf_file_is_refused_before_llama_cpp(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model at all" * 100)
    with pytest.raises(LocalpersError, match="not a GGUF file"):
        Engine(bogus)


def test_truncated_gguf_is_a_clear_error(tmp_path: Path, backbone: Backbone) -> None:
    truncated = tmp_path / "truncated.gguf"
    with backbone.path.open("rb") as source:
        truncated.write_bytes(source.read(3_000_000))
    with pytest.raises(LocalpersError, match="could not load"):
        Engine(truncated)


def test_corrupt_adapter_is_a_clear_error(engine: Engine, tmp_path: Path) -> None:
    bogus = tmp_path / "adapter.gguf"
    bogus.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(LocalpersError, match="refused adapter"):
        engine.load_adapter(bogus)


def test_prefilling_the_same_prompt_again_reuses_the_cache(engine) -> None:
    """The prompt memo: same step as a fresh prefill, after generation or scoring beyond the prompt."""
    prompt = engine.tokenize("Generate a headline for the following article: The bridge reopened today.")
    fresh = engine.prefill(prompt)
    engine.eval(engine.tokenize(" Bridge", add_bos=False))  # the cache now runs past the prompt
    again = engine.prefill(prompt)
    assert engine.n_past == len(prompt)
    np.testing.assert_array_equal(again.logits, fresh.logits)
    continuation = engine.tokenize(" Bridge Reopens", add_bos=False)
    memo_scored = engine.score(prompt, [continuation])[0]
    engine.reset()
    fresh_scored = engine.score(prompt, [continuation])[0]
    np.testing.assert_allclose(memo_scored.logprobs, fresh_scored.logprobs, atol=1e-5)
    engine.truncate(2)  # truncating into the prompt forgets it
    assert engine._prompt_memo is None


def test_a_shared_prefix_stays_in_the_cache_and_gives_the_numbers_of_a_cold_prefill(engine: Engine) -> None:
    examples = (
        "Headlines this author wrote before:\n- Parks Win Big Downtown\n- Council Votes Yes On Green Space"
    )
    first = engine.tokenize(examples + "\n\n" + PROMPT)
    second = engine.tokenize(examples + "\n- Another Closer Example\n\n" + PROMPT)
    shared = len(engine.tokenize(examples))
    assert first[:shared] == second[:shared]
    engine.reset()
    cold = engine.prefill(second, shared=shared)
    engine.prefill(first, shared=shared)
    assert engine.n_past == len(first)
    warm = engine.prefill(second, shared=shared)  # only the tokens after the shared prefix are evaluated
    np.testing.assert_array_equal(warm.logits, cold.logits)
    np.testing.assert_array_equal(warm.features, cold.features)
    # a different prefix of the same length is not mistaken for the cached one
    other = engine.tokenize(examples.replace("Parks", "Lakes") + "\n\n" + PROMPT)
    engine.reset()
    expected = engine.prefill(other, shared=shared).logits
    engine.prefill(second, shared=shared)
    np.testing.assert_array_equal(engine.prefill(other, shared=shared).logits, expected)
    # truncating into the prefix forgets it
    engine.prefill(first, shared=shared)
    engine.truncate(shared - 1)
    np.testing.assert_array_equal(engine.prefill(second, shared=shared).logits, cold.logits)


def test_a_shared_prefix_comes_back_after_an_adapter_switch_with_the_same_numbers(
    engine: Engine, adapter_file: Path
) -> None:
    name = engine.load_adapter(adapter_file, "random") if "random" not in engine.adapters else "random"
    examples = (
        "Headlines this author wrote before:\n- Parks Win Big Downtown\n- Council Votes Yes On Green Space"
    )
    prompt = engine.tokenize(examples + "\n- Closer\n\n" + PROMPT)
    shared = len(engine.tokenize(examples))
    engine.prefix_snapshots.clear()
    engine.set_adapter(name)
    cold = engine.prefill(prompt, shared=shared).logits.copy()
    assert len(engine.prefix_snapshots) == 1
    engine.set_adapter(None)  # clears the cache
    plain = engine.prefill(prompt, shared=shared).logits.copy()  # another adapter: its own snapshot
    assert len(engine.prefix_snapshots) == 2 and not np.array_equal(plain, cold)
    engine.set_adapter(name)
    assert engine.n_past == 0
    np.testing.assert_array_equal(engine.prefill(prompt, shared=shared).logits, cold)
    engine.set_adapter(None)
    np.testing.assert_array_equal(engine.prefill(prompt, shared=shared).logits, plain)
    engine.prefix_snapshots.clear()


def test_a_shared_prefix_kept_in_a_folder_comes_back_in_a_new_engine_with_the_same_numbers(
    backbone: Backbone, adapter_file: Path, tmp_path: Path
) -> None:
    """A one-shot `localpers rewrite` is a new process: the examples block comes from the user's folder,
    the very bytes the evaluation produced; a damaged file is evaluated again and replaced."""
    examples = (
        "Headlines this author wrote before:\n- Parks Win Big Downtown\n- Council Votes Yes On Green Space"
    )
    first = Engine(backbone.path, n_threads=2, tap_layers=())
    prompt = first.tokenize(examples + "\n- Closer\n\n" + PROMPT)
    shared = len(first.tokenize(examples))
    first.load_adapter(adapter_file, "random")
    first.set_adapter("random")
    with first.prefixes_kept_in(tmp_path):
        cold = first.prefill(prompt, shared=shared).logits.copy()
    first.close()
    (stored,) = tmp_path.glob("prefix-*.kv")

    second = Engine(backbone.path, n_threads=2, tap_layers=())
    second.load_adapter(adapter_file, "random")
    evaluated: list[int] = []
    real_eval = second.eval
    second.eval = lambda tokens, **kw: (evaluated.append(len(tokens)), real_eval(tokens, **kw))[1]
    second.set_adapter("random")
    with second.prefixes_kept_in(tmp_path):
        np.testing.assert_array_equal(second.prefill(prompt, shared=shared).logits, cold)
    assert evaluated == [len(prompt) - shared]  # the block was restored, not evaluated
    second.set_adapter(None)  # another adapter: its own file, other numbers
    with second.prefixes_kept_in(tmp_path):
        plain = second.prefill(prompt, shared=shared).logits
    assert not np.array_equal(plain, cold) and len(list(tmp_path.glob("prefix-*.kv"))) == 2

    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    second.prefix_snapshots.clear()
    second.set_adapter("random")
    evaluated.clear()
    with second.prefixes_kept_in(tmp_path):
        np.testing.assert_array_equal(second.prefill(prompt, shared=shared).logits, cold)
    assert evaluated == [shared, len(prompt) - shared]  # damaged: evaluated again ...
    second.prefix_snapshots.clear()
    second.reset()
    evaluated.clear()
    with second.prefixes_kept_in(tmp_path):
        np.testing.assert_array_equal(second.prefill(prompt, shared=shared).logits, cold)
    assert evaluated == [len(prompt) - shared]  # ... and written whole again
    second.prefix_snapshots.clear()
    second.reset()
    evaluated.clear()
    second.prefill(prompt, shared=shared)  # outside `prefixes_kept_in`: memory only, the folder is not read
    assert evaluated == [shared, len(prompt) - shared]
    second.close()


def test_a_folder_given_as_the_backbone_is_named_as_one(tmp_path: Path) -> None:
    from localpers.engine.backbone import resolve_backbone

    with pytest.raises(
        LocalpersError, match=r"backbone .* \(from argument\) is not a file; give a GGUF file path"
    ):
        resolve_backbone(tmp_path)
    with pytest.raises(LocalpersError, match=r"\(from argument\) does not exist; give a GGUF file path"):
        resolve_backbone(tmp_path / "nope.gguf")


def test_looking_for_settings_makes_no_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the config file's model (every command that opens a backbone, `publish` too), the trusted publishers
    and `doctor` made an empty ~/.config/localpers on a machine that had never written a setting."""
    import json

    from typer.testing import CliRunner

    from localpers.bundle.trust import trusted_fingerprints
    from localpers.cli import app
    from localpers.engine.backbone import configured_model_path
    from localpers.paths import config_dir

    monkeypatch.setenv("LOCALPERS_HOME", str(tmp_path / "home"))
    assert configured_model_path() is None and trusted_fingerprints() == []
    report = CliRunner().invoke(app, ["doctor", "--json"])
    assert json.loads(report.stdout)["dirs"]["config"] == str(config_dir(create=False))
    assert not config_dir(create=False).exists()
    assert config_dir().is_dir()  # made where something is to be written


def test_the_config_files_model_is_read_only_when_nothing_before_it_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.engine.backbone import resolve_backbone
    from localpers.paths import config_dir

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    config = config_dir() / "config.json"
    config.write_text("{broken")
    assert resolve_backbone(gguf).path == gguf  # --model wins without reading the broken file
    monkeypatch.setenv("LOCALPERS_MODEL", str(gguf))
    assert resolve_backbone().source == "environment"
    monkeypatch.setenv("LOCALPERS_MODEL", "  ")  # blank: unset, so the config file decides
    with pytest.raises(LocalpersError, match="config.json: not valid JSON"):
        resolve_backbone()
    config.write_text('["m.gguf"]')
    with pytest.raises(LocalpersError, match="config.json: not a JSON object"):
        resolve_backbone()
    config.write_text('{"model": 5}')
    with pytest.raises(LocalpersError, match='"model" must be a GGUF file path in quotes, not 5'):
        resolve_backbone()
    (config_dir() / "here.gguf").write_bytes(b"GGUF" + bytes(60))
    config.write_text('{"model": "here.gguf"}')  # relative: from the config folder, wherever the command runs
    monkeypatch.chdir(tmp_path)
    assert resolve_backbone().path == config_dir() / "here.gguf"
    config.write_text('{"model": "gone.gguf"}')
    with pytest.raises(
        LocalpersError,
        match=r"gone.gguf \(from .*config.json\) does not exist; give a GGUF file path; a relative path there is"
        r" read from the config folder$",
    ):
        resolve_backbone()


def test_prefix_files_keep_the_newest_few_and_read_damage_as_absent(tmp_path: Path) -> None:
    import os

    from localpers.engine.prefix_files import MAX_FILES, PrefixStateFiles

    files = PrefixStateFiles(tmp_path, "engine-a")
    entries = [files.entry_for(None, 1.0, [1, 2, block]) for block in range(MAX_FILES + 2)]
    paths = [entry.path for entry in entries]
    assert len(set(paths)) == len(paths)
    assert PrefixStateFiles(tmp_path, "engine-b").entry_for(None, 1.0, [1, 2, 0]).path != paths[0]
    assert files.entry_for(["lora.gguf", 10, 1], 1.0, [1, 2, 0]).path != paths[0]
    assert files.entry_for(None, 0.5, [1, 2, 0]).path != paths[0]
    for age, entry in enumerate(entries):
        files.write(entry, bytes([age]) * 100)
        os.utime(entry.path, ns=(age * 10**9, age * 10**9))
    assert sorted(tmp_path.glob("prefix-*.kv")) == sorted(paths[-MAX_FILES:])
    assert files.read(entries[-1]) == bytes([MAX_FILES + 1]) * 100
    assert files.read(entries[0]) is None  # evicted
    # another key's file copied under this name (another adapter's block): not this key's state
    paths[-3].write_bytes(paths[-4].read_bytes())
    assert files.read(entries[-3]) is None and files.read(entries[-4]) is not None
    paths[-1].write_bytes(paths[-1].read_bytes()[:-1])  # cut short
    assert files.read(entries[-1]) is None
    paths[-2].write_bytes(b"LPKV1\n" + paths[-2].read_bytes()[6:])  # another version
    assert files.read(entries[-2]) is None
    gone = PrefixStateFiles(tmp_path / "deleted-user", "engine-a")
    gone.write(
        gone.entry_for(None, 1.0, [1]), b"x" * 10
    )  # the user's folder is gone: nothing written, no error
    assert not (tmp_path / "deleted-user").exists()


def test_prefix_files_read_only_regular_files_and_evict_past_links_and_folders(tmp_path: Path) -> None:
    """A FIFO would block the rewrite for ever and /dev/zero would fill the memory; a link is never
    followed (another user's file), and a dangling one or a folder of that name does not stop eviction."""
    import os

    from localpers.engine.prefix_files import MAX_FILES, PrefixStateFiles

    files = PrefixStateFiles(tmp_path, "engine")
    fifo, device, elsewhere, folder = (files.entry_for(None, 1.0, [n]) for n in range(4))
    os.mkfifo(fifo.path)
    device.path.symlink_to("/dev/zero")
    outside = tmp_path / "outside"
    outside.mkdir()
    others = PrefixStateFiles(outside, "engine")  # another user's folder: the same key, a valid file
    others.write(others.entry_for(None, 1.0, [2]), b"state")
    assert others.read(others.entry_for(None, 1.0, [2])) == b"state"
    elsewhere.path.symlink_to(outside / elsewhere.path.name)
    folder.path.mkdir()
    assert [files.read(entry) for entry in (fifo, device, elsewhere, folder)] == [None] * 4
    (tmp_path / "prefix-dangling.kv").symlink_to(tmp_path / "nowhere")
    for block in range(10, 10 + MAX_FILES + 2):
        files.write(files.entry_for(None, 1.0, [block]), b"state")
    regular = [p for p in tmp_path.glob("prefix-*.kv") if p.is_file() and not p.is_symlink()]
    links = [p for p in tmp_path.glob("prefix-*.kv") if p.is_symlink()]
    assert len(regular) + len(links) <= MAX_FILES and folder.path.is_dir()
    files.write(
        elsewhere, b"mine"
    )  # the link itself is replaced by the user's own file, the target untouched
    assert files.read(elsewhere) == b"mine" and not elsewhere.path.is_symlink()
    assert (outside / elsewhere.path.name).read_bytes().endswith(b"state")


@pytest.mark.parametrize(
    ("value", "wanted"), [("", False), ("0", False), ("false", False), (" Off ", False), ("1", True)]
)
def test_llama_log_is_on_only_for_a_value_that_means_yes(
    monkeypatch: pytest.MonkeyPatch, value: str, wanted: bool
) -> None:
    from localpers.engine.backend import llama_log_wanted

    monkeypatch.setenv("LOCALPERS_LLAMA_LOG", value)
    assert llama_log_wanted() is wanted


def test_a_stop_raised_after_llama_decode_returned_leaves_the_cache_as_n_past_says(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C during llama_decode is raised when the call returns, with the batch already in the cache: n_past
    did not count it, so the next prefill of the same prompt (a memo hit) collided with that cell every time."""
    from localpers.engine.llama import llama_cpp

    prompt = engine.tokenize(PROMPT)
    engine.prefill(prompt)
    clean = engine.step(506).logits.copy()
    real_decode = llama_cpp.llama_decode
    armed = [True]

    def decode_then_stop(context, batch):  # noqa: ANN001, ANN202
        result = real_decode(context, batch)
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return result

    engine.prefill(prompt)
    monkeypatch.setattr(llama_cpp, "llama_decode", decode_then_stop)
    with pytest.raises(KeyboardInterrupt):
        engine.step(506)
    assert engine.n_past == len(prompt)
    engine.prefill(prompt)
    np.testing.assert_array_equal(engine.step(506).logits, clean)


def test_logit_views_over_several_batches_keep_every_row(backbone: Backbone) -> None:
    """`copy_logits=False` gave views of the first batches' rows, which the next batch overwrote."""
    with Engine(backbone.path, tap_layers=None, n_batch=8) as small:
        tokens = small.tokenize(PROMPT)[:18]
        copied, _ = small.eval(tokens, all_positions=True)
        small.reset()
        viewed, _ = small.eval(tokens, all_positions=True, copy_logits=False)
        np.testing.assert_array_equal(viewed, copied)


def test_kept_prefixes_name_the_adapter_file_as_it_was_loaded(backbone: Backbone, tmp_path: Path) -> None:
    """An adapter file replaced after it was loaded: the old weights' state was kept under the new file's key,
    and an engine that loaded the new file restored it."""
    import os

    adapter = random_lora(backbone.path, tmp_path / "user.gguf", rank=4, std=0.05, seed=1)
    kept = tmp_path / "kept"
    kept.mkdir()
    with Engine(backbone.path, tap_layers=None) as first:
        tokens = first.tokenize("Headlines this author wrote before:\n- One\n- Two\n- Three\n\nHeadline:")
        first.set_adapter(first.load_adapter(adapter, "user"))
        replacement = random_lora(backbone.path, tmp_path / "new.gguf", rank=4, std=0.05, seed=2)
        os.replace(replacement, adapter)
        with first.prefixes_kept_in(kept):
            first.prefill(tokens, shared=12)
    with Engine(backbone.path, tap_layers=None) as second:
        second.set_adapter(second.load_adapter(adapter, "user"))
        cold = second.prefill(tokens, shared=12).logits.copy()
        second.reset()
        second.prefix_snapshots.clear()
        with second.prefixes_kept_in(kept):
            warm = second.prefill(tokens, shared=12).logits
    np.testing.assert_array_equal(warm, cold)


def test_a_closed_engine_refuses_use_in_one_line(backbone: Backbone) -> None:
    """A closed engine's freed handles aborted the process (std::out_of_range) on the next tokenize."""
    closed = Engine(backbone.path, tap_layers=None)
    closed.close()
    for use in (
        lambda: closed.tokenize("hello"),
        lambda: closed.prefill([2, 9259]),
        lambda: closed.has_chat_template,
        lambda: closed.reset(),
        # these filled the freed llama_batch before any handle was checked (a bus error under MALLOC_PERTURB_)
        lambda: closed.step(2),
        lambda: closed.eval([2, 9259]),
        lambda: closed.eval_sequences([2], [0], [1], all_outputs=False),
    ):
        with pytest.raises(LocalpersError, match="was closed"):
            use()
    closed.close()  # still safe twice


def test_a_callers_bad_token_lists_are_refused_in_one_line(engine: Engine) -> None:
    """An id past the vocabulary in a continuation was an IndexError, empty forced tokens a zip() error."""
    from localpers.engine.generation import score_forced

    prompt = engine.tokenize(PROMPT)
    for use, message in (
        (lambda: engine.eval([]), "no token given"),
        (lambda: engine.score(prompt, [[506, engine.n_vocab]]), f"token id {engine.n_vocab} is outside"),
        (lambda: engine.score(prompt, [[]]), "no token given"),
        (lambda: score_forced(engine, prompt, [], [None]), "no token given"),
        (lambda: score_forced(engine, prompt, [-1], [None]), "token id -1 is outside"),
    ):
        with pytest.raises(ValueError, match=message):
            use()
    assert engine.score(prompt, [[506]])[0].tokens == [506]  # still usable
