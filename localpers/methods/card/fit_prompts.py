"""The prompts a CARD fit evaluates for a user's history items, and which items fit the engine's context.

Each item is prompted as the publisher trained the head: conditioned on the user's outputs before it, chosen
as `rewrite` chooses them (a block of recent outputs and the closest). Items are taken in groups of
`FIT_BLOCK_GROUP` that share one block, so the batched pass evaluates each block once. This module only builds
text and counts tokens; `pairs.PairBuilder` generates y- and scores pairs on these prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from localpers.engine import Engine
from localpers.methods.card.prompting import read_within
from localpers.tasks import cut_text, get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import (
    DEMONSTRATION_CHARS,
    EXAMPLE_CHARS,
    PromptFormat,
    conditioned_prompt,
    shared_prefix,
)
from localpers.users.series import SHOWN as SERIES_SHOWN

# The fit's items show their recent outputs in blocks: the items of each group of this many (groups counted
# along the history by the items' ordinals, their order of addition) all show the block of items before the
# group, so each block is evaluated once and shared by the group's batched sequences, as the device's own
# prompts share one block from rewrite to rewrite. Counting from the first item keeps every old item's prompt
# (and cached y-) when items are added; counting by ordinal keeps them when an item is removed.
# Items in the first group, or in a group that starts before a history limit's window, show the items just
# before them.
FIT_BLOCK_GROUP = 4
# Tokens of the conditioned prompt's header, counted once when sizing an item's prompt.
HEADER_TOKENS = 16


def prompts_and_blocks(
    items: Sequence[HistoryItem],
    prompt_format: PromptFormat | None,
    history_offset: int = 0,
    ordinals: Sequence[int] | None = None,
) -> list[tuple[str, str]]:
    """Each item's prompt and the shared block of recent outputs it starts with ("" when none).

    The groups count along the history: by the items' `ordinals` (increasing; `localpers.users.ordinals`), so a
    removal leaves the other items' groups in place, or else by position, `history_offset` being how many of the
    user's items come before `items`. Both count alike while nothing was removed.

    With a history-conditioned bundle, item i shows the user's outputs among items 0..i-1 (what the user had
    written by then, as `localpers publish` builds its pairs), chosen as `rewrite` chooses them: a block of
    recent outputs (`FIT_BLOCK_GROUP`: up to 3 items older than the most recent ones) and the closest; the
    first item, and every item on a plain bundle (`prompt_format` None), gets the plain task prompt.
    """
    if ordinals is not None and len(ordinals) != len(items):
        raise ValueError(f"{len(ordinals)} ordinals for {len(items)} items")
    counted = list(ordinals) if ordinals is not None else [history_offset + n for n in range(len(items))]
    prompts = []
    first_in_group = 0
    for index, item in enumerate(items):
        task = get_task(item.task)
        if prompt_format is None:
            prompts.append((task.prompt_for(item.input), ""))
            continue
        pool = [(earlier.input, earlier.output) for earlier in items[:index] if earlier.task == item.task]
        group_start = counted[index] - counted[index] % FIT_BLOCK_GROUP
        # the first of `items` in this item's group (0 when the group began at or before the window's start)
        first_in_group = min(first_in_group, index)
        while first_in_group < index and counted[first_in_group] < group_start:
            first_in_group += 1
        while first_in_group > 0 and counted[first_in_group - 1] >= group_start:
            first_in_group -= 1
        since_group = sum(1 for later in items[first_in_group:index] if later.task == item.task)
        block_end = len(pool) - since_group if first_in_group > 0 else len(pool)
        prompt = conditioned_prompt(task, item.input, pool, prompt_format, recent_end=block_end)
        prompts.append((prompt, shared_prefix(task, pool, prompt_format, recent_end=block_end)))
    return prompts


def items_within_context(
    engine: Engine, items: Sequence[HistoryItem], prompt_format: PromptFormat | None
) -> tuple[list[HistoryItem], int]:
    """The items whose pairs fit the engine's context (an article read from its start as far as it fits, as
    `rewrite` reads it), and how many were left out.

    The task limits (`localpers.tasks`) keep English-like text well inside it; text that tokenizes far more
    densely (CJK, emoji) would overflow and stop the whole fit. So, as `prompting.prompt_tokens` does for a
    rewrite, a headline's or title's article is cut shorter until it fits (`prompting.read_within`), and
    only an item that fits even so, or a task that must carry its whole text, is left out. Counted for each
    item: its prompt (its own text, plus room for the most examples and demonstrations the format shows: the
    longest ones the history holds) and the longer of its output and the y- the fit generates.
    """
    room = _examples_room(engine, items, prompt_format)
    kept = []
    for item in items:
        task = get_task(item.task)
        output = len(engine.tokenize(" " + task.scored_output(item.output), add_bos=False))
        budget = engine.n_ctx - room - max(output, task.default_max_tokens)
        prompt = len(engine.tokenize(task.prompt_for(item.input)))
        if prompt > budget and task.cuts_long_input:
            content = task.content(item.input)
            read, tokens = read_within(
                engine,
                content,
                min(len(content), task.max_input_chars),
                budget,
                lambda count, task=task, content=content: engine.tokenize(
                    task.prompt_for(cut_text(content, count))
                ),
            )
            item, prompt = replace(item, input=cut_text(content, read)), len(tokens)
        if prompt <= budget:
            kept.append(item)
    return kept, len(items) - len(kept)


def _examples_room(engine: Engine, items: Sequence[HistoryItem], prompt_format: PromptFormat | None) -> int:
    """Tokens a conditioned prompt may spend on examples: the longest of `items`' outputs, as many as a prompt
    shows (a series' members in the closest one's place included), and likewise the longest demonstrations.

    A prompt shows distinct items, so this bounds every prompt; it is not the longest output times the count,
    which let one dense output (a headline of emoji) leave no room for any item and make the whole fit a cold
    start.
    """
    if prompt_format is None or not items:
        return 0

    def tokens(text: str) -> int:
        return len(engine.tokenize(text, add_bos=False))

    def longest(lengths: list[int], count: int) -> int:
        return sum(sorted(lengths, reverse=True)[:count])

    examples = [2 + tokens(" " + cut_text(item.output, EXAMPLE_CHARS)) for item in items]  # "- ...\n"
    articles = [
        tokens(
            (task := get_task(item.task)).prompt_for(cut_text(task.content(item.input), DEMONSTRATION_CHARS))
        )
        for item in items
    ]
    shown = prompt_format.examples
    if prompt_format.series:
        shown = max(shown, prompt_format.recent + SERIES_SHOWN)
    described = prompt_format.described
    return (
        longest(examples, shown) + longest(articles, described) + longest(examples, described) + HEADER_TOKENS
    )
