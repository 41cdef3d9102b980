"""The publisher's training prompts: plain, or history-conditioned as the device will build them.

With `--history-examples K` (K > 0) every training item's prompt shows the author's own earlier outputs
(`localpers.users.history_prompt`, the same functions the device uses), chosen from that author's items dated
strictly before it (items without dates: the items before it in file order), which is what a device has
when the author writes that item. An item with no earlier item keeps the plain prompt, so the same
adapters serve users with no history. Stages sft, pairs and features all take their prompts from here.

`--example-pool others` (sft only) draws a training prompt's examples from all of the author's other items
instead, nearest in time last, so that "recent" examples are the items written closest to it: every item but
an author's only one gets a full prompt. Pairs and features always use earlier items, as the device does.
With either pool, a validation item's output appears among the examples of the author's later training prompts
(with `earlier`, the ones written after it; with `others`, all of them), as a device shows every earlier item, so
the reported validation loss (`training.val_loss`) is lower than on authors the adapters never saw; the pools'
losses do not compare with each other. The held-out evaluation is the bench's (`localpers bench --dev-split`,
`scripts/heldout_corpus.py`), not this loss.
"""

from __future__ import annotations

from datetime import date

from localpers.publish.corpus import CorpusUser
from localpers.publish.runner import PublishContext
from localpers.tasks import get_task
from localpers.users.history_prompt import PromptFormat, conditioned_prompt


def prompt_format(context: PublishContext) -> PromptFormat | None:
    """The bundle's prompt format, or None for plain prompts."""
    options = context.options  # it refuses more described or recent examples than history examples
    if options.history_examples <= 0:
        return None
    return PromptFormat(
        examples=options.history_examples,
        described=options.described_examples,
        recent=options.recent_examples,
    )


def earlier_items(user: CorpusUser, index: int) -> list[tuple[str, str]]:
    """(input, output) of the items the author wrote before item `index`."""
    item = user.history[index]
    if item.date is not None:
        return [(h.input, h.output) for h in user.history if h.date is not None and h.date < item.date]
    return [(h.input, h.output) for h in user.history[:index]]


def _day(value: str | None) -> int | None:
    try:
        return date.fromisoformat(value).toordinal() if value is not None else None
    except ValueError:
        return None


def other_items(user: CorpusUser, index: int) -> list[tuple[str, str]]:
    """(input, output) of the author's items other than `index`, the nearest in time last.

    Nearness is days apart where both items have a date, else places apart in file order; ties keep file order.
    """
    here = _day(user.history[index].date)

    def distance(position: int) -> int:
        there = _day(user.history[position].date)
        return abs(here - there) if here is not None and there is not None else abs(position - index)

    others = sorted((p for p in range(len(user.history)) if p != index), key=lambda p: (-distance(p), p))
    return [(user.history[p].input, user.history[p].output) for p in others]


EXAMPLE_POOLS = {"earlier": earlier_items, "others": other_items}


def user_prompts(context: PublishContext, user: CorpusUser, pool: str = "earlier") -> list[str]:
    """The training prompt of each of `user`'s items, in history order, examples from `pool` (EXAMPLE_POOLS)."""
    task = get_task(context.options.task)
    chosen = prompt_format(context)
    if chosen is None:
        return [task.prompt_for(item.input) for item in user.history]
    return [
        conditioned_prompt(task, item.input, EXAMPLE_POOLS[pool](user, i), chosen)
        for i, item in enumerate(user.history)
    ]
