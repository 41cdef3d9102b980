"""History ordinals: a removal keeps the other items' fit groups, so their prompts and cached pairs stay valid.

Before, the fit counted its prompt groups by position: removing a full history's oldest item moved every later
item into another group, no prompt matched the y- cache, and a 500-item refit took 370 s instead of 21 s.
"""

from __future__ import annotations

import json
import random

import pytest

from localpers.methods.card.fit_prompts import prompts_and_blocks
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat
from localpers.users.ordinals import ORDINALS_FILE, ordinals_of, read_ordinals
from localpers.users.store import UserStore

FORMAT = PromptFormat(examples=5, recent=4)
TOPICS = ["rail", "bakery", "river", "school", "budget", "storm", "museum", "harbor", "clinic", "garden"]


def history(count: int, start: int = 0) -> list[HistoryItem]:
    return [
        HistoryItem.create(
            "headline",
            f"The {TOPICS[n % len(TOPICS)]} story number {n} about the town's week.",
            f"{TOPICS[n % len(TOPICS)].title()} Update {n}",
        )
        for n in range(start, start + count)
    ]


@pytest.mark.parametrize("offset", [0, 1, 3, 6])
def test_ordinals_that_are_positions_give_the_prompts_counted_by_position(offset: int) -> None:
    items = history(23)
    by_position = prompts_and_blocks(items, FORMAT, history_offset=offset)
    by_ordinal = prompts_and_blocks(items, FORMAT, ordinals=[offset + n for n in range(len(items))])
    assert by_ordinal == by_position


def test_removing_the_oldest_keeps_the_later_items_prompts() -> None:
    user = UserStore().create("ann")
    items = history(40)
    user.save_history(items)
    first_prompts = prompts_and_blocks(items, FORMAT, ordinals=ordinals_of(user.dir, items))
    before = {item.id: pair for item, pair in zip(items, first_prompts, strict=True)}
    remaining = items[1:]
    user.save_history(remaining)
    ordinals = ordinals_of(user.dir, remaining)
    assert ordinals == list(range(1, 40))
    after = prompts_and_blocks(remaining, FORMAT, ordinals=ordinals)
    removed = f"- {items[0].output}\n"
    for item, pair in zip(
        remaining, after, strict=True
    ):  # only the prompts that showed the removed item change
        assert pair == before[item.id] or removed in before[item.id][0], item
    kept = sum(before[item.id] == pair for item, pair in zip(remaining, after, strict=True))
    assert kept >= len(remaining) // 2
    # counted by position, every later item changed group and no prompt stayed the same
    by_position = prompts_and_blocks(remaining, FORMAT)
    assert not any(before[item.id] == pair for item, pair in zip(remaining, by_position, strict=True))


def test_ordinals_follow_appends_removals_and_hand_edits() -> None:
    user = UserStore().create("bob")
    items = history(6)
    user.save_history(items)
    assert read_ordinals(user.dir) == {item.id: n for n, item in enumerate(items)}
    user.save_history([*items[:2], *items[3:]])  # one removed from the middle
    user.save_history([*items[:2], *items[3:], *history(2, start=6)])  # two appended
    stored = user.history()
    assert ordinals_of(user.dir, stored) == [0, 1, 3, 4, 5, 6, 7]
    user.save_history(list(reversed(stored)))  # reordered by hand: each item after a larger ordinal is new
    assert ordinals_of(user.dir, user.history()) == [7, 8, 9, 10, 11, 12, 13]


def test_a_missing_or_damaged_file_counts_by_the_stored_positions() -> None:
    user = UserStore().create("cay")
    items = history(8)
    user.save_history(items)
    (user.dir / ORDINALS_FILE).unlink()  # a user from before ordinals: the fit counts by position
    assert ordinals_of(user.dir, items) is None
    user.save_history(items[2:])  # the first change after the upgrade keeps the old positions
    assert ordinals_of(user.dir, items[2:]) == list(range(2, 8))
    (user.dir / ORDINALS_FILE).write_text(json.dumps({"ordinals": {items[2].id: "x"}}))
    assert ordinals_of(user.dir, items[2:]) is None


def test_updated_ordinals_always_increase_along_any_history() -> None:
    generator = random.Random(7)
    user = UserStore().create("dee")
    pool = history(30)
    current: list[HistoryItem] = []
    for _ in range(40):
        kept = [item for item in current if generator.random() > 0.2]
        fresh = [item for item in pool if item not in kept and generator.random() < 0.1]
        current = kept + fresh
        user.save_history(current)
        ordinals = ordinals_of(user.dir, current)
        assert ordinals is not None and all(b > a for a, b in zip(ordinals, ordinals[1:], strict=False))
