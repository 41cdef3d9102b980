"""llama.cpp's sampler chain as the engine builds it: built-in samplers, a Python method sampler, grammars, errors.

Most tests feed the chain made-up logits over the real vocabulary (so the expected token is known); the
grammar and generation tests decode with the embedded backbone.
"""

from __future__ import annotations

import numpy as np
import pytest

from localpers.engine import Engine
from localpers.engine.backbone import Backbone
from localpers.engine.decoding import Candidates, SamplerSettings
from localpers.engine.generation import generate
from localpers.errors import LocalpersError

PROMPT = "Generate a headline for the following article: The city opened a new bike lane along the river.\nHeadline:"


@pytest.fixture(scope="module")
def engine(backbone: Backbone) -> Engine:
    with Engine(backbone.path, n_ctx=256) as shared:
        yield shared


def logits_with(engine: Engine, values: dict[int, float]) -> np.ndarray:
    """Every token at -inf except the given ones."""
    logits = np.full(engine.n_vocab, -np.inf, dtype=np.float32)
    for token, value in values.items():
        logits[token] = value
    return logits


def draws(engine: Engine, settings: SamplerSettings, logits: np.ndarray, n: int) -> list[int]:
    with engine.sampler_chain(settings) as chain:
        return [chain.sample(logits).token for _ in range(n)]


def test_greedy_picks_the_largest_logit_and_reports_it(engine: Engine) -> None:
    logits = np.random.default_rng(0).normal(size=engine.n_vocab).astype(np.float32)
    with engine.sampler_chain(SamplerSettings()) as chain:
        pick = chain.sample(logits)
    assert chain.names == ["greedy"]
    assert pick.token == int(np.argmax(logits)) and pick.logit == pytest.approx(float(logits.max()))


def test_top_k_one_is_greedy_even_when_sampling(engine: Engine) -> None:
    logits = logits_with(engine, {10: 5.0, 11: 4.9, 12: 4.8})
    assert set(draws(engine, SamplerSettings(temperature=1.5, top_k=1, seed=3), logits, 20)) == {10}


def test_top_p_keeps_only_the_nucleus(engine: Engine) -> None:
    logits = logits_with(engine, dict(zip((20, 21, 22, 23), np.log([0.6, 0.3, 0.05, 0.05]), strict=True)))
    picks = draws(engine, SamplerSettings(temperature=1.0, top_p=0.8, seed=1), logits, 200)
    assert set(picks) == {20, 21}


def test_min_p_drops_tokens_below_a_share_of_the_best(engine: Engine) -> None:
    logits = logits_with(engine, dict(zip((30, 31, 32, 33), np.log([0.5, 0.3, 0.15, 0.05]), strict=True)))
    picks = draws(engine, SamplerSettings(temperature=1.0, min_p=0.2, seed=2), logits, 300)
    assert set(picks) == {30, 31, 32}  # 0.05 < 0.2 x 0.5


def test_seeded_draws_repeat_and_other_seeds_differ(engine: Engine) -> None:
    logits = logits_with(engine, {token: 0.0 for token in range(100, 164)})
    first = draws(engine, SamplerSettings(temperature=1.0, seed=42), logits, 20)
    assert first == draws(engine, SamplerSettings(temperature=1.0, seed=42), logits, 20)
    assert first != draws(engine, SamplerSettings(temperature=1.0, seed=43), logits, 20)


def test_repetition_penalty_applies_to_tokens_the_chain_accepted(engine: Engine) -> None:
    logits = logits_with(engine, {40: 2.0, 41: 1.0})
    with engine.sampler_chain(SamplerSettings(repeat_penalty=3.0)) as chain:
        assert chain.sample(logits).token == 40
        assert chain.sample(logits).token == 41  # 2.0 / 3 < 1.0 once 40 was generated
    with engine.sampler_chain(SamplerSettings(presence_penalty=1.5)) as chain:
        assert [chain.sample(logits).token for _ in range(2)] == [40, 41]


def test_repeated_word_rule_lowers_words_already_written_but_spares_digits_and_stop_words(
    engine: Engine,
) -> None:
    """llama.cpp's penalties lower any token written before; the word rule only words of 3+ letters."""

    def token(text: str) -> int:
        ids = engine.tokenize(text, add_bos=False)
        assert len(ids) == 1, f"{text!r} is {len(ids)} tokens in this vocabulary"
        return ids[0]

    word, word_again, other = token(" Campaign"), token("Campaign"), token(" Deal")
    digit, stop, other_digit = token("0"), token(" The"), token("1")
    settings = SamplerSettings(repeated_word_penalty=3.0)
    with engine.sampler_chain(settings) as chain:
        assert chain.names == ["top-k(20)", "repeated-words", "greedy"]
        assert chain.sample(logits_with(engine, {word: 2.0, other: 1.0})).token == word
        # the same word in another casing and without its leading space loses 3 nats; another word does not
        assert chain.sample(logits_with(engine, {word_again: 2.0, other: 1.0})).token == other
        assert chain.sample(logits_with(engine, {digit: 2.0, other_digit: 1.0})).token == digit
        assert (
            chain.sample(logits_with(engine, {digit: 2.0, other_digit: 1.0})).token == digit
        )  # digits spared
        assert chain.sample(logits_with(engine, {stop: 2.0, other: 1.5})).token == stop
        assert chain.sample(logits_with(engine, {stop: 2.0, other: 1.5})).token == stop  # stop words spared
        ids, changed = chain.transform(logits_with(engine, {word: 2.0, other: 1.5}))
        finite = np.isfinite(changed)
        assert dict(zip(ids[finite].tolist(), changed[finite].tolist(), strict=True)) == {
            word: -1.0,
            other: -1.5,
        }
    with engine.sampler_chain(
        SamplerSettings(presence_penalty=1.5)
    ) as chain:  # the token penalty hits digits
        assert [
            chain.sample(logits_with(engine, {digit: 2.0, other_digit: 1.0})).token for _ in range(2)
        ] == [
            digit,
            other_digit,
        ]
    with engine.sampler_chain(SamplerSettings(repeated_word_penalty=3.0, top_k=40)) as chain:
        assert chain.names == ["top-k(40)", "repeated-words", "top-k", "greedy"]


def test_repeated_word_rule_follows_a_method_and_needs_no_cut_of_its_own(engine: Engine) -> None:
    method = BanFirstCandidate(candidate_limit=5)
    with engine.sampler_chain(SamplerSettings(repeated_word_penalty=1.0), method) as chain:
        assert chain.names == ["top-k(5)", "ban-first", "repeated-words", "greedy"]
        chain.sample(np.arange(engine.n_vocab, dtype=np.float32) / engine.n_vocab)
    assert len(method.accepted) == 1  # the method is still told of every token


def test_logit_bias_can_ban_the_best_token(engine: Engine) -> None:
    logits = logits_with(engine, {50: 3.0, 51: 2.0})
    assert draws(engine, SamplerSettings(logit_bias=((50, -np.inf),)), logits, 1) == [51]


class BanFirstCandidate:
    """A method sampler that drops the best candidate and records what it saw."""

    name = "ban-first"

    def __init__(self, candidate_limit: int | None) -> None:
        self.candidate_limit = candidate_limit
        self.seen: list[np.ndarray] = []
        self.features: list[np.ndarray | None] = []
        self.accepted: list[int] = []

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        self.seen.append(candidates.ids.copy())
        self.features.append(features)
        candidates.keep(candidates.logits < candidates.logits.max())

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def test_method_sampler_sees_only_its_top_k_and_decides(engine: Engine) -> None:
    logits = np.arange(engine.n_vocab, dtype=np.float32) / engine.n_vocab  # larger id, larger logit
    method = BanFirstCandidate(candidate_limit=5)
    features = np.ones((4, 640), dtype=np.float32)
    with engine.sampler_chain(SamplerSettings(), method) as chain:
        pick = chain.sample(logits, features)
    assert chain.names == ["top-k(5)", "ban-first", "greedy"]
    assert sorted(method.seen[0].tolist()) == list(range(engine.n_vocab - 5, engine.n_vocab))
    assert method.features[0] is features
    assert pick.token == engine.n_vocab - 2 and method.accepted == [pick.token]


def test_an_error_in_a_method_sampler_reaches_the_caller(engine: Engine) -> None:
    class Broken:
        name = "broken"
        candidate_limit = None

        def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
            raise ValueError("boom")

        def accept(self, token: int) -> None:
            return None

    with engine.sampler_chain(SamplerSettings(), Broken()) as chain, pytest.raises(ValueError, match="boom"):
        chain.sample(np.zeros(engine.n_vocab, dtype=np.float32))


def test_a_method_sampler_that_drops_everything_is_an_error(engine: Engine) -> None:
    class DropAll:
        name = "drop-all"
        candidate_limit = 3

        def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
            candidates.keep(np.zeros(candidates.size, dtype=bool))

        def accept(self, token: int) -> None:
            return None

    with (
        engine.sampler_chain(SamplerSettings(), DropAll()) as chain,
        pytest.raises(LocalpersError, match="every"),
    ):
        chain.sample(np.zeros(engine.n_vocab, dtype=np.float32))


def test_method_sampler_changes_generated_tokens(engine: Engine) -> None:
    plain = generate(engine, PROMPT, max_tokens=6)
    method = BanFirstCandidate(candidate_limit=None)
    banned = generate(engine, PROMPT, max_tokens=6, method=method)
    assert banned.tokens[0] != plain.tokens[0]
    assert all(f is not None and f.shape == (4, engine.n_embd) for f in method.features)
    assert method.accepted[: len(banned.tokens)] == banned.tokens


def test_grammar_constrains_the_output(engine: Engine) -> None:
    grammar = 'root ::= ("Yes" | "No") "."'
    result = generate(
        engine, "Is the sky green? Answer:", max_tokens=8, sampling=SamplerSettings(grammar=grammar)
    )
    assert result.text in {"Yes.", "No."}
    assert result.stop_reason == "eos"  # the grammar ends, so only end-of-generation is allowed


def test_invalid_grammar_is_a_one_line_error(engine: Engine, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LocalpersError, match="not valid GBNF") as raised:
        engine.sampler_chain(SamplerSettings(grammar='root ::= ("Zorblax" unclosed'))
    assert raised.value.exit_code == 2 and "\n" not in str(raised.value)
    assert "expecting" in str(raised.value), "the parser's own reason"
    captured = capfd.readouterr()
    assert "Zorblax" not in captured.out + captured.err, "llama.cpp's parser printed the grammar to stderr"
    with pytest.raises(
        LocalpersError
    ) as cut:  # the parser quotes nothing after "at": said, not left mid-sentence
        engine.sampler_chain(SamplerSettings(grammar="root ::= ("))
    assert str(cut.value).endswith("expecting ')' at the end of the grammar"), str(cut.value)


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        (SamplerSettings(top_p=0.0), "top_p"),
        (SamplerSettings(min_p=1.0), "min_p"),
        (SamplerSettings(temperature=-1.0), "temperature"),
        (SamplerSettings(seed=2**32 - 1), "seed"),
        (SamplerSettings(grammar="  "), "grammar"),
        # llama.cpp takes int32 counts: top_k 2^32 + 1 wrapped to 1 and sampling became greedy
        (SamplerSettings(top_k=2**32 + 1), "top_k"),
        (SamplerSettings(penalty_last_n=2**32), "penalty_last_n"),
        (SamplerSettings(seed=1.5), "seed"),  # type: ignore[arg-type]  # was a ctypes.ArgumentError
    ],
)
def test_out_of_range_settings_are_refused(settings: SamplerSettings, name: str) -> None:
    with pytest.raises(LocalpersError, match=name) as raised:
        settings.validated()
    assert raised.value.exit_code == 2


def test_sampled_generation_is_reproducible_with_a_seed(engine: Engine) -> None:
    settings = SamplerSettings(temperature=1.2, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    first = generate(engine, PROMPT, max_tokens=10, sampling=settings)
    assert first.tokens == generate(engine, PROMPT, max_tokens=10, sampling=settings).tokens


def test_the_c_candidate_fill_and_the_numpy_fill_feed_the_chain_alike(engine: Engine) -> None:
    from localpers.engine import sampler_chain

    if sampler_chain._FILL_CANDIDATES is None:
        pytest.skip("the C extension was not built; only the numpy fill exists")
    rng = np.random.default_rng(11)
    settings = SamplerSettings(temperature=1.0, top_k=50, seed=9)
    with engine.sampler_chain(settings) as fast, engine.sampler_chain(settings) as slow:
        for _ in range(30):
            logits = rng.normal(size=engine.n_vocab).astype(np.float32)
            strided = np.repeat(logits, 2)[::2]  # same values, not contiguous: takes the numpy path
            assert not strided.flags.c_contiguous
            assert fast.sample(logits).token == slow.sample(strided).token
            np.testing.assert_array_equal(fast._entries, slow._entries)


@pytest.mark.parametrize("k", [1, 5, 20, 64])
def test_best_positions_in_c_and_numpy_agree_with_ties_and_nans(
    k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import localpers.engine.decoding as decoding
    from localpers.engine.sampler_chain import TOKEN_DATA

    rng = np.random.default_rng(k)
    entries = np.zeros(5000, dtype=TOKEN_DATA)
    entries["id"] = rng.permutation(5000)
    entries["logit"] = rng.integers(-50, 50, 5000).astype(np.float32)  # many exact ties
    entries["logit"][[3, 17, 400]] = np.nan
    valid = [i for i in range(5000) if not np.isnan(entries["logit"][i])]
    expected = sorted(valid, key=lambda i: (-entries["logit"][i], i))[:k]
    assert decoding._TOP_K_POSITIONS is not None, "the compiled helper should be built in tests"
    assert Candidates(entries).best_positions(k).tolist() == expected
    monkeypatch.setattr(decoding, "_TOP_K_POSITIONS", None)
    assert Candidates(entries).best_positions(k).tolist() == expected


def test_card_correction_with_a_token_bias_cuts_itself_and_adds_the_habits() -> None:
    from localpers.engine.sampler_chain import TOKEN_DATA
    from localpers.methods.card.correction import CardCorrection
    from localpers.methods.card.token_bias import TokenBias

    class ZeroHead:
        def correction(
            self, ids: np.ndarray, features: np.ndarray, vector: np.ndarray, strength: float
        ) -> np.ndarray:
            return np.ones(len(ids), dtype=np.float32)  # +1 for every token the vector sees

    entries = np.zeros(1000, dtype=TOKEN_DATA)
    entries["id"] = np.arange(1000)
    entries["logit"] = -np.arange(1000, dtype=np.float32)  # token t has logit -t: the top 3 are 0, 1, 2
    bias = TokenBias(first={900: 2.0, 1: 1.0}, rest={950: 1.0})
    correction = CardCorrection(ZeroHead(), np.zeros(4), 1.0, 3, record=True, bias=bias, bias_strength=3.0)  # type: ignore[arg-type]
    assert correction.candidate_limit is None  # it must see the habitual tokens' logits
    candidates = Candidates(entries.copy())
    correction.apply(candidates, np.zeros(4, dtype=np.float32))
    assert candidates.ids.tolist() == [0, 1, 2, 900]  # top 3 best first, then the habit
    assert candidates.logits.tolist() == [1.0, -1.0 + 1.0 + 3.0, -2.0 + 1.0, -900.0 + 6.0]
    correction.accept(0)  # later tokens use the "rest" table
    candidates = Candidates(entries.copy())
    correction.apply(candidates, np.zeros(4, dtype=np.float32))
    assert candidates.ids.tolist() == [0, 1, 2, 950]
    without = CardCorrection(ZeroHead(), np.zeros(4), 1.0, 3, bias=TokenBias(), bias_strength=3.0)  # type: ignore[arg-type]
    assert without.candidate_limit == 3 and without.bias is None  # an empty bias: the chain's top-k cuts


def test_a_habit_is_pushed_only_until_the_output_holds_it() -> None:
    from localpers.engine.sampler_chain import TOKEN_DATA
    from localpers.methods.card.correction import CardCorrection
    from localpers.methods.card.token_bias import TokenBias

    class NoVector:
        def correction(
            self, ids: np.ndarray, features: np.ndarray, vector: np.ndarray, strength: float
        ) -> np.ndarray:
            return np.zeros(len(ids), dtype=np.float32)

    entries = np.zeros(1000, dtype=TOKEN_DATA)
    entries["id"] = np.arange(1000)
    entries["logit"] = -np.arange(1000, dtype=np.float32)
    bias = TokenBias(first={}, rest={900: 2.0, 1: -1.0})  # a habit (":" after a kicker) and an avoided token
    correction = CardCorrection(NoVector(), np.zeros(4), 0.0, 3, bias=bias, bias_strength=1.0)  # type: ignore[arg-type]
    correction.accept(5)  # position 1: the "rest" table
    before = Candidates(entries.copy())
    correction.apply(before, np.zeros(4, dtype=np.float32))
    assert before.ids.tolist() == [0, 1, 2, 900] and before.logits[3] == -898.0
    correction.accept(900)  # the habit is now in the output
    correction.accept(1)
    after = Candidates(entries.copy())
    correction.apply(after, np.zeros(4, dtype=np.float32))
    assert after.ids.tolist() == [0, 1, 2], "an emitted habit no longer joins the candidates"
    assert after.logits.tolist() == [0.0, -2.0, -2.0], "an avoided token stays avoided after it was emitted"


@pytest.mark.parametrize("size,k", [(10, 20), (64, 64), (65, 64), (300, 7)])
def test_best_positions_with_few_candidates_nans_and_masked_tokens(size: int, k: int) -> None:
    from localpers.engine.sampler_chain import TOKEN_DATA

    rng = np.random.default_rng(size)
    entries = np.zeros(size, dtype=TOKEN_DATA)
    entries["id"] = np.arange(size)
    entries["logit"] = rng.integers(-5, 5, size).astype(np.float32)
    entries["logit"][rng.choice(size, size // 3, replace=False)] = -np.inf  # llama.cpp's masked tokens
    entries["logit"][[0, size - 1]] = np.nan
    valid = [i for i in range(size) if not np.isnan(entries["logit"][i])]
    expected = sorted(valid, key=lambda i: (-entries["logit"][i], i))[:k]
    assert Candidates(entries).best_positions(k).tolist() == expected


def test_a_generation_that_fills_the_context_says_so(backbone: Backbone) -> None:
    """It stopped where the context ended reporting "length", as if --max-tokens had been reached."""
    with Engine(backbone.path, n_ctx=48, tap_layers=None) as small:
        ends = tuple((token, -np.inf) for token in range(small.n_vocab) if small.is_end_of_generation(token))
        result = generate(
            small, "Count: one two three", max_tokens=200, sampling=SamplerSettings(logit_bias=ends)
        )
    assert result.stop_reason == "context" and result.prompt_tokens + len(result.tokens) == 48 + 1
