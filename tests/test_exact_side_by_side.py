"""EXACT's search with a greedy step's candidates scored side by side: the step-wise greedy selection, the
engine's output mask, and `SideBySideScorer` against one-at-a-time scoring."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from test_exact import INSTRUCTION, SHOUTED, bundle_dir, item, personalizer  # noqa: F401 - fixtures

from localpers.engine import Engine
from localpers.engine.backbone import Backbone
from localpers.engine.llama import llama_cpp
from localpers.engine.model import SEQUENCE_CELLS
from localpers.methods.attributes import ATTRIBUTES
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.exact import PairMargins, attributed_prompt, greedy_select
from localpers.methods.scoring import PrefixScorer, token_logprobs
from localpers.methods.scoring_batch import SideBySideScorer, score_group, shared_length

# Side by side and one at a time split a prompt's tokens into other llama.cpp batches, and on this quantized
# backbone a token's log-probability then moves by up to ~0.3 nats (CPU kernels round differently for another
# batch layout; tests/test_batch.py allows 0.4 per token). Summed over y+ and y-, a margin moved by up to 1.38
# nats (mean 0.41) over 255 margins of the three SHOUTED pairs on the tests' bundle (AMD EPYC, AVX2), about as
# far as one-at-a-time scoring is from scoring each prompt fresh (up to 1.37 there). 2.0 is 1.45x the largest.
MARGIN_NOISE = 2.0


# --------------------------------------------------------------------------------------- greedy, step by step


def _weights() -> dict[str, float]:
    rng = np.random.default_rng(1)
    weights = {name: float(rng.uniform(-1.0, 0.5)) for name in ATTRIBUTES}
    weights.update(Formal=2.0, Direct=1.9, Code=0.1)
    return weights


def _margin(attributes: tuple[str, ...]) -> float:
    weights = _weights()
    bonus = 3.0 if {"Formal", "Code"} <= set(attributes) else 0.0
    return -0.5 + sum(weights[name] for name in attributes) + bonus


def test_greedy_scores_each_step_in_one_call_and_selects_as_one_at_a_time() -> None:
    calls: list[list[tuple[str, ...]]] = []

    def margins(sets: list[tuple[str, ...]]) -> list[float]:
        calls.append(list(sets))
        return [_margin(attributes) for attributes in sets]

    batched = greedy_select(library=ATTRIBUTES, k=3, margins=margins)
    assert batched == greedy_select(_margin, ATTRIBUTES, k=3)
    assert batched.attributes == ("Formal", "Code", "Direct")
    # the plain prompt is scored with the first step's candidates, so the gain filter compares one path's numbers
    assert [len(sets) for sets in calls] == [1 + 42, 41, 40]
    assert calls[0] == [(), *((name,) for name in ATTRIBUTES)]
    assert calls[1] == [("Formal", name) for name in ATTRIBUTES if name != "Formal"]
    assert batched.evaluations == 1 + 42 + 41 + 40
    # k beyond the library stops at the library's size
    assert len(greedy_select(library=ATTRIBUTES[:2], k=3, margins=margins).attributes) == 2


def test_greedy_ties_go_to_the_first_listed_attribute_and_a_nan_is_never_chosen() -> None:
    library = ("Concise", "Vivid", "Humor", "Formal")

    def margins(sets: list[tuple[str, ...]]) -> list[float]:
        values = {"Concise": float("nan"), "Vivid": 1.0, "Humor": 2.0, "Formal": 2.0}
        return [sum(values[name] for name in attributes[-1:]) for attributes in sets]

    selection = greedy_select(library=library, k=3, margins=margins)
    assert selection.attributes == ("Humor", "Formal", "Vivid")
    assert selection.step_margins == [2.0, 2.0, 1.0] and selection.evaluations == 1 + 4 + 3 + 2
    one_at_a_time = greedy_select(lambda attributes: margins([attributes])[0], library, k=3)
    assert one_at_a_time == selection


def test_greedy_takes_one_margin_function_and_the_right_number_of_values() -> None:
    with pytest.raises(TypeError, match="margin or margins"):
        greedy_select(_margin, ATTRIBUTES, k=1, margins=lambda sets: [0.0] * len(sets))
    with pytest.raises(TypeError, match="margin or margins"):
        greedy_select(library=ATTRIBUTES, k=1)
    with pytest.raises(ValueError, match="2 values for 43 attribute sets"):  # the empty set and 42 candidates
        greedy_select(library=ATTRIBUTES, k=1, margins=lambda sets: [0.0, 0.0])


# --------------------------------------------------------------------------------------- the engine's output mask


def test_a_batch_of_sequences_returns_the_rows_its_mask_marks(backbone: Backbone) -> None:
    with Engine(backbone.path, n_ctx=256, batch_sequences=2, tap_layers=(-2, -1)) as engine:
        prompt = engine.tokenize(INSTRUCTION + "The zoo welcomed two baby pandas.\nHeadline:")
        positions, sequences = range(len(prompt)), [1] * len(prompt)
        rows, features = engine.eval_sequences(prompt, positions, sequences, all_outputs=True)
        rows, features = np.array(rows), features.copy()
        engine.forget_sequence(1)
        mask = [index % 3 == 0 for index in range(len(prompt))]
        picked, picked_features = engine.eval_sequences(prompt, positions, sequences, outputs=mask)
        engine.forget_sequence(1)
        # the same rows to float32 rounding: another CPU's kernels may round fewer rows otherwise
        np.testing.assert_allclose(picked, rows[mask], rtol=0, atol=1e-5 * float(np.abs(rows).max()))
        # the last layer runs on the output rows only, and on fewer of them its features round otherwise (measured:
        # 0.00075 at most, on values up to ~900)
        scale = float(np.abs(features).max())
        np.testing.assert_allclose(picked_features, features[mask], rtol=0, atol=1e-5 * scale)
        for wrong in ([False] * len(prompt), mask[:-1]):
            with pytest.raises(ValueError, match="one flag per token"):
                engine.eval_sequences(prompt, positions, sequences, outputs=wrong)
        with pytest.raises(ValueError, match="not both"):
            engine.eval_sequences(prompt, positions, sequences, all_outputs=True, outputs=mask)


# --------------------------------------------------------------------------------------- the scorer


def _empty(engine: Engine, sequence: int) -> bool:
    return llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(engine._ctx), sequence) == -1


def _prompts(engine: Engine, article: str, sets: list[tuple[str, ...]]) -> list[list[int]]:
    return [engine.tokenize(attributed_prompt("headline", INSTRUCTION + article, a)) for a in sets]


@pytest.fixture
def small_engine(backbone: Backbone, request: pytest.FixtureRequest) -> Iterator[Engine]:
    engine = Engine(backbone.path, n_ctx=256, tap_layers=None, batch_sequences=4, n_batch=request.param)
    yield engine
    engine.close()


@pytest.mark.parametrize("small_engine", [512, 8], indirect=True, ids=["one-decode", "decodes-of-8"])
def test_a_prompt_in_a_batched_sequence_scores_exactly_as_in_sequence_0_with_the_same_batches(
    small_engine: Engine,
) -> None:
    """The batched sequence adds no error of its own: the same tokens in the same llama.cpp batches give the same
    numbers in sequence 0 (the prompt's own tokens and y+ in one evaluation, then y- after the prompt); identical
    on the CPUs measured, and held to 1e-4 nats, far under the batching noise's tenths of a nat, for others."""
    engine = small_engine
    prompts = _prompts(engine, SHOUTED[0][0], [("Concise", "Vivid"), ("Concise", "Humor")])
    shared = shared_length(prompts)
    prompt = prompts[1]
    plus = engine.tokenize(" TWO BABY PANDAS ARRIVE!!!", add_bos=False)
    minus = engine.tokenize(" Zoo welcomes pandas", add_bos=False)
    scorer = PrefixScorer(engine)
    scorer.hold(prompt[:shared])
    ((batched_plus, batched_minus),) = score_group(engine, shared, [prompt], [plus, minus])
    assert all(_empty(engine, sequence) for sequence in range(1, 5))
    own = prompt[shared:]
    rows, _ = engine.eval(own + plus[:-1], all_positions=True)
    expected_plus = token_logprobs(rows[len(own) - 1 :], plus).sum()
    first = np.array(rows[len(own) - 1])
    engine.truncate(len(prompt))
    rows, _ = engine.eval(minus[:-1], all_positions=True)
    expected_minus = token_logprobs(first[None], minus[:1]).sum() + token_logprobs(rows, minus[1:]).sum()
    assert batched_plus == pytest.approx(expected_plus, abs=1e-4)
    assert batched_minus == pytest.approx(expected_minus, abs=1e-4)


def test_side_by_side_margins_match_one_at_a_time_up_to_batch_noise(personalizer: Personalizer) -> None:  # noqa: F811
    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    sets = [("Concise", name) for name in ATTRIBUTES if name != "Concise"]  # 41: three groups of 16 at most
    pair = item(*SHOUTED[0])
    sequential = PairMargins(PrefixScorer(engine), pair, "Zoo Welcomes Two Baby Pandas")
    expected = [sequential(attributes) for attributes in sets]
    scorer = SideBySideScorer(engine)
    done: list[int] = []
    batched = PairMargins(scorer, pair, "Zoo Welcomes Two Baby Pandas").many(sets, done.append)
    assert done == [16, 16, 9] and all(_empty(engine, s) for s in range(1, engine.batch_sequences + 1))
    assert batched == pytest.approx(expected, abs=MARGIN_NOISE)
    assert len({round(value, 3) for value in batched}) > 30  # each candidate's own margin, not one repeated
    # what the scorer counts: the shared prefix once, then each candidate's own prompt tokens, y+ and y- but
    # their last tokens; without reuse, every candidate's whole prompt
    prompts = _prompts(engine, SHOUTED[0][0], sets)
    shared = shared_length(prompts)
    scored = len(sequential.positive) - 1 + len(sequential.negative) - 1
    assert scorer.evaluated_tokens == shared + sum(len(p) - shared + scored for p in prompts)
    assert scorer.requested_tokens == sum(len(p) + scored for p in prompts)
    # the scorer goes on from the prefix it left in sequence 0, one at a time as side by side
    before = scorer.evaluated_tokens
    continued = scorer.score_each(prompts[:1], [sequential.positive])
    assert scorer.evaluated_tokens - before == len(prompts[0]) - shared + len(sequential.positive) - 1
    reference = PrefixScorer(engine)
    reference.hold(prompts[0][:shared])
    assert continued == reference.score_each(prompts[:1], [sequential.positive])


def test_side_by_side_keeps_each_prompt_its_own_scores(personalizer: Personalizer) -> None:  # noqa: F811
    """Three articles after one instruction: y+ fits one article far better than the others, and each prompt's
    log-probability stays with that prompt (a mixed-up row or sequence would move it by far more than noise)."""
    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    prompts = [engine.tokenize(attributed_prompt("headline", INSTRUCTION + a, ())) for a, _ in SHOUTED]
    headlines = [engine.tokenize(" " + h, add_bos=False) for _, h in SHOUTED]
    expected = PrefixScorer(engine).score_each(prompts, headlines)
    batched = SideBySideScorer(engine).score_each(prompts, headlines)
    for row, (wanted, got) in enumerate(zip(expected, batched, strict=True)):
        assert got == pytest.approx(wanted, abs=MARGIN_NOISE)
        others = [expected[other][row] for other in range(len(prompts)) if other != row]
        assert wanted[row] > max(others) + 2 * MARGIN_NOISE  # the tolerance tells the articles apart


def test_side_by_side_greedy_picks_within_noise_of_one_at_a_time(personalizer: Personalizer) -> None:  # noqa: F811
    """Selections can differ where candidates are nearer than the batch noise (on the tests' bundle the second
    picks of two of the three SHOUTED pairs differ); each side-by-side first pick is within that noise of the best
    one-at-a-time margin."""
    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    library = ("Concise", "Vivid", "Exclamatory", "Formal")
    for article, headline in SHOUTED:
        pair = item(article, headline)
        negative = "A calm headline about " + article.split()[1]
        sequential = PairMargins(PrefixScorer(engine), pair, negative)
        batched = PairMargins(SideBySideScorer(engine), pair, negative)
        expected = greedy_select(sequential, library, k=2)
        selection = greedy_select(library=library, k=2, margins=batched.many)
        assert selection.evaluations == expected.evaluations == 1 + 4 + 3
        # scored side by side with the first step's candidates, as the gain filter wants it
        assert selection.base_margin == pytest.approx(expected.base_margin, abs=MARGIN_NOISE)
        first_step = {name: sequential((name,)) for name in library}
        assert first_step[selection.attributes[0]] >= max(first_step.values()) - MARGIN_NOISE
        assert selection.margin == pytest.approx(sequential(selection.attributes), abs=MARGIN_NOISE)


def test_what_does_not_fit_a_batched_sequence_is_scored_one_at_a_time(
    personalizer: Personalizer,  # noqa: F811
    backbone: Backbone,
) -> None:
    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    prompts = _prompts(engine, SHOUTED[1][0], [("Concise",), ("Vivid",), ("Humor",)])
    short = engine.tokenize(" BUS FARES HALVED!!!", add_bos=False)
    too_long = short * (SEQUENCE_CELLS // len(short) + 1)
    assert SideBySideScorer(engine).score_each([], [short]) == []
    for continuations in ([short, too_long], [short]):
        alone = PrefixScorer(engine).score_each(prompts[:1], continuations)  # a single prompt: one at a time
        assert SideBySideScorer(engine).score_each(prompts[:1], continuations) == alone
    assert SideBySideScorer(engine).score_each(prompts, [short, too_long]) == PrefixScorer(engine).score_each(
        prompts, [short, too_long]
    )
    with Engine(backbone.path, n_ctx=256, tap_layers=None) as plain:  # no batched sequences at all
        prompts = _prompts(plain, SHOUTED[1][0], [("Concise",), ("Vivid",)])
        assert SideBySideScorer(plain).score_each(prompts, [short]) == PrefixScorer(plain).score_each(
            prompts, [short]
        )


def test_a_group_stopped_halfway_leaves_the_batched_sequences_empty_and_the_next_scores_as_before(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    prompts = _prompts(engine, SHOUTED[2][0], [("Concise",), ("Vivid",), ("Humor",)])
    continuations = [
        engine.tokenize(" " + text, add_bos=False) for text in ("MARATHON!!!", "Record marathon")
    ]
    before = SideBySideScorer(engine).score_each(prompts, continuations)
    scorer = SideBySideScorer(engine)
    real = engine.eval_sequences
    decodes = 0

    def stopped_at_the_second(*args: object, **kwargs: object) -> object:
        nonlocal decodes
        decodes += 1
        if decodes == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "eval_sequences", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        scorer.score_each(prompts, continuations)
    monkeypatch.setattr(engine, "eval_sequences", real)
    assert all(_empty(engine, sequence) for sequence in range(1, engine.batch_sequences + 1))
    assert scorer.score_each(prompts, continuations) == before


def test_the_selection_cache_keys_searches_scored_side_by_side_apart_from_one_at_a_time() -> None:
    """Side by side picks otherwise than one at a time (llama.cpp's numbers move with the batching), so a refit does
    not mix the old searches into a new index; an index naming no search reads its records as before."""
    from localpers.methods import exact_cache

    identity = ("b" * 64, "cluster-0", 3, ["Base", "Formal"], "localpers test")
    old = exact_cache.selections_key(*identity)
    assert exact_cache.selections_key(*identity, None) == old
    assert exact_cache.selections_key(*identity, "side-by-side") != old


# --------------------------------------------------------------------------------------- one path a search

LONG_ARTICLE = (
    "Pandas arrived at the zoo on a sunny Monday morning. " * 38
)  # cut to leave the attribute line room


def _own_tokens(engine: Engine, article: str, sets: list[tuple[str, ...]]) -> int:
    """The most tokens a prompt of `sets` has past the prompts' shared prefix (what a batched sequence holds)."""
    prompts = _prompts(engine, article, sets)
    return max(len(prompt) - shared_length(prompts) for prompt in prompts)


def _searched(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    article: str,
    library: tuple[str, ...],
    positive_tokens: int | None = None,
) -> tuple[list[str], int, int]:
    """Search one pair at k=2 (y+ made `positive_tokens` long): the paths its scorings took, in order, the scorings
    its progress heard of, and the selection's evaluations."""
    from localpers.methods import scoring_batch

    engine = personalizer.engine
    engine.set_adapter("cluster-0")
    paths: list[str] = []
    group, one = scoring_batch.score_group, PrefixScorer.score

    def side_by_side(*args: object, **kwargs: object) -> object:
        paths.append("side by side")
        return group(*args, **kwargs)  # type: ignore[arg-type]

    def one_at_a_time(self: PrefixScorer, *args: object, **kwargs: object) -> object:
        paths.append("one at a time")
        return one(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scoring_batch, "score_group", side_by_side)
    monkeypatch.setattr(PrefixScorer, "score", one_at_a_time)
    margins = PairMargins(SideBySideScorer(engine), item(article, "PANDAS!!!"), "Pandas arrive")
    if positive_tokens is not None:
        margins.positive = (
            engine.tokenize(" Pandas arrive at the zoo, and the city cheers.", add_bos=False) * 40
        )[:positive_tokens]
    heard: list[int] = []
    selection = greedy_select(library=library, k=2, margins=lambda sets: margins.many(sets, heard.append))
    return paths, sum(heard), selection.evaluations


def test_a_search_whose_first_step_does_not_fit_scores_every_step_one_at_a_time(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plain prompt has more tokens past the first step's shared prefix than a later step's candidates (audit90
    #2): for a y+ between the two limits the base margin was scored one at a time and the chosen set's margin side
    by side, and the gain filter compared the two paths' numbers (up to ~1.4 nats of batching noise apart)."""
    engine, library = personalizer.engine, ("Concise", "Vivid", "Formal")
    first = _own_tokens(engine, SHOUTED[0][0], [(), *((name,) for name in library)])
    later = max(_own_tokens(engine, SHOUTED[0][0], [(f, n) for n in library if n != f]) for f in library)
    assert later < first  # the band this test needs: step 0 does not fit, step 1 would
    paths, heard, evaluations = _searched(
        personalizer, monkeypatch, SHOUTED[0][0], library, SEQUENCE_CELLS + 1 - later
    )
    assert set(paths) == {"one at a time"} and len(paths) == heard == evaluations == 1 + 3 + 2


def test_a_later_step_that_does_not_fit_has_the_whole_search_made_again_one_at_a_time(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cut text leaves a later step less shared prefix (longer attribute lines cut it at more places): step 0 fit
    a batched sequence and step 1 did not, so the base margin came side by side and the chosen set's one at a time.
    The search starts over one at a time; the progress still hears of each scoring once."""
    engine, library = personalizer.engine, ("Base", "Code", "Tech Industry Priority", "Individualistic")
    first = _own_tokens(engine, LONG_ARTICLE, [(), *((name,) for name in library)])
    later = min(_own_tokens(engine, LONG_ARTICLE, [(f, n) for n in library if n != f]) for f in library)
    assert (
        first < later
    )  # the band this test needs: step 0 fits, step 1 does not, whichever attribute it took
    paths, heard, evaluations = _searched(
        personalizer, monkeypatch, LONG_ARTICLE, library, SEQUENCE_CELLS + 1 - first
    )
    assert paths[0] == "side by side"  # the first try, given up at step 1
    assert set(paths[1:]) == {"one at a time"} and len(paths[1:]) == heard == evaluations == 1 + 4 + 3


def test_a_last_step_of_one_candidate_is_scored_side_by_side_as_the_first(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A two-name library leaves step 1 a single candidate, which was scored one at a time (a lone prompt) after a
    side-by-side step 0 (audit90 #2)."""
    paths, heard, evaluations = _searched(personalizer, monkeypatch, SHOUTED[0][0], ("Concise", "Formal"))
    assert paths == ["side by side", "side by side"] and heard == evaluations == 1 + 2 + 1


def test_both_paths_refuse_a_token_outside_the_vocabulary_in_one_line_before_evaluating(
    backbone: Backbone,
) -> None:
    """One at a time, a one-token continuation outside the vocabulary evaluated the prompt and then failed in an
    IndexError (audit90 #4); side by side refused it in one line first."""
    with Engine(backbone.path, n_ctx=256, tap_layers=None, batch_sequences=4) as engine:
        prompts = _prompts(engine, SHOUTED[0][0], [("Concise",), ("Vivid",)])
        outside = f"a continuation: token id {engine.n_vocab} is outside the vocabulary"
        for scorer in (PrefixScorer(engine), SideBySideScorer(engine)):
            for continuations in ([[engine.n_vocab]], [[5, 6], [engine.n_vocab]]):
                with pytest.raises(ValueError, match=outside):
                    scorer.score_each(prompts, continuations)
                assert scorer.evaluated_tokens == 0 and engine.n_past == 0
        with pytest.raises(ValueError, match=f"a prompt: token id {engine.n_vocab} is outside"):
            PrefixScorer(engine).score([*prompts[0], engine.n_vocab], [[5]])
        with pytest.raises(ValueError, match="a continuation: no token given"):
            PrefixScorer(engine).score(prompts[0], [[5], []])
        assert engine.n_past == 0
