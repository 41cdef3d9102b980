"""Series in a user's history (a formula the user repeats) and how a conditioned prompt shows one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localpers.tasks import get_task
from localpers.users.history import item_id
from localpers.users.history_index import HistoryIndex, prompt_for_user, shown_for_user
from localpers.users.history_prompt import (
    PromptFormat,
    build_prompt,
    conditioned_prompt,
    shared_prefix,
    shown_examples,
)
from localpers.users.series import (
    MIN_SIZE,
    about_series,
    distinct_series,
    find_series,
    history_series,
    overlap,
    subject_words,
    word_set,
)

HEADLINE = get_task("headline")
INSTRUCTION = "Generate a headline for the following article: "


def _item(article: str, headline: str) -> tuple[str, str]:
    return (INSTRUCTION + article, headline)


# Three instances of a weekly formula, then five unrelated items (the most recent).
SERIES = [
    _item(
        "My cat sits on the laptop every morning.", "21 Of The Funniest Tweets About Cats And Dogs (May 1-7)"
    ),
    _item(
        "The dog ate the homework, a tweet said.", "24 Of The Funniest Tweets About Cats And Dogs (May 8-14)"
    ),
    _item(
        "A cat judged my cooking on the internet.",
        "19 Of The Funniest Tweets About Cats And Dogs (May 15-21)",
    ),
]
OTHERS = [
    _item("The council approved new bike lanes.", "Bike Lanes Win: Council Says Yes"),
    _item("A bakery won a national bread prize.", "Rise And Shine: Sourdough Takes Gold"),
    _item("Rail service adds late trains on weekends.", "Night Owls Rejoice: Later Trains"),
    _item("The museum stays open late on Fridays.", "Museum Nights Are Back"),
    _item("A storm closed the coastal road.", "Storm Shuts Coast Road"),
]
POOL = SERIES + OTHERS
CAT_QUERY = INSTRUCTION + "My cat knocked the cup off the table and looked at me."
DEVICE = PromptFormat(examples=5, recent=4, series=MIN_SIZE)


def test_word_overlap_and_the_first_series_among_the_closest() -> None:
    assert word_set("Top 5 top") == frozenset({"top", "5"})
    assert overlap(word_set("a b c d"), word_set("a b c e")) == 0.75
    assert overlap(frozenset(), word_set("a")) == 0.0
    outputs = ["Top 5 Films (May)", "Top 5 Films (June)", "Rain Due", "Top 5 Films (July)"]
    assert find_series(outputs, [1, 2]) == [0, 1, 3]
    assert find_series(outputs, [2, 1]) == [0, 1, 3]  # "Rain Due" has no series; the next closest does
    assert find_series(outputs, [2]) == []
    assert find_series(outputs, [1], min_size=4) == []
    sets = [word_set(output) for output in outputs]
    assert find_series(outputs, [3], word_sets=sets) == find_series(outputs, [3])


def test_a_series_among_the_closest_is_shown_by_its_members_after_the_recent_outputs() -> None:
    recent = [headline for _, headline in OTHERS[-4:]]
    members = [headline for _, headline in SERIES]
    assert conditioned_prompt(HEADLINE, CAT_QUERY, POOL, DEVICE) == build_prompt(
        HEADLINE, CAT_QUERY, recent + members
    )
    # without the rule (the publisher's training format) one closest output is retrieved, as before
    plain = conditioned_prompt(HEADLINE, CAT_QUERY, POOL, PromptFormat(examples=5, recent=4))
    assert plain.count("Funniest Tweets") == 1
    # a text near no series gets the usual closest output
    bread = INSTRUCTION + "Bakery bread wins prize again."
    assert conditioned_prompt(HEADLINE, bread, POOL, DEVICE) == conditioned_prompt(
        HEADLINE, bread, POOL, PromptFormat(examples=5, recent=4)
    )


def test_the_series_keeps_the_shared_prefix_and_never_repeats_a_recent_output() -> None:
    prompt = conditioned_prompt(HEADLINE, CAT_QUERY, POOL, DEVICE)
    assert prompt.startswith(shared_prefix(HEADLINE, POOL, DEVICE) + "\n")
    # the series is the most recent history: its members are already shown, so the closest other output is retrieved
    recent_series = OTHERS[:1] + SERIES + OTHERS[1:2]
    shown = conditioned_prompt(HEADLINE, CAT_QUERY, recent_series, DEVICE)
    assert shown.count("Funniest Tweets") == 3
    assert shown == conditioned_prompt(HEADLINE, CAT_QUERY, recent_series, PromptFormat(examples=5, recent=4))
    # only the most recent members not in the recent block, oldest first
    long_series = [
        _item(f"Cat tweet number {n}.", f"{n} Of The Funniest Tweets About Cats And Dogs (Week {n})")
        for n in range(10, 16)
    ]
    prompt = conditioned_prompt(HEADLINE, CAT_QUERY, long_series + OTHERS, DEVICE)
    listed = [line for line in prompt.splitlines() if "Funniest" in line]
    assert listed == [f"- {n} Of The Funniest Tweets About Cats And Dogs (Week {n})" for n in (13, 14, 15)]


def test_the_devices_index_shows_the_same_series_as_the_composition() -> None:
    index = HistoryIndex(HEADLINE, list(POOL))
    for text in (CAT_QUERY, INSTRUCTION + "Bakery bread wins prize again."):
        assert prompt_for_user("headline", text, DEVICE, index) == conditioned_prompt(
            HEADLINE, text, POOL, DEVICE
        )
    assert PromptFormat().series == 0  # the publisher trains without it


def test_a_series_is_shown_for_a_text_about_it_or_when_it_is_most_of_the_history() -> None:
    assert subject_words("The Dogs of the city, a glass") == frozenset({"dog", "city", "glass"})
    documents = ["My cat sits on the laptop. 21 Of The Funniest Tweets About Cats"]
    assert about_series("A cat on a roof", documents, history_size=10)  # "cat" and "cats" agree
    assert not about_series("On the way to the market", documents, history_size=10)  # function words only
    assert about_series("On the way to the market", documents * 5, history_size=10)  # half the history
    # BM25 finds the series "close" to a text sharing only "the" with it; it is not shown there
    market = INSTRUCTION + "On the way to the market."
    plain = PromptFormat(examples=5, recent=4)
    assert conditioned_prompt(HEADLINE, market, POOL, DEVICE) == conditioned_prompt(
        HEADLINE, market, POOL, plain
    )
    # but an author whose history is mostly the series gets it for any text
    long_series = [
        _item(f"Cat tweet number {n}.", f"{n} Of The Funniest Tweets About Cats And Dogs (Week {n})")
        for n in range(10, 16)
    ]
    mostly = long_series + OTHERS
    assert conditioned_prompt(HEADLINE, market, mostly, DEVICE).count("Funniest") == 3


def test_words_are_found_in_every_script() -> None:
    """An English-only pattern gave CJK, Arabic and Hebrew text no words (BM25's "closest" was then always the
    oldest item, and no series was ever found) and cut "Köln" into "k" and "ln" (text audit)."""
    from localpers.users.retrieval import Bm25Index, words

    assert words("Don't STOP-now, 2 cats_dogs") == [
        "don",
        "t",
        "stop",
        "now",
        "2",
        "cats",
        "dogs",
    ]  # as before
    assert words("Straße in Köln") == ["strasse", "in", "köln"]
    assert words("مكتبة عامة جديدة") == ["مكتبة", "عامة", "جديدة"]
    assert words("北京一周") == ["北京", "京一", "一周"]
    assert words("2026年の東京") == ["2026", "年の", "の東", "東京"]
    library, zoo = "北区将建新图书馆", "城市动物园迎来长颈鹿宝宝"
    assert Bm25Index([library, zoo, "市中心新开一家面包店"]).top("动物园的长颈鹿", 1) == [1]
    weekly = [f"每周回顾：北京这一周（第{n}周）" for n in (10, 11, 12)]
    assert find_series([*weekly, library, zoo], [0]) == [0, 1, 2]
    # three unrelated headlines that share only a year are not a series
    assert (
        find_series(["2025年春节旅游创纪录", "2025年新能源车销量大增", "2025年高考报名人数公布", zoo], [0])
        == []
    )


def test_a_text_sharing_only_function_words_of_another_language_is_not_about_a_series() -> None:
    documents = [
        "Wochenrückblick: Die Woche in Berlin (KW 11)",
        "Wochenrückblick: Die Woche in Berlin (KW 12)",
    ]
    bridge = "Die Stadt Köln baut eine neue Brücke über den Rhein für Fußgänger und Radfahrer."
    assert not about_series(bridge, documents, history_size=20)
    assert about_series("Die Woche im Rückblick: was in Berlin geschah", documents, history_size=20)


def test_shown_examples_are_the_prompts_examples_with_why() -> None:
    shown = shown_examples(HEADLINE, CAT_QUERY, POOL, DEVICE)
    assert [example.why for example in shown] == ["recent"] * 4 + ["series"] * 3
    assert build_prompt(HEADLINE, CAT_QUERY, [e.output for e in shown]) == conditioned_prompt(
        HEADLINE, CAT_QUERY, POOL, DEVICE
    )
    by_output = {headline: article for article, headline in POOL}
    assert [e.id for e in shown] == [item_id("headline", by_output[e.output], e.output) for e in shown]
    bread = INSTRUCTION + "Bakery bread wins prize again."
    assert [e.why for e in shown_examples(HEADLINE, bread, POOL, DEVICE)] == ["recent"] * 4 + ["closest"]
    demo_format = PromptFormat(examples=3, recent=1, described=1)
    demo = shown_examples(HEADLINE, bread, POOL, demo_format)
    assert [(e.why, e.described) for e in demo] == [("recent", False), ("closest", False), ("closest", True)]
    assert demo[-1].to_json()["described"] is True and "described" not in demo[0].to_json()
    index = HistoryIndex(HEADLINE, list(POOL))
    assert shown_for_user("headline", CAT_QUERY, DEVICE, index) == shown
    assert shown_for_user("headline", CAT_QUERY, None, index) == []  # a plain prompt shows nothing
    assert shown_for_user("headline", CAT_QUERY, DEVICE, None) == []


def test_distinct_series_lists_each_formula_once_the_latest_continued_first() -> None:
    outputs = [
        "Top 5 Films (May)",
        "Rain Due",
        "Top 5 Films (June)",
        "Week In Cats: 3 Naps",
        "Week In Cats: 4 Naps",
        "Top 5 Films (July)",
        "Week In Cats: 5 Naps",
        "Bridge Opens",
    ]
    assert distinct_series(outputs) == [[3, 4, 6], [0, 2, 5]]
    assert distinct_series(outputs, min_size=4) == []
    assert distinct_series([]) == []


def test_history_series_groups_by_task_with_item_ids() -> None:
    from localpers.users.history import HistoryItem

    items = [HistoryItem.create("headline", f"cat {n}", f"Week {n} In Cats: Naps") for n in (1, 2, 3)]
    items += [HistoryItem.create("title", f"cat {n}", f"Week {n} In Cats: Naps") for n in (1, 2)]
    (found,) = history_series(items)
    assert (found.task, found.size, found.latest) == ("headline", 3, "Week 3 In Cats: Naps")
    assert found.ids == tuple(item.id for item in items[:3])
    assert found.to_json() == {"task": "headline", "size": 3, "latest": found.latest, "ids": list(found.ids)}


@settings(max_examples=400, deadline=None)
@given(
    outputs=st.lists(
        st.lists(
            st.sampled_from(
                ["the", "a", "of", "top", "5", "films", "may", "june", "cat", "dog", "week", "best", "new"]
            ),
            max_size=7,
        ).map(" ".join),
        max_size=30,
    ),
    similarity=st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0]),
    min_size=st.integers(min_value=1, max_value=4),
)
def test_distinct_series_finds_what_comparing_every_pair_finds(
    outputs: list[str], similarity: float, min_size: int
) -> None:
    """distinct_series compared every output with every other (quadratic: ~100 ms at 500 items, after every
    accept in the TUI); it now looks only at outputs sharing one of the rarest words. Same result as the
    comparison of every pair that `find_series` makes."""
    sets = [word_set(output) for output in outputs]
    counted: set[int] = set()
    expected: list[list[int]] = []
    for position in reversed(range(len(outputs))):
        if position in counted:
            continue
        members = find_series(outputs, [position], min_size=min_size, similarity=similarity, word_sets=sets)
        if members:
            expected.append(members)
            counted.update(members)
    assert distinct_series(outputs, min_size=min_size, similarity=similarity) == expected
