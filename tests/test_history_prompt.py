"""History-conditioned prompts: format, example choice, the user's cached index, the publisher's pools."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fifo_helpers import fed_fifo

from localpers.errors import LocalpersError
from localpers.publish.corpus import CorpusUser
from localpers.publish.corpus import HistoryItem as CorpusItem
from localpers.publish.prompts import earlier_items
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_index import INDEX_FILE, HistoryIndex, prompt_for_user, shared_prefix_for_user
from localpers.users.history_prompt import (
    PromptFormat,
    build_prompt,
    conditioned_prompt,
    select_examples,
    shared_prefix,
)
from localpers.users.store import User, UserStore

HEADLINE = get_task("headline")
INSTRUCTION = "Generate a headline for the following article: "
POOL = [
    (INSTRUCTION + "The council approved new bike lanes on Main Street.", "Bike Lanes Win: Council Says Yes"),
    (
        INSTRUCTION + "A bakery won a national prize for its sourdough bread.",
        "Rise And Shine: Sourdough Takes Gold",
    ),
    (INSTRUCTION + "Rail service adds late trains on weekends.", "Night Owls Rejoice: Later Trains"),
]


def test_plain_prompt_without_examples_and_the_documented_layout_with_them() -> None:
    text = INSTRUCTION + "The museum stays open late on Fridays."
    assert build_prompt(HEADLINE, text, []) == HEADLINE.prompt_for(text)
    prompt = build_prompt(HEADLINE, text, ["Old  one", "Closest one"])
    assert prompt == (
        "Headlines this author wrote before:\n- Old one\n- Closest one\n\n"
        "Generate a headline for the following article: The museum stays open late on Fridays.\nHeadline:"
    )


def test_examples_are_the_most_similar_with_the_best_last() -> None:
    chosen = select_examples(
        HEADLINE, INSTRUCTION + "New bike lanes for the street, the council said.", POOL, 2
    )
    assert chosen[-1] == "Bike Lanes Win: Council Says Yes"
    assert len(chosen) == 2
    assert select_examples(HEADLINE, "anything", [], 5) == []
    assert len(select_examples(HEADLINE, "bread", POOL, 10)) == 3


def test_retrieval_reads_texts_only_as_far_as_a_prompt_carries_them() -> None:
    limit = HEADLINE.max_input_chars
    long_bread = (  # past what a headline prompt shows, words the text's start shares
        INSTRUCTION
        + "A bakery won a prize. "
        + "dolor " * (limit // 6 + 10)
        + "bike lanes council street " * 50,
        "Bread!",
    )
    pool = [long_bread, POOL[0], POOL[2]]
    # the text's tail is about bread; what a prompt shows of it is about bike lanes
    text = (
        INSTRUCTION
        + "The council voted on bike lanes. "
        + "ipsum " * (limit // 6)
        + "bakery prize bread " * 50
    )
    assert select_examples(HEADLINE, text, pool, 1) == ["Bike Lanes Win: Council Says Yes"]


def test_recent_examples_open_the_list_and_are_not_retrieved_twice() -> None:
    query = INSTRUCTION + "New bike lanes for the street, the council said."
    chosen = select_examples(HEADLINE, query, POOL, 2, recent=1)
    assert chosen == ["Night Owls Rejoice: Later Trains", "Bike Lanes Win: Council Says Yes"]
    both = select_examples(HEADLINE, INSTRUCTION + "Late trains at night.", POOL, 3, recent=2)
    assert both[:2] == [POOL[1][1], POOL[2][1]] and both[2] == POOL[0][1] and len(set(both)) == 3
    assert select_examples(HEADLINE, query, POOL, 2, recent=5) == [POOL[1][1], POOL[2][1]]  # capped at count
    index = HistoryIndex(HEADLINE, list(POOL))
    assert prompt_for_user("headline", query, PromptFormat(examples=2, recent=1), index) == build_prompt(
        HEADLINE, query, chosen
    )


def test_every_prompt_of_a_user_starts_with_the_shared_prefix_of_recent_examples() -> None:
    index = HistoryIndex(HEADLINE, list(POOL))
    chosen = PromptFormat(examples=3, recent=1)
    prefix = shared_prefix_for_user("headline", chosen, index)
    assert prefix == "Headlines this author wrote before:\n- Night Owls Rejoice: Later Trains"
    for text in ("New bike lanes.", "Sourdough bread prize.", "Trains at night."):
        assert prompt_for_user("headline", INSTRUCTION + text, chosen, index).startswith(prefix + "\n")
    assert shared_prefix_for_user("headline", PromptFormat(examples=3), index) == ""  # nothing shared
    assert shared_prefix_for_user("headline", chosen, HistoryIndex(HEADLINE, [])) == ""
    assert shared_prefix_for_user("headline", None, index) == ""
    # a pool no larger than the recent block: every example is shared, the task follows a blank line
    everything = PromptFormat(examples=5, recent=5)
    prefix = shared_prefix_for_user("headline", everything, index)
    assert prompt_for_user("headline", "x", everything, index).startswith(prefix + "\n\n")


def test_prompt_format_round_trips_and_refuses_bad_entries() -> None:
    chosen = PromptFormat(examples=5)
    # the device shows the user's recent outputs first and retrieves the closest one (or a series' members)
    assert PromptFormat.from_manifest(chosen.to_manifest()) == PromptFormat(examples=5, recent=4, series=3)
    assert PromptFormat.from_manifest(PromptFormat(examples=1).to_manifest()).recent == 0
    assert PromptFormat.from_manifest(PromptFormat(examples=2).to_manifest()).recent == 1
    assert PromptFormat.from_manifest(None) is None
    for bad in (
        {"format": "other"},
        {**chosen.to_manifest(), "version": 9},
        {**chosen.to_manifest(), "examples": 0},
    ):
        with pytest.raises(LocalpersError, match="manifest.json"):
            PromptFormat.from_manifest(bad)


def test_described_examples_are_the_closest_shown_as_completed_task_prompts() -> None:
    query = INSTRUCTION + "New bike lanes for the street, the council said."
    chosen = PromptFormat(examples=3, described=1)
    prompt = conditioned_prompt(HEADLINE, query, POOL, chosen)
    listed = select_examples(HEADLINE, query, POOL, 3)
    assert listed[-1] == POOL[0][1]  # the closest: shown with its article, not in the list
    assert prompt == (
        build_prompt(HEADLINE, query, listed[:2]).rsplit("\n\n", 1)[0]
        + "\n\nGenerate a headline for the following article: The council approved new bike lanes on Main Street."
        + "\nHeadline: Bike Lanes Win: Council Says Yes\n\n"
        + HEADLINE.prompt_for(query)
    )
    # a demonstration alone (nothing listed) and a long article cut to a bounded demonstration
    alone = conditioned_prompt(HEADLINE, query, POOL[:1], chosen)
    assert alone.startswith("Generate a headline") and alone.count("Headline:") == 2
    long_pool = [(INSTRUCTION + "word " * 500, "Long One")]
    assert len(conditioned_prompt(HEADLINE, query, long_pool, chosen)) < 600
    assert conditioned_prompt(HEADLINE, query, POOL, PromptFormat(examples=3)) == build_prompt(
        HEADLINE, query, listed
    )


def test_described_format_keeps_the_shared_prefix_and_describes_only_retrieved_examples() -> None:
    index = HistoryIndex(HEADLINE, list(POOL))
    device = PromptFormat.from_manifest(PromptFormat(examples=3, described=1).to_manifest())
    assert device == PromptFormat(examples=3, described=1, recent=2, series=3)
    prefix = shared_prefix_for_user("headline", device, index)
    for text in ("New bike lanes.", "Sourdough bread prize.", "Trains at night."):
        prompt = prompt_for_user("headline", INSTRUCTION + text, device, index)
        assert prompt.startswith(prefix + "\n") and prompt.count("Headline:") == 2
    # every item recent, none retrieved: nothing to describe, the plain list
    small = HistoryIndex(HEADLINE, list(POOL[:2]))
    assert prompt_for_user("headline", "x", device, small).count("Headline:") == 1


def test_manifest_versions_one_and_two() -> None:
    assert PromptFormat(examples=5).to_manifest()["version"] == 1  # older devices keep reading it
    two = PromptFormat(examples=5, described=1).to_manifest()
    assert two["version"] == 2 and two["described"] == 1
    assert PromptFormat.from_manifest({**two, "version": 1}).described == 0  # v1 has no demonstrations
    for bad in ({**two, "described": 6}, {**two, "described": True}, {**two, "described": -1}):
        with pytest.raises(LocalpersError, match="prompt.described"):
            PromptFormat.from_manifest(bad)


def _items(pool: list[tuple[str, str]]) -> list[HistoryItem]:
    return [HistoryItem.create("headline", i, o) for i, o in pool]


def test_user_index_is_written_with_the_history_and_rebuilt_when_stale() -> None:
    store = UserStore()
    user = store.create("ana")
    user.save_history(_items(POOL))
    cache = user.dir / INDEX_FILE
    assert cache.is_file()
    index = user.history_index(HEADLINE)
    assert [o for _, o in index.pool] == [o for _, o in POOL]
    # The history changes behind the cache's back (e.g. a crash between the two writes): rebuilt on read.
    user.history_path.write_text(user.history_path.read_text().splitlines()[0] + "\n")
    assert len(user.history_index(HEADLINE).pool) == 1
    assert len(json.loads(cache.read_text())["tasks"]["headline"]) == 1
    cache.write_text("{not json")
    assert len(user.history_index(HEADLINE).pool) == 1
    store.delete("ana")
    assert not cache.exists()


def test_a_history_that_is_a_fifo_is_refused_by_the_index_not_waited_on(tmp_path: Path) -> None:
    """`history_index` (every rewrite, the TUI, the API) read history.jsonl without the regular-file check the
    other readers make: a FIFO there hung `rewrite`, a link to /dev/zero read until memory ran out (store audit)."""

    user = UserStore().create("ana")
    user.save_history(_items(POOL[:1]))  # its index matches the text the FIFO gives: nothing else reads it
    line = user.history_path.read_bytes()
    user.history_path.unlink()

    with (
        fed_fifo(user.history_path, line),
        pytest.raises(LocalpersError, match=r"history.jsonl is not a regular file"),
    ):
        user.history_index(HEADLINE)


def test_a_reader_does_not_write_back_the_index_of_a_history_changed_since_it_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader that parsed the history just before an item was removed wrote its index (every item's text) back
    after the removal (store audit): the removed text was on disk again."""
    user = UserStore().create("ana")
    items = _items(POOL)
    user.save_history(items)
    (user.dir / INDEX_FILE).unlink()  # the reader rebuilds and writes it
    read = User.history
    removed: list[bool] = []

    def removed_right_after_the_read(self: User) -> list[HistoryItem]:
        parsed = read(self)
        if not removed:
            removed.append(True)
            UserStore().get("ana").save_history(items[1:], removing=True)
        return parsed

    monkeypatch.setattr(User, "history", removed_right_after_the_read)
    assert len(user.history_index(HEADLINE).pool) == len(POOL)  # what it read
    assert items[0].output not in (user.dir / INDEX_FILE).read_text(encoding="utf-8")


def test_a_remove_stopped_after_the_history_was_written_leaves_no_copy_of_the_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The index and the engine's kept states were pruned after the history was written: a stop in between left the
    removed item's text in them, and a second remove found no such item (store audit)."""
    user = UserStore().create("ana")
    items = _items(POOL)
    user.save_history(items)
    kept = user.dir / "prefix-0123456789abcdef.kv"  # an engine state of a block showing the item
    kept.write_text(items[0].output, encoding="utf-8")

    def stopped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(HistoryIndex, "write", stopped)
    with pytest.raises(KeyboardInterrupt):
        user.save_history(items[1:], removing=True)
    assert [item.id for item in user.history()] == [item.id for item in items[1:]]
    for path in user.dir.iterdir():
        if path.is_file():
            assert items[0].output not in path.read_text(encoding="utf-8", errors="replace"), path.name


def test_an_index_cached_before_histories_were_read_once_per_item_is_rebuilt() -> None:
    """A version 1 cache of a file holding a line twice matched the file's text, so the prompt kept showing the
    copy after reading the history was mended to take each item once."""
    user = UserStore().create("ana")
    user.save_history(_items(POOL))
    lines = user.history_path.read_text().splitlines(keepends=True)
    user.history_path.write_text("".join([*lines, lines[0], lines[0]]))  # joined by hand
    text = user.history_path.read_text()
    cached = {"version": 1, "history_sha256": hashlib.sha256(text.encode()).hexdigest()}
    cached["tasks"] = {"headline": [[i, o] for i, o in [*POOL, POOL[0], POOL[0]]]}  # as version 1 wrote it
    (user.dir / INDEX_FILE).write_text(json.dumps(cached))
    assert [o for _, o in user.history_index(HEADLINE).pool] == [o for _, o in POOL]


def test_prompt_for_user_is_plain_without_a_format_or_history() -> None:
    text = INSTRUCTION + "Rail adds trains."
    index = HistoryIndex(HEADLINE, POOL)
    assert prompt_for_user("headline", text, None, index) == HEADLINE.prompt_for(text)
    assert prompt_for_user("headline", text, PromptFormat(3), None) == HEADLINE.prompt_for(text)
    conditioned = prompt_for_user("headline", text, PromptFormat(3), index)
    assert conditioned.startswith("Headlines this author wrote before:\n")
    assert conditioned.endswith(HEADLINE.prompt_for(text))
    assert "Night Owls Rejoice: Later Trains\n\n" in conditioned  # the closest example sits last


def test_publisher_pools_hold_only_strictly_earlier_items() -> None:
    user = CorpusUser(
        "u1",
        (
            CorpusItem("a", "A", "2020-01-01"),
            CorpusItem("b", "B", "2020-01-02"),
            CorpusItem("c", "C", "2020-01-02"),
            CorpusItem("d", "D", "2020-01-03"),
        ),
        line=1,
    )
    assert earlier_items(user, 0) == []
    assert earlier_items(user, 2) == [("a", "A")]  # same-day items are not "before"
    assert earlier_items(user, 3) == [("a", "A"), ("b", "B"), ("c", "C")]
    undated = CorpusUser("u2", (CorpusItem("a", "A"), CorpusItem("b", "B")), line=2)
    assert earlier_items(undated, 1) == [("a", "A")]


def test_publisher_trains_with_the_described_format_it_writes_into_the_manifest(tmp_path: Path) -> None:
    from rich.console import Console

    from localpers.publish.corpus import Corpus
    from localpers.publish.options import PublishOptions
    from localpers.publish.prompts import prompt_format, user_prompts
    from localpers.publish.runner import PublishContext

    user = CorpusUser("u1", tuple(CorpusItem(i, o) for i, o in POOL), line=1)
    options = PublishOptions(
        corpus=tmp_path / "c.jsonl", out=tmp_path, history_examples=2, described_examples=1
    )
    context = PublishContext(
        options, Corpus(tmp_path / "c.jsonl", (user,)), tmp_path / "m.gguf", "0" * 64, Console()
    )
    assert prompt_format(context) == PromptFormat(examples=2, described=1)
    prompts = user_prompts(context, user)
    assert prompts[0] == HEADLINE.prompt_for(POOL[0][0])  # no earlier item: plain
    assert prompts[1].startswith(HEADLINE.prompt_for(POOL[0][0]) + " " + POOL[0][1] + "\n\n")
    assert prompts[2].count("Headline:") == 2 and prompts[2].startswith(
        "Headlines this author wrote before:\n"
    )


def test_publisher_can_train_with_the_devices_recent_examples(tmp_path: Path) -> None:
    from rich.console import Console

    from localpers.publish.corpus import Corpus
    from localpers.publish.options import PublishOptions, stage_fields
    from localpers.publish.prompts import prompt_format, user_prompts
    from localpers.publish.runner import PublishContext

    extra = (INSTRUCTION + "The council approved a budget for bike lanes.", "Budget Day")
    items = [*POOL, extra, (INSTRUCTION + "Bike lanes open on Main Street.", "Lanes Open")]
    user = CorpusUser("u1", tuple(CorpusItem(i, o) for i, o in items), line=1)
    corpus = Corpus(tmp_path / "c.jsonl", (user,))

    def context_for(recent: int) -> PublishContext:
        options = PublishOptions(
            corpus=tmp_path / "c.jsonl", out=tmp_path, history_examples=2, recent_examples=recent
        )
        return PublishContext(options, corpus, tmp_path / "m.gguf", "0" * 64, Console())

    closest, device_way = context_for(0), context_for(1)
    assert prompt_format(device_way) == PromptFormat(examples=2, recent=1)
    text = items[-1][0]
    # The device's way: the most recent earlier output first, then the closest one.
    assert user_prompts(device_way, user)[-1] == conditioned_prompt(
        HEADLINE, text, items[:-1], PromptFormat(examples=2, recent=1)
    )
    assert user_prompts(device_way, user)[-1].split("\n")[1:3] == ["- Budget Day", "- " + POOL[0][1]]
    assert user_prompts(closest, user)[-1] == conditioned_prompt(HEADLINE, text, items[:-1], PromptFormat(2))
    assert user_prompts(closest, user)[-1] != user_prompts(device_way, user)[-1]
    # Bundles published before the option keep their stage caches; using it re-runs training and pairs.
    assert "recent_examples" not in stage_fields(closest.options, "sft")
    assert stage_fields(device_way.options, "sft")["recent_examples"] == 1
    assert stage_fields(device_way.options, "pairs")["recent_examples"] == 1


def test_shared_corpus_dates_parse(tmp_path: Path) -> None:
    from localpers.publish.corpus import load_corpus

    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"user_id": "u", "history": [{"input": "x", "output": "y", "date": "2020-01-01"}]})
    )
    assert load_corpus(path).users[0].history[0].date == "2020-01-01"


def test_dense_retrieval_ranks_by_meaning_and_serves_the_same_prompts() -> None:
    """The `dense` ablation: MiniLM similarity picks the semantically closest item, through the same index API."""
    from localpers.users.retrieval import DenseIndex, make_index

    dense = DenseIndex(["Shares fell sharply on Wall Street.", "The cat slept in the sun.", "Rain all week."])
    assert dense.top("Stock markets dropped today", 1) == [0]  # no word in common with document 0
    assert sorted(dense.top("anything", 5)) == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown retrieval"):
        make_index(["a"], "tfidf")
    index = HistoryIndex(HEADLINE, list(POOL), retrieval="minilm")
    query = INSTRUCTION + "Cyclists get protected paths downtown after the city vote."
    assert index.examples_for(query, 1) == ["Bike Lanes Win: Council Says Yes"]


def test_recent_examples_can_end_before_the_pool_does_and_the_shared_prefix_follows() -> None:
    query = INSTRUCTION + "Late trains and bike lanes for the city."
    chosen = PromptFormat(examples=2, recent=1)
    # recent_end=2: the recent example is the pool's second item, the closest comes from all three
    prompt = conditioned_prompt(HEADLINE, query, POOL, chosen, recent_end=2)
    shown = [line[2:] for line in prompt.splitlines() if line.startswith("- ")]
    assert shown[0] == POOL[1][1] and len(shown) == 2 and shown[1] != POOL[1][1]
    prefix = shared_prefix(HEADLINE, POOL, chosen, recent_end=2)
    assert prefix == "Headlines this author wrote before:\n- " + POOL[1][1] and prompt.startswith(prefix)
    # the default is the pool's end, as before
    assert conditioned_prompt(HEADLINE, query, POOL, chosen) == conditioned_prompt(
        HEADLINE, query, POOL, chosen, recent_end=len(POOL)
    )
    assert shared_prefix(HEADLINE, POOL, chosen, recent_end=0) == ""


def test_publisher_can_draw_training_examples_from_all_the_authors_other_items(tmp_path: Path) -> None:
    from rich.console import Console

    from localpers.errors import LocalpersError
    from localpers.publish.corpus import Corpus
    from localpers.publish.options import PublishOptions, stage_fields
    from localpers.publish.prompts import other_items, user_prompts
    from localpers.publish.runner import PublishContext

    dates = ("2020-01-10", "2020-01-01", "2020-01-05", "2020-02-01")
    items = [*POOL, (INSTRUCTION + "Bike lanes open on Main Street.", "Lanes Open")]
    user = CorpusUser(
        "u1", tuple(CorpusItem(i, o, date=d) for (i, o), d in zip(items, dates, strict=True)), line=1
    )
    # Item 2 (Jan 5): Jan 1 and Jan 10 are 4 and 5 days away, Feb 1 is 27: the nearest comes last.
    assert [o for _, o in other_items(user, 2)] == [items[3][1], items[0][1], items[1][1]]
    # Undated items: places apart in file order, ties keep file order.
    undated = CorpusUser("u2", tuple(CorpusItem(i, o) for i, o in items), line=2)
    assert [o for _, o in other_items(undated, 1)] == [items[3][1], items[0][1], items[2][1]]

    options = PublishOptions(corpus=tmp_path / "c.jsonl", out=tmp_path, history_examples=2, recent_examples=1)
    others = PublishOptions(**{**options.__dict__, "example_pool": "others"})
    context = PublishContext(
        others, Corpus(tmp_path / "c.jsonl", (user,)), tmp_path / "m.gguf", "0" * 64, Console()
    )
    earliest = 1  # Jan 1: no earlier item, so the device's way gives it the plain prompt
    assert user_prompts(context, user)[earliest] == HEADLINE.prompt_for(items[earliest][0])
    with_others = user_prompts(context, user, "others")[earliest]
    assert with_others == conditioned_prompt(
        HEADLINE, items[earliest][0], other_items(user, earliest), PromptFormat(examples=2, recent=1)
    )
    assert with_others.split("\n")[1] == "- " + items[2][1]  # Jan 5, the nearest in time, as the recent one
    # Bundles published before the option keep their stage caches; the pairs stay the device's way.
    assert "example_pool" not in stage_fields(options, "sft")
    assert stage_fields(others, "sft")["example_pool"] == "others"
    assert "example_pool" not in stage_fields(others, "pairs")
    with pytest.raises(LocalpersError, match="--example-pool 'later'"):
        PublishOptions(corpus=tmp_path / "c.jsonl", out=tmp_path, example_pool="later")


def test_a_conditioned_prompt_stays_bounded_whatever_the_history_holds() -> None:
    from localpers.tasks import cut_text
    from localpers.users.history_prompt import DEMONSTRATION_CHARS, EXAMPLE_CHARS

    huge = "y" * 20_000  # one "word": nothing to cut at but the limit
    pool = [(huge, huge)] * 3 + [("An article about rain.", "Rain Headline")] * 2
    prompt = conditioned_prompt(HEADLINE, huge, pool, PromptFormat(examples=5, described=1, recent=4))
    budget = 5 * EXAMPLE_CHARS + DEMONSTRATION_CHARS + HEADLINE.max_input_chars + 2 * EXAMPLE_CHARS + 400
    assert len(prompt) < budget
    assert cut_text(huge, EXAMPLE_CHARS) in prompt  # a listed example, cut and marked
    # ordinary examples are shown whole: the shared data's longest headline is 118 characters
    assert "- Rain Headline\n" in prompt
