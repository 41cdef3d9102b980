"""Cases the ninety-third session's mutation round found untested (each let a changed line pass every test).

Metrics: `mean_interval` is a mean with a bootstrap of means (not a median), refuses no values and reports its
figures to five decimals and in double precision, its bounds are numpy's interpolated percentiles of the means
of `default_rng(seed)`'s rows of indices (what a reader of results.json recomputes from its seed); the paired
bootstraps refuse arrays that are not 1-D, and one seed draws the same resampled queries for every interval of a
run.

Targets: a figure exactly at its limit meets it (ROUGE-1 ratio, decode and rewrite costs, state, fit time), an
interval whose low end is exactly 0 does not exclude 0, a cost either method did not record and a run with no
authors are not judged, a fit on other than 20 items is not judged, the targets of a method other than the
default are that method's, and what each measured says (signs, digits, the unchanged authors only when there are
any).

History prompts: a demonstration shows its article's first 60 words (the instruction not counted) cut to 600
characters, a listed example up to 200 characters whole, titles are listed under their own header, a manifest's
bad version, example count or retrieval is refused and its described examples leave fewer recent ones, more
described than retrieved examples shows them all as demonstrations, the shared prefix shows no more recent
outputs than the prompt does, an end of the recent block past the pool or before its start is clamped, and a
series is looked for among the series search depth's closest items that share a word with the text, not among
as many as the prompt shows or those sharing none.

History index: an index asked for dense retrieval searches by meaning, `examples_for` opens with the recent
outputs it is asked for, a cache written for a history is read back for that history without parsing it again
(the default load writing one), a rebuilt index holds only its task's items, the cache holds the user's text as written, not as escapes, one of twice the largest history's size is read,
and one that is not an object, nested past the parser's depth, or whose tasks or rows have another shape is
rebuilt from the history; a note after the text is refused for a conditioned prompt, and a user with no index shares no prefix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_bench_targets import _results

from localpers.bench.metrics import Interval, mean_interval, paired_bootstrap, paired_ratio_bootstrap
from localpers.bench.targets import check_targets
from localpers.errors import LocalpersError
from localpers.tasks import cut_text, get_task
from localpers.users import history_index
from localpers.users.history_index import (
    INDEX_FILE,
    INDEX_VERSION,
    HistoryIndex,
    prompt_for_user,
    shared_prefix_for_user,
)
from localpers.users.history_prompt import (
    PromptFormat,
    build_prompt,
    conditioned_prompt,
    shared_prefix,
    shown_examples,
)


def test_mean_interval_is_the_mean_and_a_bootstrap_of_means_not_medians() -> None:
    """rouge1_ci in results.json: resampled means of [0, 0, 0, 1] are k/4, P(k >= 3) = 13/256 ~ 5.1%, so the
    97.5th percentile is 0.75; resampled medians would reach 1.0, and the median of the values is 0."""
    interval = mean_interval([0.0, 0.0, 0.0, 1.0], n_resamples=4000)
    assert (interval.low, interval.mean, interval.high) == pytest.approx((0.0, 0.25, 0.75))


def test_mean_interval_is_the_interpolated_percentile_interval_of_its_seeds_resamples() -> None:
    """Recomputed from the seed as results.json states it; 7 resamples, so most percentiles fall between two."""
    values = [0.1, 0.25, 0.35, 0.7, 0.05, 0.9]
    rows = np.random.default_rng(3).integers(0, len(values), size=(7, len(values)))
    means = np.asarray(values)[rows].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    interval = mean_interval(values, n_resamples=7, seed=3)
    expected = (float(low), float(np.mean(values)), float(high))
    assert (interval.low, interval.mean, interval.high) == pytest.approx(expected, rel=1e-12, abs=0)
    assert interval.low not in means and interval.high not in means


def test_mean_interval_of_no_values_is_refused() -> None:
    with pytest.raises(ValueError, match="no values to bootstrap"):
        mean_interval([])


def test_paired_bootstraps_refuse_scores_that_are_not_one_dimensional() -> None:
    """A 1 x 2 array has one row: taken as one pair, it would pass as a figure without an interval."""
    for bootstrap in (paired_bootstrap, paired_ratio_bootstrap):
        with pytest.raises(ValueError, match="two 1-D arrays of one length, got \\(1, 2\\) and \\(1, 2\\)"):
            bootstrap([[0.1, 0.2]], [[0.1, 0.3]])


def test_one_seed_draws_the_same_resampled_queries_for_every_interval() -> None:
    """results.json records one seed for all its intervals: against a baseline of 0 (a difference) or 1 (a ratio)
    the paired intervals are the plain mean interval of the candidate's scores."""
    scores = [0.11, 0.52, 0.23, 0.94, 0.37]
    plain = mean_interval(scores, n_resamples=500, seed=7)
    difference = paired_bootstrap(scores, [0.0] * 5, n_resamples=500, seed=7)
    ratio = paired_ratio_bootstrap(scores, [1.0] * 5, n_resamples=500, seed=7)
    expected = pytest.approx((plain.low, plain.mean, plain.high))
    assert (difference.low, difference.mean, difference.high) == expected
    assert (ratio.low, ratio.mean, ratio.high) == expected


def test_an_interval_is_listed_to_five_decimals_unless_asked_otherwise() -> None:
    interval = Interval(0.123456789, 0.2345678, 0.3456789)
    assert interval.as_list() == [0.12346, 0.23457, 0.34568]
    assert interval.as_list(2) == [0.12, 0.23, 0.35]


def _met(results: dict[str, Any]) -> list[bool | None]:
    return [check.met for check in check_targets(results)]


def test_figures_exactly_at_their_limits_meet_the_targets() -> None:
    """ROUGE-1 >= 1.25x, decode <= 1.10x, rewrite <= 1.3x, state <= 10,000 bytes, fit <= 10 s: all inclusive."""
    results = _results()
    results["deltas_vs_global"]["card-auto"]["rouge1_ratio"] = [1.1, 1.25, 1.4]
    results["methods"]["card-auto"].update(ms_per_token=11.0, rewrite_ms=390.0, fit_s_per_user=10.0)
    results["methods"]["card-auto"]["bytes_per_user"] = 10_000
    assert _met(results) == [True] * 7
    results["methods"]["card-auto"].update(bytes_per_user=4_000, max_bytes_per_user=10_000)
    assert _met(results) == [True] * 7


def test_an_interval_whose_low_end_is_exactly_zero_does_not_exclude_zero() -> None:
    results = _results()
    results["deltas_vs_global"]["card-auto"]["rouge1"] = [0.0, 0.05, 0.1]
    results["deltas_vs_global"]["card-auto"]["gold_logprob"] = [0.0, 0.1, 0.2]
    assert _met(results) == [False, True, False, True, True, True, True]


@pytest.mark.parametrize("method", ["card-auto", "global"])
@pytest.mark.parametrize("key", ["ms_per_token", "rewrite_ms"])
def test_a_cost_either_method_did_not_record_is_not_judged(method: str, key: str) -> None:
    results = _results()
    results["methods"][method][key] = None if method == "card-auto" else 0.0
    check = check_targets(results)[3 if key == "ms_per_token" else 4]
    assert (check.met, check.measured) == (None, "not recorded")


def test_a_run_with_no_authors_has_no_author_target() -> None:
    results = _results()
    results["authors_vs_global"]["card-auto"].update(authors=0, improved=0, unchanged=0, worse=0)
    check = check_targets(results)[1]
    assert (check.met, check.measured) == (None, "no per-author scores")


def test_a_fit_on_other_than_twenty_items_is_not_judged() -> None:
    check = check_targets(_results(history_limit=10))[6]
    assert check.met is None
    assert (
        check.measured == "6.00 s/user on 10 items; judged with --history-limit 20 (or scripts/bench_fit.py)"
    )


def test_the_targets_of_another_method_are_judged_on_that_methods_figures() -> None:
    results = _results()
    results["methods"]["card"] = {**results["methods"]["card-auto"], "ms_per_token": 20.0}
    results["deltas_vs_global"]["card"] = {
        **results["deltas_vs_global"]["card-auto"],
        "rouge1": [-0.1, 0.0, 0.1],
    }
    results["authors_vs_global"]["card"] = results["authors_vs_global"]["card-auto"]
    met = [check.met for check in check_targets(results, method="card")]
    assert met == [False, True, True, False, True, True, True]


def test_what_each_target_measured_is_written_with_its_signs_and_digits() -> None:
    checks = check_targets(_results())
    assert checks[0].measured == "1.330x [1.120, 1.550]; difference +0.0500 [+0.0200, +0.0800]"
    assert checks[1].measured == "10/15 (67%, 1 unchanged); R-1 / global over authors 1.300 [1.050, 1.600]"
    assert checks[2].measured == "+0.100 [+0.050, +0.150] nats/token"
    results = _results()
    results["authors_vs_global"]["card-auto"].update(unchanged=0, worse=5)
    assert check_targets(results)[1].measured.startswith("10/15 (67%); ")


HEADLINE = get_task("headline")
INSTRUCTION = "Generate a headline for the following article: "


def _demonstrated(article: str, output: str = "Out A") -> str:
    """The prompt for a new text with one history item, shown as a demonstration."""
    return conditioned_prompt(
        HEADLINE, "A new text.", [(article, output)], PromptFormat(examples=1, described=1)
    )


def test_a_demonstration_shows_its_articles_first_sixty_words_the_instruction_not_counted() -> None:
    words = [f"w{n}" for n in range(61)]
    whole = _demonstrated(INSTRUCTION + " ".join(words[:60]))
    assert "article: w0 w1 " in whole and "w58 w59\nHeadline: Out A\n" in whole and " ..." not in whole
    cut = _demonstrated(INSTRUCTION + " ".join(words))
    assert "w58 w59 ...\nHeadline: Out A\n" in cut and "w60" not in cut


def test_a_demonstrations_article_is_cut_to_six_hundred_characters() -> None:
    content = " ".join(f"{n:02d}" + "y" * 18 for n in range(60))  # 60 words, 1,259 characters
    prompt = _demonstrated(content)
    assert HEADLINE.prompt_for(cut_text(content, 600)) + " Out A\n" in prompt


def test_a_listed_example_of_two_hundred_characters_is_shown_whole() -> None:
    text = "A new text."
    assert "- " + "x" * 200 + "\n" in build_prompt(HEADLINE, text, ["x" * 200])
    assert "x" * 201 not in build_prompt(HEADLINE, text, ["x" * 201])


def test_titles_are_listed_under_their_own_header() -> None:
    prompt = build_prompt(get_task("title"), "Some abstract.", ["An Old Title"])
    assert prompt.startswith("Titles this author wrote before:\n- An Old Title\n\n")


def _entry(**fields: Any) -> dict[str, Any]:
    return {"format": "history-examples", "version": 1, "examples": 5, "retrieval": "bm25", **fields}


def test_a_format_without_described_examples_writes_no_described_field() -> None:
    assert PromptFormat(examples=5).to_manifest() == _entry()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"version": True}, "prompt format version True is not supported"),  # True == 1, but not a version
        ({"examples": 21}, "'prompt.examples' must be a whole number from 1 to 20"),
        ({"retrieval": "minilm"}, "'prompt.retrieval' must be 'bm25'"),
    ],
)
def test_a_manifests_prompt_entry_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(LocalpersError, match=message):
        PromptFormat.from_manifest(_entry(**fields))


def test_a_manifest_of_twenty_examples_and_described_ones_leaving_fewer_recent_are_read() -> None:
    assert PromptFormat.from_manifest(_entry(examples=20)).recent == 19
    described = PromptFormat.from_manifest(_entry(version=2, described=3))
    assert (described.examples, described.described, described.recent) == (5, 3, 2)


def test_more_described_than_retrieved_examples_shows_every_one_as_a_demonstration() -> None:
    pool = [("Rain falls on the city.", "Rain Again"), ("Snow falls on the hills.", "Snow Again")]
    shown = shown_examples(HEADLINE, "Rain and snow fall.", pool, PromptFormat(examples=3, described=3))
    assert [example.described for example in shown] == [True, True]
    prompt = conditioned_prompt(HEADLINE, "Rain and snow fall.", pool, PromptFormat(examples=3, described=3))
    assert "this author wrote before" not in prompt


POOL = [
    ("The council approved new bike lanes.", "Bike Lanes Win"),
    ("A bakery won a prize for its bread.", "Sourdough Takes Gold"),
    ("Rail service adds late trains.", "Later Trains"),
    ("The museum opens on Fridays.", "Museum Nights"),
]


def test_the_shared_prefix_shows_no_more_recent_outputs_than_the_prompt() -> None:
    """A format whose recent outputs outnumber its examples shows `examples` of them."""
    prompt_format = PromptFormat(examples=2, recent=3)
    prefix = shared_prefix(HEADLINE, POOL, prompt_format)
    assert prefix == "Headlines this author wrote before:\n- Later Trains\n- Museum Nights"
    assert conditioned_prompt(HEADLINE, "Trains and bread.", POOL, prompt_format).startswith(prefix + "\n")


def test_an_end_of_the_recent_block_past_the_pool_or_before_it_is_clamped() -> None:
    """The device's format for 3 examples; a negative end taken as is would retrieve one example more."""
    prompt_format = PromptFormat(examples=3, recent=2, series=3)
    text = "Bread and trains."

    def prompt(end: int | None) -> str:
        return conditioned_prompt(HEADLINE, text, POOL, prompt_format, recent_end=end)

    assert prompt(10) == prompt(None)
    assert shared_prefix(HEADLINE, POOL, prompt_format, recent_end=10) == shared_prefix(
        HEADLINE, POOL, prompt_format
    )
    assert prompt(-1) == prompt(0)


SERIES = [
    ("Football predictions, opening round.", "Week 1 Picks: Our Best Bets"),
    ("Football predictions, second round.", "Week 2 Picks: Our Best Bets"),
    ("Football predictions, third round.", "Week 3 Picks: Our Best Bets"),
]


def _whys(text: str, pool: list[tuple[str, str]], prompt_format: PromptFormat) -> list[tuple[str, str]]:
    return [(example.output, example.why) for example in shown_examples(HEADLINE, text, pool, prompt_format)]


def test_a_series_is_looked_for_beyond_the_closest_items_the_prompt_shows() -> None:
    """One example shown: the closest item is not in a series, the next closest is, and the text is about it."""
    pool = [("The council approved new bike lanes.", "Bike Lanes Win: Council Says Yes"), *SERIES]
    whys = _whys(
        "Council bike lanes vote, and football predictions", pool, PromptFormat(examples=1, series=3)
    )
    assert whys == [(output, "series") for _, output in SERIES]


def test_a_series_sharing_no_word_with_the_text_is_not_shown_though_it_is_most_of_the_history() -> None:
    pool = [("The council approved new bike lanes.", "Bike Lanes Win: Council Says Yes"), *SERIES]
    whys = _whys("Council backs bike lanes", pool, PromptFormat(examples=1, series=3))
    assert whys == [("Bike Lanes Win: Council Says Yes", "closest")]


def test_an_index_asked_for_dense_retrieval_searches_by_meaning() -> None:
    """No word in common with the bike lanes item, "a" in common with the bakery one: BM25 would pick the bakery."""
    pool = [
        ("The council approved new bike lanes on Main Street.", "Bike Lanes Win: Council Says Yes"),
        ("A bakery won a national prize for its sourdough bread.", "Rise And Shine: Sourdough Takes Gold"),
        ("Rail service adds late trains on weekends.", "Night Owls Rejoice: Later Trains"),
    ]
    query = INSTRUCTION + "Cyclists get protected paths downtown after a city vote."
    assert HistoryIndex(HEADLINE, pool).examples_for(query, 1) == ["Rise And Shine: Sourdough Takes Gold"]
    dense = HistoryIndex(HEADLINE, pool, retrieval="minilm")
    assert dense.examples_for(query, 1) == ["Bike Lanes Win: Council Says Yes"]


def test_examples_for_opens_with_the_recent_outputs_asked_for() -> None:
    index = HistoryIndex(HEADLINE, list(POOL))
    assert index.examples_for("Bike lanes for the council.", 2, recent=1) == [
        "Museum Nights",
        "Bike Lanes Win",
    ]


def _items(*pairs: tuple[str, str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(task="headline", input=text, output=output) for text, output in pairs]


def test_a_cache_is_read_back_for_its_history_without_parsing_the_history(tmp_path: Path) -> None:
    text = "the history file's text\n"
    items = _items(("Rain falls on the city.", "Rain Again"))

    def parse_again() -> list[SimpleNamespace]:
        raise AssertionError("the history was parsed again though its cache matches")

    HistoryIndex.load(tmp_path, text, lambda: items, HEADLINE)  # no cache yet: parsed, and the cache written
    assert (tmp_path / INDEX_FILE).is_file()
    assert HistoryIndex.load(tmp_path, text, parse_again, HEADLINE).pool == [
        ("Rain falls on the city.", "Rain Again")
    ]


def test_the_cache_holds_the_users_text_as_written(tmp_path: Path) -> None:
    HistoryIndex.write(tmp_path, "h\n", _items(("北京推出新交通政策", "Café Öffnet")))
    raw = (tmp_path / INDEX_FILE).read_text(encoding="utf-8")
    assert "北京推出新交通政策" in raw and "Café Öffnet" in raw


def test_an_index_rebuilt_from_the_history_holds_only_its_tasks_items(tmp_path: Path) -> None:
    items = _items(("Rain falls on the city.", "Rain Again"))
    items.append(SimpleNamespace(task="title", input="An abstract.", output="A Title"))
    rebuilt = HistoryIndex.load(tmp_path, "h\n", lambda: items, HEADLINE)
    cached = HistoryIndex.load(tmp_path, "h\n", lambda: items, HEADLINE)
    assert rebuilt.pool == cached.pool == [("Rain falls on the city.", "Rain Again")]


def _matching_cache(text: str, tasks: Any) -> str:
    """A cache of the right version whose digest matches the history `text`, holding `tasks`."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return json.dumps({"version": INDEX_VERSION, "history_sha256": digest, "tasks": tasks})


@pytest.mark.parametrize(
    "cache",
    [
        "[1]",
        "[" * 100_000 + "]" * 100_000,
        _matching_cache("h\n", []),
        _matching_cache("h\n", {"headline": {}}),
        _matching_cache("h\n", {"headline": [["An article.", "A Headline", "a third field"]]}),
    ],
    ids=["not-an-object", "nested-too-deep", "tasks-not-an-object", "rows-not-a-list", "a-row-of-three"],
)
def test_a_damaged_cache_is_rebuilt_from_the_history(tmp_path: Path, cache: str) -> None:
    (tmp_path / INDEX_FILE).write_text(cache, encoding="utf-8")
    items = _items(("Rain falls on the city.", "Rain Again"))
    assert HistoryIndex.load(tmp_path, "h\n", lambda: items, HEADLINE).pool == [
        ("Rain falls on the city.", "Rain Again")
    ]


def test_a_cache_up_to_twice_the_largest_historys_size_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache holds every item's text as the history does, plus its own keys: allowed twice the history's limit."""
    items = _items(*[(f"Article number {n} about the rain.", f"Rain Headline {n}") for n in range(40)])
    HistoryIndex.write(tmp_path, "h\n", items)
    size = (tmp_path / INDEX_FILE).stat().st_size
    monkeypatch.setattr(history_index, "MAX_HISTORY_FILE_BYTES", (size + 1) // 2)

    def parse_again() -> list[SimpleNamespace]:
        raise AssertionError("a cache within its limit was not read")

    assert len(HistoryIndex.load(tmp_path, "h\n", parse_again, HEADLINE).pool) == 40


def test_a_note_after_the_text_is_refused_for_a_conditioned_prompt() -> None:
    index = HistoryIndex(HEADLINE, list(POOL))
    with pytest.raises(ValueError, match="a note after the text is for plain prompts only"):
        prompt_for_user("headline", "A new text.", PromptFormat(examples=2), index, note="Attributes: short")


def test_a_user_without_an_index_shares_no_prefix() -> None:
    assert shared_prefix_for_user("headline", PromptFormat(examples=2, recent=1), None) == ""
