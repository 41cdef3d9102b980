"""The one shape every personalization method has on the device: fit, rewrite, report costs and a why.

A method learns from a user's history (`fit`), keeps what it learned in the user's own folder (the
method's files under `User.dir`, written atomically through `localpers.users.store`; read back by
`rewrite`), rewrites a text for that user, and says what it stores (`stored_bytes`) and, in one line,
what it does (`summary`, the "why" shown in `--help` and the TUI). CARD's logit correction, CoPe's
contrastive decoder and EXACT's attribute prompt are what each `rewrite` plugs into the decode loop.

A method that decodes with machinery of its own (CoPe's two contexts, EXACT's index) says so with
`own_decoder` and opens a `UserDecoder` for one user, which a server (`localpers api`) keeps open between
requests; the other methods decode through the `Personalizer`'s adapters, which also take a ready prompt
(a chat template). Every method takes a caller's stop strings.

This module defines the shape only; `localpers.methods.registry` lists the methods and how the front ends
show them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from localpers.engine.decoding import SamplerSettings
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.reports import RewriteResult
from localpers.users.store import User

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class Fitted:
    """A finished fit: its JSON report (as `localpers fit --json` prints it) and a human summary."""

    report: dict[str, Any]
    summary: str


@dataclass
class RewriteOptions:
    """What the caller asks of one rewrite; `strength` and `top_k` mean what the method says they mean."""

    task: str = "headline"
    strength: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    sampling: SamplerSettings | None = None
    candidates: int = (
        1  # > 1: outputs decoded side by side, the consensus one kept (adapter methods, greedy only)
    )
    on_text: Callable[[str], None] | None = None
    # stop strings added to the task's (an API client's `stop`, a chat's turn openings)
    stop: tuple[str, ...] = ()
    note: Callable[[str], None] = field(default=lambda _: None)  # the method's remarks (e.g. a fallback)
    # a `free` text too long to carry beside the user's examples (or EXACT's attribute line) is given alone,
    # bounded by the context only, as the API gives a long chat or prompt to every method; else it is refused
    long_text_alone: bool = False


def too_long_beside_examples(text: str, task: str, room: int = 0) -> bool:
    """Whether `text` is a `free` text over what the task carries beside the user's examples, less `room`
    characters (EXACT's attribute line): the API gives such a text alone, bounded by the context."""
    from localpers.tasks import get_task

    free = get_task("free")
    return task == free.name and len(free.content(text)) > free.max_input_chars - room


def gives_text_alone(text: str, options: RewriteOptions, room: int = 0) -> bool:
    """Whether `text` goes alone into the prompt: asked for (`RewriteOptions.long_text_alone`) and too long."""
    return options.long_text_alone and too_long_beside_examples(text, options.task, room)


def given_alone_note() -> str:
    """What a rewrite says when it gave a long text without the user's examples."""
    from localpers.tasks import get_task

    return (
        f"the text has over {get_task('free').max_input_chars:,} characters: it was given without your examples,"
        " which would not fit beside it"
    )


def note_cut_text(text: str, result: RewriteResult, options: RewriteOptions) -> None:
    """Tell the user (`options.note`) when the prompt carried only the start of `text` (`text_chars_read`)."""
    note = cut_text_note(text, result)
    if note is not None:
        options.note(note)


def cut_text_note(text: str, result: RewriteResult) -> str | None:
    """The note for a prompt that carried only the start of `text`; None when it carried all of it."""
    if result.text_chars_read is None:
        return None
    from localpers.tasks import get_task

    return get_task(result.task).cut_note(text, result.text_chars_read)


class UserDecoder(ABC):
    """A method's decoder opened for one user's current fit; `localpers api` keeps it open between requests."""

    @abstractmethod
    def rewrite(self, text: str, options: RewriteOptions) -> RewriteResult:
        """Rewrite `text` with this user's fit (`options.task`, `strength`, `max_tokens`, `sampling`, `on_text`)."""

    def serves(self, user: User) -> bool:
        """Whether this decoder still decodes `user`'s current fit (False: open a new one)."""
        return False

    def close(self) -> None:  # noqa: B027 - a decoder that holds nothing to free need not override it
        """Free what the decoder holds; no other call may follow."""


class Method(ABC):
    """One personalization method as the CLI, the TUI and the API use it."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: what the method learns and how it changes decoding (the "why")
    fits: ClassVar[bool] = True  # whether `localpers fit --method NAME` learns anything
    needs_user: ClassVar[bool] = True  # whether a rewrite needs a fitted user
    uses_choice: ClassVar[bool] = False  # whether the strengths the user's fit chose apply to a rewrite
    own_decoder: ClassVar[bool] = False  # decodes through `open_decoder`, not the Personalizer's adapters
    takes_strength: ClassVar[bool] = False  # whether `RewriteOptions.strength` means anything to it
    takes_top_k: ClassVar[bool] = False  # whether `RewriteOptions.top_k` (the correction's k) does

    def fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None, progress: Progress | None
    ) -> Fitted:
        """Learn from the user's history and store the result in their folder."""
        raise NotImplementedError(f"{self.name} learns nothing from a history; fit another method")

    def current_fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None
    ) -> Fitted | None:
        """The user's stored fit when `fit` would learn from exactly what it was made from (the same history
        and window, this bundle, this version of localpers), else None; a method that cannot tell says None."""
        return None

    @abstractmethod
    def rewrite(
        self, personalizer: Personalizer, user: User | None, text: str, options: RewriteOptions
    ) -> dict[str, Any]:
        """Rewrite `text` for `user` from their stored state; the JSON payload of `localpers rewrite --json`."""

    def stored_bytes(self, user: User) -> int:
        """Bytes this method keeps in the user's folder (0 when it keeps nothing of its own)."""
        return 0

    def open_decoder(self, personalizer: Personalizer, user: User) -> UserDecoder:
        """The user's decoder, for a method with `own_decoder` (it builds the task's prompt itself and takes a
        caller's stop strings, as every method does)."""
        raise NotImplementedError(f"{self.name} decodes through the Personalizer's adapters")
