"""Prompt templates for the writing tasks and their stop rules.

A task turns the user's text into the backbone prompt and says when generation stops. The
`headline` template matches the shared news-headlines data, whose `input` field already holds the
full instruction; `prompt_for` leaves such inputs unchanged. A task also sets the default strength of the
word-only repetition rule (`localpers.engine.repeated_words`): on for the one-line tasks, where the model
repeats a word about seven times as often as the authors do (docs/RESULTS.md 0ze), off where repeating a
word is normal prose. This module knows nothing of models.
"""

from dataclasses import dataclass

from localpers.errors import LocalpersError


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

    def prompt_for(self, text: str) -> str:
        """The prompt for `text`; an input that already starts with this task's instruction is kept."""
        stripped = text.strip()
        if self.instruction and stripped.startswith(self.instruction):
            stripped = stripped[len(self.instruction) :].strip()
        return self.template.format(text=stripped)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("\n",) if self.one_line else ()


_HEADLINE_INSTRUCTION = "Generate a headline for the following article:"
# chosen on the train authors' dev split: it brings the adapter's repeated-word rate (18.6%) to the authors'
# (2.8%) and keeps numbers intact (docs/RESULTS.md 0ze)
HEADLINE_WORD_PENALTY = 3.0

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
        ),
        Task(
            name="title",
            instruction="Write a title for the following text:",
            template="Write a title for the following text: {text}\nTitle:",
            one_line=True,
            default_max_tokens=24,
            description="a short title for any text",
            repeated_word_penalty=HEADLINE_WORD_PENALTY,
        ),
        Task(
            name="paraphrase",
            instruction="Rewrite the following text in your own words:",
            template="Rewrite the following text in your own words: {text}\nRewrite:",
            one_line=False,
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


def get_task(name: str) -> Task:
    """The task called `name`, or a one-line error listing the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise LocalpersError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}") from None
