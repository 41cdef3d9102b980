"""Prompt templates for the writing tasks and their stop rules.

A task turns the user's text into the backbone prompt and says when generation stops. The
`headline` template matches the shared news-headlines data, whose `input` field already holds the
full instruction; `prompt_for` leaves such inputs unchanged. A task also sets the default strength of the
word-only repetition rule (`localpers.engine.repeated_words`): on for headline and title, where the model
repeats a word about seven times as often as the authors do (docs/RESULTS.md 0ze), off where repeating a
word is normal prose. Every task but `free` ends its output at the first newline; `paraphrase` joins its text
into one paragraph for that.

Every prompt must fit the backbone's context (1,024 tokens, the user's examples and the output included), so a
task bounds the text it carries. Headline and title write from the start of a text, as a headline is written
from an article's lede: `prompt_for` keeps the first `max_input_chars` and marks the cut with " ...". A
task that rewrites the whole text (paraphrase, free) cannot drop any of it: `check_text` refuses a longer text
with a one-line error, and the history refuses such items on import. Outputs are bounded likewise
(`check_output`). The limits are characters, not tokens, because this module knows nothing of models: at
~4 characters a token (English) a prompt stays well inside the context. Text that tokenizes far more densely
is handled where the tokens are known: a rewrite and the fit read less of it (`localpers.methods.card.prompting`,
`fit_prompts.items_within_context`).
"""

import unicodedata
from dataclasses import dataclass

from localpers.errors import InputError, TextTooLong

__all__ = ["TextTooLong"]  # raised by `Task.check_text`, and by the engine for a prompt past the context

CUT_MARK = " ..."


@dataclass(frozen=True)
class Task:
    """A prompt template: `{text}` is replaced by the user's input."""

    name: str
    instruction: str
    template: str
    one_line: bool
    default_max_tokens: int
    description: str
    repeated_word_penalty: float = 0.0  # nats, the word rule's default for this task (0 = off)
    max_input_chars: int = 1000  # of the text without the instruction; see the module docstring
    max_output_chars: int = 1000
    cuts_long_input: bool = False  # True: a longer text is cut to its start; False: it is refused
    # the text's lines are joined into one paragraph (a one-line rewrite of all of it)
    joins_lines: bool = False

    def content(self, text: str) -> str:
        """`text` without this task's instruction, which the shared data puts in front of every input."""
        stripped = text.strip()
        if self.instruction and stripped.startswith(self.instruction):
            stripped = stripped[len(self.instruction) :].strip()
        return stripped

    def prompt_for(self, text: str, note: str = "") -> str:
        """The prompt for `text` (its instruction, if it has one, not repeated), cut to `max_input_chars`.

        `note`: a line a method puts after the text (EXACT's attributes), kept whole (the text is cut to leave it
        room) and on a line of its own even where the task joins the text's lines (paraphrase): joined, it became
        part of the text to rewrite.
        """
        content = " ".join(self.content(text).split()) if self.joins_lines else self.content(text)
        if not note:
            return self.template.format(text=cut_text(content, self.max_input_chars))
        return self.template.format(text=f"{cut_text(content, self.max_input_chars - len(note) - 1)}\n{note}")

    def check_text(
        self,
        text: str,
        what: str = "the text",
        *,
        room: int = 0,
        advice: str = "split it and rewrite the parts one at a time",
    ) -> None:
        """Refuse a text this task would have to cut (headline and title cut it instead, and accept it).

        `room`: characters the method adds to the text (EXACT's attribute line), taken from the limit.
        `advice`: what to do with a text refused, as a rewrite's (a history item's is not rewritten).
        """
        length = len(self.content(text))
        limit = self.max_input_chars - room
        if not self.cuts_long_input and length > limit:
            raise TextTooLong(
                f"{what} has {length:,} characters; the {self.name} task takes at most {limit:,}: {advice}"
            )

    def cut_note(self, text: str, chars_read: int) -> str:
        """What to tell a user whose `text` the prompt carried only the first `chars_read` characters of."""
        return (
            f"the text has {len(self.content(text)):,} characters; the {self.name} task read its first"
            f" {chars_read:,} (an article's start)"
        )

    def is_cut(self, text: str) -> bool:
        """Whether `prompt_for` carries only the start of `text`."""
        return len(self.content(text)) > self.max_input_chars

    def scored_output(self, output: str) -> str:
        """An example output as the fit scores it after its prompt: cut to `max_output_chars` (stored items
        from before the import check, benchmark data)."""
        return cut_text(output.strip(), self.max_output_chars)

    def check_output(self, output: str, what: str = "the output") -> None:
        """Refuse an example output longer than this task writes (often 'input' and 'output' swapped)."""
        if len(output.strip()) > self.max_output_chars:
            raise InputError(
                f"{what} has {len(output.strip()):,} characters; a {self.name} output has at most "
                f"{self.max_output_chars:,} (are 'input' and 'output' swapped?)"
            )

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("\n",) if self.one_line else ()


_HEADLINE_INSTRUCTION = "Generate a headline for the following article:"
# chosen on the train authors' dev split: it brings the adapter's repeated-word rate (18.6%) to the authors'
# (2.8%) and keeps numbers intact (docs/RESULTS.md 0ze)
HEADLINE_WORD_PENALTY = 3.0
# An article's first ~250 words (the shared data's inputs have at most 267 characters, its headlines 118)
ONE_LINE_INPUT_CHARS = 1500
ONE_LINE_OUTPUT_CHARS = 300

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="headline",
            instruction=_HEADLINE_INSTRUCTION,
            template=_HEADLINE_INSTRUCTION + " {text}\nHeadline:",
            one_line=True,
            default_max_tokens=32,
            description="a news headline for an article (the shared data's task)",
            repeated_word_penalty=HEADLINE_WORD_PENALTY,
            max_input_chars=ONE_LINE_INPUT_CHARS,
            max_output_chars=ONE_LINE_OUTPUT_CHARS,
            cuts_long_input=True,
        ),
        Task(
            name="title",
            instruction="Write a title for the following text:",
            template="Write a title for the following text: {text}\nTitle:",
            one_line=True,
            default_max_tokens=24,
            description="a short title for any text",
            repeated_word_penalty=HEADLINE_WORD_PENALTY,
            max_input_chars=ONE_LINE_INPUT_CHARS,
            max_output_chars=ONE_LINE_OUTPUT_CHARS,
            cuts_long_input=True,
        ),
        Task(
            name="paraphrase",
            instruction="Rewrite the following text in your own words:",
            template="Rewrite the following text in your own words: {text}\nRewrite:",
            # one paragraph in, one out: without the newline stop the backbone repeats its rewrite (or the
            # user's examples) line after line until max_tokens
            one_line=True,
            joins_lines=True,
            default_max_tokens=96,
            description="the same content, rewritten",
        ),
        Task(
            name="free",
            instruction="",
            template="{text}",
            one_line=False,
            default_max_tokens=64,
            description="plain continuation of the text",
        ),
    )
}


def cut_text(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters, else its start (ended at a nearby space) + CUT_MARK.

    Without a space nearby (CJK, a run of emoji) the cut backs off to the start of a character as a reader
    sees it: never between a letter and its combining accent, inside a joined emoji or a flag's pair.
    """
    if len(text) <= limit:
        return text
    if limit < len(CUT_MARK):  # no room for the mark: a negative end kept nearly the whole text
        return text[: max(limit, 0)]
    end = limit - len(CUT_MARK)
    start = text[:end]
    space = start.rfind(" ")
    if space >= len(start) * 4 // 5:
        start = start[:space]
    else:
        while end > 0 and _continues_character(text, end):
            end -= 1
        start = text[:end]
    return start.rstrip() + CUT_MARK


def _continues_character(text: str, index: int) -> bool:
    """Whether `text[index]` belongs to the character `text[index - 1]` starts (a cut there would split it)."""
    current, previous = text[index], text[index - 1]
    if unicodedata.combining(current) or current in "\u200d\ufe0e\ufe0f" or previous == "\u200d":
        return True
    if _is_regional_indicator(current):  # a flag is a pair of them: cut before a pair, not inside one
        before = index
        while before > 0 and _is_regional_indicator(text[before - 1]):
            before -= 1
        return (index - before) % 2 == 1
    return False


def _is_regional_indicator(character: str) -> bool:
    return "\U0001f1e6" <= character <= "\U0001f1ff"


def get_task(name: str) -> Task:
    """The task called `name`, or a one-line error (exit 2) listing the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise InputError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}") from None
