"""Prompts as the personalizer's engine sees them: a task's prompt with the user's history, or a chat.

`prompt_tokens` tokenizes a task's prompt (history-conditioned when given a format) and says how many of its
tokens every prompt of that user shares, so the engine can keep them cached between rewrites; `shown_in_prompt`
lists the history items that prompt showed (for `rewrite --examples` and the Why view).
`chat_prompt_tokens` turns `(role, content)` messages into a prompt through the backbone's chat template, or a
plain transcript for a base model. Which method sees which format is the personalizer's decision, not this
module's; it builds no sampler and decodes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from localpers.engine import Engine
from localpers.engine.context_bound import tokens_within_context
from localpers.errors import TextTooLong
from localpers.methods.scoring import common_prefix_length
from localpers.tasks import cut_text, get_task
from localpers.users.history_index import (
    HistoryIndex,
    prompt_for_user,
    shared_prefix_for_user,
    shown_for_user,
)
from localpers.users.history_prompt import PromptFormat, ShownExample

# How often a too-dense text is cut shorter before the engine is left to refuse it, and the least read of it.
CUT_ATTEMPTS = 4
MIN_CHARS_READ = 100


def prompt_tokens(
    engine: Engine,
    task: str,
    text: str,
    prompt_format: PromptFormat | None,
    history: HistoryIndex | None,
    prompt_prefix: str = "",
    note: str = "",
) -> tuple[list[int], int, int | None]:
    """`prompt_prefix` + the task's prompt as tokens, how many of them the user's prompts share, and how many
    characters of the text the prompt carries (None: all of it). `note`: a line after the text
    (`Task.prompt_for`), always whole: a cut takes the text's characters, never the note's.

    A task that writes from a text's start (headline, title) reads at most its `max_input_chars`, and fewer
    where the text tokenizes so densely that the prompt would leave no room for the output in the context
    (emoji, some scripts); a text the task must carry whole is left to the engine, which refuses it.
    """
    chosen = get_task(task)
    content = chosen.content(text)
    room = len(note) + 1 if note else 0
    read = min(len(content), chosen.max_input_chars - room) if chosen.cuts_long_input else len(content)

    def tokens_reading(count: int) -> list[int]:
        shown = text if count >= len(content) else cut_text(content, count)
        return engine.tokenize(prompt_prefix + prompt_for_user(task, shown, prompt_format, history, note))

    budget = engine.n_ctx - chosen.default_max_tokens
    if chosen.cuts_long_input:
        read, tokens = read_within(engine, content, read, budget, tokens_reading)
    else:
        tokens = tokens_reading(read)
    chars_read = read if read < len(content) else None
    prefix = shared_prefix_for_user(task, prompt_format, history)
    if not prefix:
        return tokens, 0, chars_read
    # a tokenizer may join the prefix's last token with what follows; only the tokens both agree on are shared
    return tokens, common_prefix_length(engine.tokenize(prompt_prefix + prefix), tokens), chars_read


def read_within(
    engine: Engine, content: str, read: int, budget: int, tokens_reading: Callable[[int], list[int]]
) -> tuple[int, list[int]]:
    """How many of `content`'s first characters a prompt can carry within `budget` tokens, and its tokens.

    `tokens_reading(n)` is the whole prompt reading `content`'s first n characters. From `read`, the text is cut
    shorter (at most `CUT_ATTEMPTS` times, not below `MIN_CHARS_READ`) by what its own tokens would have to
    give up; the last try is returned even when it is still over budget (the caller decides what that means).
    """
    tokens = tokens_reading(read)
    for _ in range(CUT_ATTEMPTS):
        if len(tokens) <= budget or read <= MIN_CHARS_READ:
            break
        content_tokens = len(engine.tokenize(cut_text(content, read), add_bos=False))
        room = budget - (len(tokens) - content_tokens)  # what the content may take beside the rest
        read = max(MIN_CHARS_READ, int(read * max(room, 0) / content_tokens * 0.95))
        tokens = tokens_reading(read)
    return read, tokens


def shown_in_prompt(
    task: str,
    text: str,
    prompt_format: PromptFormat | None,
    history: HistoryIndex | None,
    chars_read: int | None = None,
) -> list[ShownExample]:
    """The history items `prompt_tokens`' prompt showed, each with why; `chars_read` is the cut it returned."""
    shown = text if chars_read is None else cut_text(get_task(task).content(text), chars_read)
    return shown_for_user(task, shown, prompt_format, history)


def chat_prompt_tokens(engine: Engine, messages: Sequence[tuple[str, str]]) -> list[int]:
    """`(role, content)` messages as a prompt: the backbone's chat template when it has one, else a transcript.

    The transcript (for base models) is the lone user message itself, or `Role: content` paragraphs ending
    with `Assistant:`; its text is tokenized as plain text. A template is rendered around placeholders and only
    its own text is parsed for control tokens (`<start_of_turn>`): the messages are tokenized as plain text, so
    in neither case can a message smuggle in control tokens.
    """
    if engine.has_chat_template:
        tokens = _templated_tokens(engine, messages)
        if not tokens or tokens[0] != engine.bos_token:
            tokens.insert(0, engine.bos_token)
        if len(tokens) > engine.n_ctx:
            raise _chat_too_long(len(tokens), engine.n_ctx)
        return tokens
    return tokens_within_context(engine, chat_transcript(messages))


def _templated_tokens(engine: Engine, messages: Sequence[tuple[str, str]]) -> list[int]:
    """The chat template's text with control tokens parsed, each message's content as plain text where the
    template put it (a template may drop or move a message: Gemma's moves a system message into the next user
    turn); a message is never parsed for control tokens."""
    marks = [f"\ue000{index}\ue001" for index in range(len(messages))]  # private-use: in no template
    rendered = engine.chat_prompt([(role, mark) for (role, _), mark in zip(messages, marks, strict=True)])
    tokens: list[int] = []
    position = 0
    for found in _MARK.finditer(rendered):
        tokens += engine.tokenize(rendered[position : found.start()], add_bos=False, special=True)
        index = int(found[1])
        if index < len(messages):
            left = engine.n_ctx - len(tokens)  # a long chat is refused before all of it is tokenized
            tokens += tokens_within_context(engine, messages[index][1], add_bos=False, limit=max(left, 0))
            if len(tokens) > engine.n_ctx:
                raise _chat_too_long(len(tokens), engine.n_ctx)
        position = found.end()
    return tokens + engine.tokenize(rendered[position:], add_bos=False, special=True)


def _chat_too_long(tokens: int, context: int) -> TextTooLong:
    return TextTooLong(
        f"text too long: {tokens}+ tokens exceed the model's context of {context}; shorten the chat"
    )


_MARK = re.compile("\ue000([0-9]+)\ue001")


def chat_transcript(messages: Sequence[tuple[str, str]]) -> str:
    """A chat as plain text for a backbone without a chat template (see `chat_prompt_tokens`)."""
    if len(messages) == 1 and messages[0][0] == "user":
        return messages[0][1]
    turns = [f"{role.capitalize()}: {content.strip()}" for role, content in messages]
    return "\n\n".join([*turns, "Assistant:"])


def transcript_stops(messages: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Where a reply to `chat_transcript(messages)` ends: at the next turn a base model writes on its own.

    Without them a reply runs on into invented "User:" and "Assistant:" turns until its token limit. A lone user
    message is no transcript (it is continued as plain text), so nothing is added for it.
    """
    if len(messages) == 1 and messages[0][0] == "user":
        return ()
    # "\n\nUser:" ends the reply before the blank line that separates turns, "\nUser:" where the model wrote none
    return tuple(f"{gap}{role}:" for role in ("User", "Assistant", "System") for gap in ("\n\n", "\n"))
