"""The publisher's training prompts: plain, or history-conditioned as the device will build them.

With `--history-examples K` (K > 0) every training item's prompt shows the author's own earlier outputs
(`localpers.users.history_prompt`, the same functions the device uses), chosen from that author's items dated
strictly before it (items without dates: the items before it in file order), which is what a device has
when the author writes that item. An item with no earlier item keeps the plain prompt, so the same
adapters serve users with no history. Stages sft, pairs and features all take their prompts from here.
"""

from __future__ import annotations

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


def user_prompts(context: PublishContext, user: CorpusUser) -> list[str]:
    """The training prompt of each of `user`'s items, in history order."""
    task = get_task(context.options.task)
    chosen = prompt_format(context)
    if chosen is None:
        return [task.prompt_for(item.input) for item in user.history]
    return [
        conditioned_prompt(task, item.input, earlier_items(user, i), chosen)
        for i, item in enumerate(user.history)
    ]
