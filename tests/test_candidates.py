"""A rewrite's candidates: decoded side by side, the consensus one kept; the ROUGE-1 agreement that chooses it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from test_personalize import SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures
from typer.testing import CliRunner

from localpers.bench.metrics import rouge
from localpers.cli import app
from localpers.engine.candidates import generate_candidates
from localpers.engine.decoding import SamplerSettings
from localpers.engine.generation import generate
from localpers.errors import LocalpersError
from localpers.methods.card import decoding_runs
from localpers.methods.card.decoding_runs import CANDIDATE_SAMPLING
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import user_profile
from localpers.methods.consensus import MAX_CANDIDATES, choose_consensus, unigram_f1, unigrams
from localpers.users.store import UserStore

PROMPTS = [
    "Generate a headline for the following article: The city opened a new bike lane along the river.\nHeadline:",
    "Generate a headline for the following article: A storm knocked out power to 3,000 homes.\nHeadline:",
    "Generate a headline for the following article: The zoo welcomed two baby pandas on Monday.\nHeadline:",
]


def test_unigram_f1_is_the_benchmarks_rouge1() -> None:
    pairs = [
        ("Storms Knock Out Power To Thousands", "Storm knocks out power to 3,000 homes"),
        ("City opens bike lane", "Bike lanes open along the river in the city"),
        ("", "anything"),
        ("Pandas! Pandas!", "two baby pandas"),
    ]
    for a, b in pairs:
        assert unigram_f1(unigrams(a), unigrams(b)) == pytest.approx(rouge(a, b).rouge1)


def test_consensus_keeps_the_candidate_the_others_agree_with() -> None:
    texts = [
        "Mayor plants trees downtown",  # greedy, an outlier here
        "City plans 10,000 new trees",
        "City plans to plant 10,000 trees",
        "Mayor's plan: 10,000 trees for the city",
        "Ducks",
    ]
    choice = choose_consensus(texts)
    assert choice.index == 2
    assert len(choice.scores) == len(texts) and max(choice.scores) == choice.scores[2]
    assert choice.scores[4] == 0.0


def test_consensus_prefers_the_first_on_ties_and_with_too_few_candidates() -> None:
    assert choose_consensus(["same words", "same words", "same words"]).index == 0
    assert choose_consensus(["a", "b"]).index == 0
    assert choose_consensus(["only"]).index == 0
    with pytest.raises(ValueError):
        choose_consensus([])


def test_candidates_start_with_the_greedy_output_and_reproduce_with_a_seed(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    engine = personalizer.engine
    engine.set_adapter("global")
    same_greedy, distinct = 0, 0
    for prompt in PROMPTS:
        tokens = engine.tokenize(prompt)
        single = generate(engine, tokens, max_tokens=16, stop=["\n"]).text.strip()
        first, again = (
            generate_candidates(
                engine,
                tokens,
                count=6,
                sampling=CANDIDATE_SAMPLING,
                method=lambda: None,
                max_tokens=16,
                stop=["\n"],
            )
            for _ in range(2)
        )
        assert [r.text for r in first] == [r.text for r in again]  # same seed, same candidates
        assert all(
            r.stop_reason in ("eos", "stop", "length") and r.prompt_tokens == len(tokens) for r in first
        )
        same_greedy += first[0].text.strip() == single
        distinct += len({r.text.strip() for r in first}) > 1
        # the batched sequences are left empty: sequence 0's prompt decodes on as before
        assert generate(engine, tokens, max_tokens=16, stop=["\n"]).text.strip() == single
    # batched and single evaluation differ by float noise (docs/PERFORMANCE.md); the greedy path mostly agrees
    assert same_greedy >= 2
    assert distinct >= 2  # the samples are samples


def test_a_rewrite_with_candidates_returns_the_consensus_of_what_it_decoded(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    user = UserStore().create("shouty-candidates")
    user.save_history(items(SHOUTY[:7]))
    personalizer.fit_user(user)
    cluster, vector, _ = user_profile(user)
    text = "The council voted to rebuild the old bridge next spring."
    plain = personalizer.rewrite(text, method="card", cluster=cluster, vector=vector)
    chosen = personalizer.rewrite(text, method="card", cluster=cluster, vector=vector, candidates=5)
    assert chosen.text and chosen.tokens > 0 and chosen.ms_per_token > 0
    again = personalizer.rewrite(text, method="card", cluster=cluster, vector=vector, candidates=5)
    assert again.text == chosen.text
    streamed: list[str] = []
    personalizer.rewrite(
        text, method="card", cluster=cluster, vector=vector, candidates=5, on_text=streamed.append
    )
    assert "".join(streamed).strip() == chosen.text
    assert (
        personalizer.rewrite(text, method="card", cluster=cluster, vector=vector, candidates=1).text
        == plain.text
    )
    for bad in (0, MAX_CANDIDATES + 1):
        with pytest.raises(LocalpersError, match="candidates must be"):
            personalizer.rewrite(text, method="global", candidates=bad)
    with pytest.raises(LocalpersError, match="greedy decoding"):
        personalizer.rewrite(text, method="global", candidates=4, sampling=CANDIDATE_SAMPLING)


def test_cli_refuses_candidates_with_sampling_in_one_line() -> None:
    result = CliRunner().invoke(
        app,
        ["rewrite", "Some article text.", "--method", "global", "--candidates", "4", "--temperature", "0.7"],
    )
    assert result.exit_code == 2
    assert result.output.startswith("error:") and "--candidates needs greedy decoding" in result.output
    assert result.output.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--method", "card", "--temperature", "0.5"],
            "--candidates needs greedy decoding, not --temperature 0.5",
        ),
        (["--method", "cope"], "--candidates needs a method that decodes on an adapter, not cope"),
    ],
)
def test_cli_names_only_the_condition_candidates_failed(options: list[str], expected: str) -> None:
    """It named both conditions, "and an adapter method (not card)", although card works with --candidates."""
    result = CliRunner().invoke(app, ["rewrite", "Some article text.", "--candidates", "2", *options])
    assert result.exit_code == 2 and result.output.startswith(f"error: {expected}"), result.output
    assert "adapter" not in result.output if "--temperature" in options else "greedy" not in result.output


def test_tui_refuses_candidates_with_sampling_in_one_line() -> None:
    result = CliRunner().invoke(app, ["tui", "--candidates", "4", "--temperature", "0.7"])
    assert result.exit_code == 2
    assert "--candidates needs greedy decoding" in result.output
    assert result.output.strip().count("\n") == 0


def test_few_candidates_are_sampled_cooler_than_many(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: dict[int, float] = {}

    def fake_candidates(engine, prompt, *, count, sampling, method, **_):  # noqa: ANN001, ANN003, ANN202
        drawn[count] = sampling.temperature
        assert (sampling.top_k, sampling.top_p) == (CANDIDATE_SAMPLING.top_k, CANDIDATE_SAMPLING.top_p)
        return [SimpleNamespace(text=f"words {i % 2}", correction=method()) for i in range(count)]

    monkeypatch.setattr(decoding_runs, "generate_candidates", fake_candidates)
    for count in (3, 4, 8, 9, 16):
        result, _ = decoding_runs.decode_consensus(None, [1], count, 8, (), 0, lambda: None)
        assert result.text == "words 0"
    # RESULTS 0zb: up to 8 candidates agree best at 0.5, more at 0.7
    assert drawn == {3: 0.5, 4: 0.5, 8: 0.5, 9: 0.7, 16: 0.7}


def test_a_candidates_decode_stops_at_the_step_its_sink_refuses(personalizer: Personalizer) -> None:  # noqa: F811
    """With `candidates`, text reached the sink only once all were decoded: a client that left (or a TUI draft that
    changed) could not stop the decode, which ran on for up to a minute (API and TUI audits)."""

    class Gone(Exception):
        pass

    asked: list[str] = []

    def on_text(piece: str) -> None:
        if not piece:
            asked.append(piece)
            if len(asked) == 3:
                raise Gone

    text = "The council voted to rebuild the old bridge next spring."
    with pytest.raises(Gone):
        personalizer.rewrite(text, method="global", candidates=4, max_tokens=32, on_text=on_text)
    assert len(asked) == 3
    plain = personalizer.rewrite(text, method="global")
    assert personalizer.rewrite(text, method="global", candidates=1).text == plain.text  # the engine is whole


def test_candidates_refuse_what_their_own_chains_would_drop() -> None:
    """A grammar, a logit bias or penalties beside `candidates` were accepted and silently dropped: each candidate
    draws with its own chain (engine audit, eighty-fourth session)."""
    for settings, named in (
        (SamplerSettings(grammar='root ::= "x"'), "a grammar"),
        (SamplerSettings(logit_bias=((5, -100.0),)), "a logit bias"),
        (SamplerSettings(frequency_penalty=0.5), "repetition penalties"),
        (SamplerSettings(dry_multiplier=0.8), "DRY"),
    ):
        with pytest.raises(LocalpersError, match=f"candidates decode without {named}") as refused:
            decoding_runs.check_candidates(4, settings)
        assert refused.value.exit_code == 2
        decoding_runs.check_candidates(1, settings)  # one candidate keeps them


def test_candidates_end_where_the_context_is_full(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`generate` ends with reason "context" when the prompt and output fill the context; the candidates ran past
    it and the whole decode failed ("position 1344 is out of range")."""
    engine = personalizer.engine
    monkeypatch.setattr(
        engine, "is_end_of_generation", lambda token: False
    )  # a model that does not stop itself
    prompt = engine.tokenize(" ".join(["word"] * 2000))[: engine.n_ctx - 24]
    results = generate_candidates(
        engine, prompt, count=2, sampling=CANDIDATE_SAMPLING, method=lambda: None, max_tokens=400
    )
    assert [r.stop_reason for r in results] == ["context", "context"]
    # as long as `generate`'s: the last token drawn needs no cell (they stopped one token earlier, engine audit s88)
    alone = generate(engine, prompt, max_tokens=400)
    assert alone.stop_reason == "context" and len(prompt) + len(alone.tokens) == engine.n_ctx + 1
    assert all(len(r.tokens) == len(alone.tokens) for r in results)


def test_no_token_asked_for_gives_none_in_the_batched_paths(personalizer: Personalizer) -> None:  # noqa: F811
    """`generate` gives no token for max_tokens=0; candidates and batched jobs appended one before the check."""
    from localpers.engine.batch import PromptJob, run_jobs

    engine = personalizer.engine
    prompt = engine.tokenize(PROMPTS[0])
    assert generate(engine, prompt, max_tokens=0).tokens == []
    results = generate_candidates(
        engine, prompt, count=2, sampling=CANDIDATE_SAMPLING, method=lambda: None, max_tokens=0
    )
    assert [(r.tokens, r.text) for r in results] == [([], ""), ([], "")]
    outcomes = run_jobs(engine, [PromptJob(prompt, True, lambda text: [])], max_tokens=0)
    assert [outcome.text for outcome in outcomes] == [""]
    with pytest.raises(ValueError, match="no token given"):  # was an UnboundLocalError
        run_jobs(engine, [PromptJob([], True, lambda text: [])], max_tokens=4)


def test_a_rewrites_seed_picks_the_candidates_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rewrite --candidates N --seed S` accepted the seed and drew with seed 0 whatever it was (engine audit s88);
    without a seed the draws stay the same from run to run."""
    from localpers.engine.decoding import GREEDY

    seeds: list[int] = []

    def fake_candidates(engine, prompt, *, count, method, seed, **_):  # noqa: ANN001, ANN003, ANN202
        seeds.append(seed)
        return [SimpleNamespace(text="words", correction=method()) for _ in range(count)]

    monkeypatch.setattr(decoding_runs, "generate_candidates", fake_candidates)
    for seed in (7, None):
        decoding_runs.decode_rewrite(
            None,  # type: ignore[arg-type]
            [1],
            max_tokens=8,
            stop=(),
            shared=0,
            sampling=dataclasses.replace(GREEDY, seed=seed),
            correction=None,
            new_correction=lambda: None,
            candidates=4,
        )
    assert seeds == [7, 0]
