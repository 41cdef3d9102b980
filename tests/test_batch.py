"""Prompts side by side in llama.cpp sequences: the same greedy texts and scores as one at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_personalize import SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures

from localpers.engine.batch import GROUP_SIZE, PromptJob, run_jobs
from localpers.engine.generation import generate
from localpers.methods.card import pair_batches
from localpers.methods.card import pairs as pairs_module
from localpers.methods.card.pair_keys import negative_key
from localpers.methods.card.personalizer import Personalizer
from localpers.users.store import UserStore

# Batched and single evaluation differ by float noise: up to ~0.15 nats on likely tokens on the AVX2 CPU
# (docs/PERFORMANCE.md), 0.306 nats at one unlikely token (log p -3.8) on the seventeenth session's AVX-512 CPU, where
# llama.cpp's kernels round differently; features are compared relative to their scale.
LOGPROB_TOLERANCE = 0.4
FEATURE_TOLERANCE = 0.05

PROMPTS = [
    "Generate a headline for the following article: The city opened a new bike lane along the river.\nHeadline:",
    "Generate a headline for the following article: A storm knocked out power.\nHeadline:",
    "Headlines this author wrote before:\n- BIG WIN FOR CITY PARK!!!\n- MAYOR SAYS YES TO BUSES!!!\n\n"
    "Generate a headline for the following article: The school board approved free lunches for all pupils"
    " in the district after a long debate.\nHeadline:",
]


def test_batched_generation_and_scoring_match_one_prompt_at_a_time(personalizer: Personalizer) -> None:  # noqa: F811
    engine = personalizer.engine
    engine.set_adapter("global")
    continuation = engine.tokenize(" FREE LUNCH FOR EVERY KID!!!", add_bos=False)
    jobs = [PromptJob(engine.tokenize(p), True, lambda text: [continuation]) for p in PROMPTS]
    timings = {"negatives": 0.0, "features": 0.0}
    outcomes = run_jobs(engine, jobs, max_tokens=12, stop=["\n"], timings=timings, logprob_rows=3)
    assert timings["negatives"] > 0 and timings["features"] > 0
    same_text = 0
    for prompt, outcome in zip(PROMPTS, outcomes, strict=True):
        single = generate(engine, prompt, max_tokens=12, stop=["\n"]).text.strip()
        same_text += outcome.text == single
        (scored,) = outcome.scored
        (reference,) = engine.score(engine.tokenize(prompt), [continuation], logprob_rows=3)
        assert scored.tokens == reference.tokens and len(scored.logprobs) == 3
        assert np.allclose(scored.logprobs, reference.logprobs, atol=LOGPROB_TOLERANCE)
        assert (
            scored.features.shape
            == reference.features.shape
            == (len(continuation), *reference.features.shape[1:])
        )
        scale = np.abs(reference.features).max()
        assert np.abs(scored.features - reference.features).max() <= FEATURE_TOLERANCE * scale
    # A greedy token can flip where two candidates are within the noise; on these prompts most agree.
    assert same_text >= 2


def test_jobs_without_generation_only_score_and_sequences_are_left_empty(personalizer: Personalizer) -> None:  # noqa: F811
    engine = personalizer.engine
    engine.set_adapter("global")
    before = engine.prefill(engine.tokenize(PROMPTS[0])).logits.copy()
    tokens = engine.tokenize(" HELLO", add_bos=False)
    outcomes = run_jobs(
        engine, [PromptJob(engine.tokenize(PROMPTS[1]), False, lambda text: [tokens, tokens])], max_tokens=8
    )
    assert outcomes[0].text == "" and len(outcomes[0].scored) == 2
    assert np.allclose(outcomes[0].scored[0].features, outcomes[0].scored[1].features, atol=1e-4)
    # the jobs started from an empty cache, and sequence 0's prompt gives the same numbers evaluated again
    assert np.array_equal(engine.prefill(engine.tokenize(PROMPTS[0])).logits, before)
    with pytest.raises(ValueError, match="sequence 0 is not a batched sequence"):
        engine.forget_sequence(0)


def test_a_fit_does_not_depend_on_the_rewrites_before_it(backbone) -> None:
    # Rewrites leave cells of llama.cpp's KV cache in use; the fit's batched jobs once came out different by
    # float noise beside them, so a refit after rewrites (the TUI's, the benchmark's) learned another vector than a fit
    # in a fresh process (a test author's norm 1.97 against 2.08). Each group of jobs now starts from an
    # empty cache. Seen with the demo bundle on a real author, not with the synthetic test bundle.
    from conftest import SHARED_DATA

    from localpers.bundle.format import open_bundle
    from localpers.tasks import get_task
    from localpers.users.history import HistoryItem

    data = SHARED_DATA / "test.jsonl"
    if not data.is_file():
        pytest.skip(f"{data} is absent")
    author = json.loads(data.read_text(encoding="utf-8").splitlines()[1])
    history = [HistoryItem.create("headline", h["input"], h["output"]) for h in author["history"][-20:]]
    demo = Path(__file__).resolve().parents[1] / "models" / "demo-bundle"
    vectors = []
    for rewrites_first in (False, True):
        loaded = Personalizer(open_bundle(demo, backbone_sha256=backbone.sha256), backbone, n_threads=2)
        try:
            user = UserStore().create(f"order-{int(rewrites_first)}")
            user.save_history(history)
            if rewrites_first:
                index = user.history_index(get_task("headline"))
                for query in author["queries"][:3]:
                    loaded.rewrite(query["input"], method="global-history", history=index)
            loaded.fit_user(user)
            vectors.append(user.vector())
        finally:
            loaded.close()
    assert np.array_equal(vectors[0], vectors[1])


def test_a_round_of_continuations_longer_than_one_decode_is_scored_in_parts(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    engine = personalizer.engine
    engine.set_adapter("global")
    size = min(engine.batch_sequences, GROUP_SIZE)
    words = " ".join(["council budget vote delayed again"] * 40)
    continuation = engine.tokenize(" " + words, add_bos=False)
    # every job's continuation is long enough that the round's total is beyond one llama_decode
    length = engine.batch_capacity // (size - 1) + 2
    continuation = continuation[:length]
    assert size * (len(continuation) - 1) > engine.batch_capacity
    prompts = [PROMPTS[index % 2] for index in range(size)]
    jobs = [PromptJob(engine.tokenize(p), False, lambda text: [continuation]) for p in prompts]
    outcomes = run_jobs(engine, jobs, max_tokens=8, logprob_rows=2)
    assert len(outcomes) == size
    for prompt, outcome in zip(prompts[:2], outcomes[-2:], strict=True):
        (scored,) = outcome.scored
        (reference,) = engine.score(engine.tokenize(prompt), [continuation], logprob_rows=2)
        assert np.allclose(scored.logprobs, reference.logprobs, atol=LOGPROB_TOLERANCE)
        scale = np.abs(reference.features).max()
        assert scored.features.shape == reference.features.shape
        assert np.abs(scored.features - reference.features).max() <= FEATURE_TOLERANCE * scale


def test_a_fit_through_the_batched_pair_pass_caches_every_negative(
    personalizer: Personalizer,  # noqa: F811
    tmp_path,
) -> None:
    assert personalizer.engine.batch_sequences > 0
    user = UserStore(tmp_path).create("batched")
    user.save_history(items(SHOUTY))
    report = personalizer.fit_user(user, choose=False)
    assert report.n_items == len(SHOUTY)
    cached = (user.dir / "negatives.json").read_text()
    assert cached.count(":") >= len(SHOUTY)  # one y- per item, under the bundle:cluster key
    negatives = personalizer.pairs.negatives_and_differences(user, items(SHOUTY), report.cluster, None)
    assert negatives[3]["negatives"] == 0.0  # all cached now: nothing generated the second time


def test_features_only_passes_skip_the_logits_and_leave_the_cache_as_a_full_pass_does(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    engine = personalizer.engine
    engine.set_adapter("global")
    assert engine.tap_layers[-1] == engine.n_layer - 1  # the skip applies: the deepest tap is the last layer
    prompt = engine.tokenize(PROMPTS[2])
    body = engine.tokenize(" FREE LUNCH FOR EVERY KID", add_bos=False)
    after = engine.tokenize("!!!", add_bos=False)
    results = []
    for logits in (True, False):
        engine.forget_sequence(1)
        engine.eval_sequences(prompt, range(len(prompt)), [1] * len(prompt), all_outputs=False)
        positions = range(len(prompt), len(prompt) + len(body))
        rows, features = engine.eval_sequences(
            body, positions, [1] * len(body), all_outputs=True, logits=logits
        )
        assert (rows is None) == (not logits)
        features = features.copy()
        # the keys and values written by the features-only pass serve the next decode exactly as a full pass's
        next_logits, _ = engine.eval_sequences(
            after, range(positions.stop, positions.stop + len(after)), [1] * len(after), all_outputs=False
        )
        results.append((features, np.array(next_logits[-1])))
    engine.forget_sequence(1)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    # a later ordinary decode computes its logits again
    assert np.isfinite(engine.prefill(prompt).logits).all()


BLOCK = "Headlines this author wrote before:\n- BIG WIN FOR CITY PARK!!!\n- MAYOR SAYS YES TO BUSES!!!"
SHARING = [
    BLOCK
    + "\n- STORM CUTS POWER, WOW!!!\n\nGenerate a headline for the following article: The zoo welcomed two"
    " baby pandas.\nHeadline:",
    BLOCK
    + "\n- MUSEUM OPEN LATE, YES!!!\n\nGenerate a headline for the following article: Bus fares will drop"
    " by half for students.\nHeadline:",
]


def test_prompts_that_share_a_block_evaluate_it_once_and_score_as_if_alone(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    engine = personalizer.engine
    engine.set_adapter("global")
    continuation = engine.tokenize(" PANDAS AND BUSES!!!", add_bos=False)
    shared = len(engine.tokenize(BLOCK))
    prompts = [engine.tokenize(p) for p in SHARING]
    assert all(p[:shared] == prompts[0][:shared] for p in prompts)

    def job(prompt: list[int]) -> PromptJob:
        return PromptJob(prompt, True, lambda text: [continuation], shared=shared)

    together = run_jobs(engine, [job(p) for p in prompts], max_tokens=10, stop=["\n"], logprob_rows=3)
    # the second prompt alone evaluates the block into its own sequence: the same split into batches
    (alone,) = run_jobs(engine, [job(prompts[1])], max_tokens=10, stop=["\n"], logprob_rows=3)
    assert together[1].text == alone.text
    # the prompt's own row: the block's keys and values by reference are the ones it would have computed
    shared_row, alone_row = together[1].scored[0].features[0], alone.scored[0].features[0]
    assert np.abs(shared_row - alone_row).max() <= 1e-3 * np.abs(alone_row).max()
    # later rows were evaluated beside the other sequence's continuation: batch noise only
    scale = np.abs(alone.scored[0].features).max()
    assert (
        np.abs(together[1].scored[0].features - alone.scored[0].features).max() <= FEATURE_TOLERANCE * scale
    )
    np.testing.assert_allclose(
        together[1].scored[0].logprobs, alone.scored[0].logprobs, atol=LOGPROB_TOLERANCE
    )
    # and both agree with the engine's own scorer within batch noise
    (reference,) = engine.score(prompts[1], [continuation], logprob_rows=3)
    np.testing.assert_allclose(together[1].scored[0].logprobs, reference.logprobs, atol=LOGPROB_TOLERANCE)


def test_scoring_the_generated_text_reuses_the_generation_pass(personalizer: Personalizer) -> None:  # noqa: F811
    engine = personalizer.engine
    engine.set_adapter("global")
    prompt = engine.tokenize(PROMPTS[2])
    generated: list[list[int]] = []

    def own_text(text: str) -> list[list[int]]:
        generated.append(engine.tokenize(" " + text, add_bos=False))
        return [generated[-1]]

    (outcome,) = run_jobs(engine, [PromptJob(prompt, True, own_text)], max_tokens=12, stop=["\n"])
    (scored,) = outcome.scored
    assert outcome.text and scored.tokens == generated[0] and len(scored.logprobs) == 1
    (reference,) = engine.score(prompt, generated, logprob_rows=1)
    assert scored.features.shape == reference.features.shape
    scale = np.abs(reference.features).max()
    assert np.abs(scored.features - reference.features).max() <= FEATURE_TOLERANCE * scale
    np.testing.assert_allclose(scored.logprobs, reference.logprobs, atol=LOGPROB_TOLERANCE)


def test_the_step_cost_benchmark_times_each_row_count(backbone) -> None:
    script = Path(__file__).parent.parent / "scripts" / "bench_batch_rows.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--model",
            str(backbone.path),
            "--rows",
            "1",
            "3",
            "--prompt-tokens",
            "8",
            "--repeats",
            "2",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    costs = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(costs) == {"1", "3"}
    for rows, cost in costs.items():
        assert cost["ms_per_step"] > 0
        assert cost["ms_per_row"] == pytest.approx(cost["ms_per_step"] / int(rows))


def test_the_batched_pair_pass_reports_progress_after_each_group(
    personalizer: Personalizer,  # noqa: F811
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("localpers.engine.batch.GROUP_SIZE", 3)
    user = UserStore(tmp_path).create("progress")
    user.save_history(items(SHOUTY))
    seen: list[tuple[str, int, int]] = []
    personalizer.pairs.negatives_and_differences(
        user, items(SHOUTY), 0, lambda stage, done, total: seen.append((stage, done, total))
    )
    counts = [done for _, done, _ in seen]
    assert {stage for stage, _, _ in seen} == {"pairs"} and {total for _, _, total in seen} == {len(SHOUTY)}
    assert counts == sorted(set(counts)) and counts[-1] == len(SHOUTY)  # increasing, never repeated
    assert counts[:2] == [3, 6]  # one report per group of 3 prompts, before the whole pass is over


def _cached_negatives(personalizer: Personalizer, user) -> dict[str, str]:  # noqa: F811
    return personalizer.pairs._read_negatives(user, 0)


def _pair_pass_stopped_after(personalizer: Personalizer, user, items_done: int) -> None:  # noqa: F811
    """The pair pass over SHOUTY, stopped by a Ctrl-C once it reports `items_done` items done."""

    def stop(stage: str, done: int, total: int) -> None:
        if done >= items_done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        personalizer.pairs.negatives_and_differences(user, items(SHOUTY), 0, stop)


def test_a_fit_stopped_after_a_group_keeps_its_work_and_the_next_one_goes_on_from_there(
    personalizer: Personalizer,  # noqa: F811
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("localpers.engine.batch.GROUP_SIZE", 3)
    user = UserStore(tmp_path).create("stopped")
    user.save_history(items(SHOUTY))
    _pair_pass_stopped_after(personalizer, user, 3)
    kept = _cached_negatives(personalizer, user)
    assert len(kept) == 3  # the first group's y-, written before the interruption
    features = personalizer.pairs._read_features(user, 0)
    assert 0 < len(features) <= 3

    generated: list[int] = []
    original = pair_batches.run_jobs

    def counting(engine, jobs, **options):  # noqa: ANN001, ANN003, ANN202
        generated.append(sum(job.generate for job in jobs))
        return original(engine, jobs, **options)

    monkeypatch.setattr(pair_batches, "run_jobs", counting)
    negatives, *_ = personalizer.pairs.negatives_and_differences(user, items(SHOUTY), 0, None)
    assert sum(generated) == len(SHOUTY) - 3  # only what the stopped fit had not done
    assert {k: v for k, v in _cached_negatives(personalizer, user).items() if k in kept} == kept
    assert len(_cached_negatives(personalizer, user)) == len(SHOUTY) and all(
        isinstance(n, str) for n in negatives
    )


def test_the_one_at_a_time_loop_also_saves_as_it_goes(
    personalizer: Personalizer,  # noqa: F811
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no batched pass: every prompt goes through the loop, which saves after a y- and its pair (every item)
    monkeypatch.setattr(personalizer.engine, "batch_sequences", 0)
    monkeypatch.setattr(pairs_module, "SAVE_EVERY", 2)
    user = UserStore(tmp_path).create("looped")
    user.save_history(items(SHOUTY))
    _pair_pass_stopped_after(personalizer, user, 2)
    assert len(_cached_negatives(personalizer, user)) == 2


@pytest.mark.parametrize("batched", [True, False])
def test_items_whose_negative_is_their_output_still_give_the_first_token_log_probability(
    personalizer: Personalizer,  # noqa: F811
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    batched: bool,
) -> None:
    # The opening habits average the model's first-token probability over every item; leaving out the items the
    # model already writes as the user does overstated the habit's bias (5.2 nats instead of 2.75 in one audit).
    if not batched:
        monkeypatch.setattr(personalizer.engine, "batch_sequences", 0)
    user = UserStore(tmp_path).create("identical")
    history = items(SHOUTY)
    user.save_history(history)
    pairs = personalizer.pairs
    prompts = [
        prompt
        for prompt, _ in pairs.training_prompts_and_blocks(
            history, 0, pairs_module.ordinals_of(user.dir, history)
        )
    ]
    keys = [negative_key(item, prompt) for item, prompt in zip(history, prompts, strict=True)]
    # the model "wrote" items 0 and 2 exactly as the user did, and nothing at all for item 4
    known = {keys[0]: history[0].output, keys[2]: history[2].output, keys[4]: ""}
    assert pairs._write_negatives(user, 0, known, list(known))
    negatives, differences, first_logprobs, _ = pairs.negatives_and_differences(user, history, 0, None)
    assert [negatives[i] for i in (0, 2, 4)] == [history[0].output, history[2].output, ""]
    assert differences.shape[0] == len(history) - 3  # the identical and empty pairs are no rows
    assert all(lp is not None for lp in first_logprobs)
    engine = personalizer.engine
    for index in (0, 2, 4):
        first = engine.tokenize(" " + history[index].output, add_bos=False)[:1]
        (reference,) = engine.score(engine.tokenize(prompts[index]), [first], logprob_rows=1)
        assert first_logprobs[index] == pytest.approx(float(reference.logprobs[0]), abs=LOGPROB_TOLERANCE)
    # kept in the pair cache: the next pass scores nothing again
    pairs._pair_memo.clear()
    scored: list[int] = []
    original = pairs._pair_difference
    monkeypatch.setattr(pairs, "_pair_difference", lambda *a: scored.append(1) or original(*a))
    again = pairs.negatives_and_differences(user, history, 0, None)
    assert again[2] == pytest.approx(first_logprobs) and not scored
