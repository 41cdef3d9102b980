"""The batched pass of a CARD fit: y- generated and pairs scored several prompts at a time (`engine.batch`).

For each item whose pair is not in the memo yet, one `PromptJob` generates y- (unless cached) and scores y+ and
y- teacher-forced after the same prompt, sharing the prompt's block of recent outputs between the jobs of a group
where the tokenizer allows. Where y- is y+ itself or empty, only y+'s first token is scored (the opening habits'
calibration) and a zero difference is remembered. What does not fit a batched sequence, and any mix of tasks, is
left to `pairs.PairBuilder`'s one-at-a-time loop. This module reads and writes no file: its caller's `save` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from localpers.engine import Engine
from localpers.engine.batch import PromptJob, fits, group_size, run_jobs
from localpers.methods.card.head import CardHead
from localpers.methods.card.pair_keys import PairMemo, negative_key
from localpers.methods.scoring import common_prefix_length
from localpers.tasks import get_task
from localpers.users.history import HistoryItem


def score_in_batches(
    engine: Engine,
    head: CardHead,
    items: Sequence[HistoryItem],
    prompts: Sequence[str],
    blocks: Sequence[str],
    known: dict[str, str],
    cluster: int,
    memo: PairMemo,
    seconds: dict[str, float],
    report: Callable[[int], None],
    save: Callable[[], bool],
) -> None:
    """Generate the missing y- into `known` and score the unscored pairs into `memo`.

    After each group of prompts `save` writes what was found, then `report` is told how many items are done
    (those found in the memo first, then each group's). The engine must already run the base adapter.
    """
    tasks = {item.task for item in items}
    if not engine.batch_sequences or len(tasks) != 1:
        return
    task = get_task(tasks.pop())
    jobs: list[PromptJob] = []
    owners: list[tuple[HistoryItem, str, str]] = []
    left_to_the_loop = 0
    for item, prompt, block in zip(items, prompts, blocks, strict=True):
        key = negative_key(item, prompt)
        cached = known.get(key)
        if cached is not None and (cluster, prompt, item.output, cached) in memo:
            continue
        positive = engine.tokenize(" " + task.scored_output(item.output), add_bos=False)
        cached_minus = engine.tokenize(" " + cached, add_bos=False) if cached else None

        def continuations(
            text: str,
            output: str = item.output,
            fixed: str | None = cached,
            plus: list[int] = positive,
            fixed_minus: list[int] | None = cached_minus,
        ) -> list[list[int]]:
            negative = text if fixed is None else fixed
            if not negative or negative == output:
                return [plus[:1]]  # only the first token's log-probability is wanted
            return [
                plus,
                fixed_minus if fixed_minus is not None else engine.tokenize(" " + negative, add_bos=False),
            ]

        tokens = engine.tokenize(prompt)
        # a tokenizer may join the block's last token with what follows: share only what both agree on
        shared = common_prefix_length(engine.tokenize(block), tokens) if block else 0
        job = PromptJob(tokens, cached is None, continuations, shared=shared)
        if fits(job, task.default_max_tokens, max(len(positive), task.default_max_tokens + 8)):
            jobs.append(job)
            owners.append((item, prompt, key))
        else:
            left_to_the_loop += 1
    if not jobs:
        return
    ready = len(items) - len(jobs) - left_to_the_loop
    report(ready)
    size = group_size(engine)
    for start in range(0, len(jobs), size):
        group = jobs[start : start + size]
        outcomes = run_jobs(
            engine, group, max_tokens=task.default_max_tokens, stop=task.stop_strings, timings=seconds
        )
        for (item, prompt, key), job, outcome in zip(
            owners[start : start + size], group, outcomes, strict=True
        ):
            if job.generate:
                known[key] = outcome.text
            if len(outcome.scored) == 2:
                plus, minus = outcome.scored
                difference = head.sequence_feature(plus.tokens, plus.features) - head.sequence_feature(
                    minus.tokens, minus.features
                )
                memo.remember(
                    (cluster, prompt, item.output, known[key]), (difference, float(plus.logprobs[0]))
                )
            elif len(outcome.scored) == 1:
                no_difference = np.zeros(head.d, dtype=np.float32)
                memo.remember(
                    (cluster, prompt, item.output, known[key]),
                    (no_difference, float(outcome.scored[0].logprobs[0])),
                )
        save()
        report(ready + start + len(group))
