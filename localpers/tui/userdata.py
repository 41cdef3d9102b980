"""The TUI's reads and writes of a user's folder: profile summary, accepted and rejected outputs, import.

Accepting an output adds `(input, accepted text)` to the user's history (the examples the vector is fitted
on). Rejecting one keeps it in `negatives_user.jsonl` beside the history, one JSON object per line,
rewritten atomically; `fit` does not read that file yet (the fit builds its own y- from the cluster model),
so rejected outputs are kept for a later fit that uses them, never sent anywhere. This module does no
generation or fitting and draws nothing.
"""

from __future__ import annotations

import json
import shlex
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from localpers.errors import LocalpersError
from localpers.methods.card.choice import chosen_bias, stored_choice
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.card.user_state import refuse_fit_past_bundle, stored_token_bias, user_profile
from localpers.methods.forget import remove_history_items
from localpers.methods.stored_files import fit_made_for
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import one_line
from localpers.users.history import (
    MAX_HISTORY_ITEMS,
    TUI_SOURCE,
    HistoryItem,
    check_history_size,
    history_digest,
    item_id,
    merge_history,
)
from localpers.users.history_import import parse_history
from localpers.users.series import history_series
from localpers.users.store import User, UserStore, atomic_write_text

# How long an accept, reject, removal or import waits for another command's hold on the user: on the UI thread,
# so briefly, then it says the user is busy (a command changes a user's files in well under a second)
TUI_LOCK_WAIT_SECONDS = 2.0


@dataclass(frozen=True)
class Profile:
    """What the app shows and uses of one user: history size, cluster, vector and the last fit report."""

    user: str
    n_history: int
    n_rejected: int = 0
    cluster: int | None = None
    vector: np.ndarray | None = field(default=None, compare=False)
    vector_sha256: str | None = None
    fit: dict[str, Any] | None = None
    fitted_at: str | None = None
    # the fit serves the bundle in use (made with it, in this fit format); None until the bundle is known
    bundle_matches: bool | None = None
    problem: str | None = None  # a damaged file, shown instead of the fit
    refit_mends: bool = (
        False  # the problem is in what a fit writes (state.json, the vector): a fit replaces it
    )
    bias: TokenBias | None = field(default=None, compare=False)
    bias_strength: float | None = None  # what `fit` chose on the user's recent items (None: the default)
    vector_strength: float | None = (
        None  # α `fit` chose with it; `localpers rewrite` uses it (None: the default)
    )
    choice: str | None = None  # the label of the correction `fit` chose (None: no choice made)
    series: tuple[tuple[int, str], ...] = ()  # (size, latest output) of each series the history holds
    history_sha256: str | None = None  # `history_digest` of the history now
    rejected_problem: str | None = None  # a damaged rejected-outputs file (the history and fit still work)
    fit_error: str | None = None  # why the last fit in this session failed (the stored fit is the one before)

    @property
    def history_changed(self) -> bool:
        """Whether the history is not the one the fit saw: by the digest the fit recorded, or (a fit made
        before it recorded one) by the number of items."""
        if self.fit is None:
            return False
        recorded = self.fit.get("history_sha256")
        if isinstance(recorded, str) and self.history_sha256 is not None:
            return recorded != self.history_sha256
        return self.fit.get("n_items") != self.n_history

    @property
    def history_unrecorded(self) -> bool:
        """Whether the fit was made by an earlier localpers that recorded how many items it saw but not which:
        as many items now may still be other ones (removed and replaced), so only a refit can tell."""
        return (
            self.fit is not None
            and not isinstance(self.fit.get("history_sha256"), str)
            and self.fit.get("n_items") == self.n_history
        )

    @property
    def needs_fit(self) -> bool:
        """History exists but no fit for this bundle, the history changed since the fit, or the fit did not
        record which items it saw (one refit records them)."""
        if self.n_history == 0:
            return False
        return (
            self.fit is None
            or self.bundle_matches is False
            or self.history_changed
            or self.history_unrecorded
        )

    @property
    def can_personalize(self) -> bool:
        """A fit for this bundle that assigned a cluster (cold-start users fall back to the global adapter)."""
        return self.fit is not None and self.bundle_matches is True and self.cluster is not None


def load_profile(
    user: User,
    bundle_sha256: str | None,
    clusters: int | None = None,
    head_d: int | None = None,
    *,
    history: list[HistoryItem] | None = None,
) -> Profile:
    """The user's profile; a damaged state or vector becomes `problem` (`refit_mends`), so the app can refit.

    A damaged rejected-outputs file becomes `rejected_problem` and leaves the history and fit in use. `clusters`
    and `head_d` (the bundle's k and head width, once known) refuse a fit for this bundle whose cluster it lacks
    or whose vector has another length, as `localpers rewrite` does. `history`: the user's items when the caller
    has just read them (a long history took a second on the UI thread to parse again).
    """
    history = user.history() if history is None else history
    n_history = len(history)
    try:
        n_rejected, rejected_problem = len(read_rejected(user)), None
    except LocalpersError as exc:
        n_rejected, rejected_problem = 0, str(exc)
    try:
        cluster, vector, state = user_profile(user)  # the checks `localpers rewrite` makes
        bias = stored_token_bias(user, state)
        vector_strength, bias_strength, choice = stored_choice(state, str(user.state_path), user.refit_advice)
        bundle_matches = None if bundle_sha256 is None else fit_made_for(state, bundle_sha256)
        if bundle_matches:
            refuse_fit_past_bundle(user, cluster, vector, clusters, head_d)
    except LocalpersError as exc:
        return Profile(
            user.name,
            n_history,
            n_rejected,
            problem=str(exc),
            refit_mends=True,
            rejected_problem=rejected_problem,
        )
    fit = state.get("fit") if isinstance(state.get("fit"), dict) else None
    return Profile(
        user=user.name,
        n_history=n_history,
        n_rejected=n_rejected,
        cluster=cluster,
        vector=vector,
        vector_sha256=state.get("vector_sha256"),
        fit=fit,
        fitted_at=state.get("updated_at") if fit else None,
        bundle_matches=bundle_matches,
        bias=chosen_bias(state, bias),
        bias_strength=bias_strength,
        vector_strength=vector_strength,
        choice=choice,
        series=tuple((found.size, found.latest) for found in history_series(history)),
        history_sha256=history_digest(history),
        rejected_problem=rejected_problem,
    )


class Accepted(NamedTuple):
    """What an accept did: the item, whether it was added (False: the same text was already there), and the
    history as it now stands, which the caller shows without reading and parsing the file again."""

    item: HistoryItem
    added: bool
    history: list[HistoryItem]


def accept_output(user: User, task: str, input_text: str, output: str) -> Accepted:
    """Add `(input_text, output)` to the history."""
    try:
        item = HistoryItem.create(task, input_text, output, source=TUI_SOURCE, strict=True)
    except ValueError as exc:
        raise LocalpersError(f"cannot add this example: {exc}") from None
    with user.locked(TUI_LOCK_WAIT_SECONDS):
        existing = user.history()
        merged, already = merge_history(existing, [item])
        if already:
            return Accepted(item, False, existing)
        check_history_size(
            len(merged),
            what=f"user {user.name!r} would have",
            hint=tui_room_hint(user.name, len(merged) - MAX_HISTORY_ITEMS),
        )
        user.save_history(merged)
    return Accepted(item, True, merged)


def tui_room_hint(user_name: str, over: int) -> str:
    """How to free `over` places in a full history, from the TUI or beside it."""
    return (
        f"remove {over} in the History tab (F3, then x on each), or the oldest from a terminal with"
        f" `localpers history remove --oldest {over} --user {user_name}`"
    )


class Removed(NamedTuple):
    """What a remove did: the item taken out, and the history as it now stands, which the caller shows without
    reading and parsing the file again."""

    item: HistoryItem
    history: list[HistoryItem]


def remove_history_item(user: User, wanted_id: str) -> Removed:
    """Remove the item with id `wanted_id` from the history."""

    def the_wanted_item(items: list[HistoryItem]) -> set[str]:
        if not any(item.id == wanted_id for item in items):
            raise LocalpersError(f"user {user.name!r} has no history item {wanted_id!r} (already removed?)")
        return {wanted_id}

    with user.locked(TUI_LOCK_WAIT_SECONDS):  # held again inside, by this thread: no second wait
        removed, remaining = remove_history_items(user, the_wanted_item)
    return Removed(removed[0], remaining)


@dataclass(frozen=True)
class RejectedOutput:
    """An output the user turned down for an input, with the settings that produced it."""

    id: str
    task: str
    input: str
    output: str
    method: str
    strength: float | None
    top_k: int | None
    rejected_at: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rejected_path(user: User) -> Path:
    return user.rejected_path


def read_rejected(user: User) -> list[RejectedOutput]:
    """The rejected outputs kept for `user` (none when the file is absent); a one-line error when damaged."""
    path = rejected_path(user)
    fix = "fix or delete that line, or remove the file"
    if not path.exists():  # none kept yet (or a link to nothing, as the first rejection would replace it)
        return []
    try:
        # a folder, FIFO or device is refused, never read: reading a FIFO on the UI thread froze the TUI
        text = read_regular_file(path, STATE_FILE_LIMIT, what="rejected outputs", stored=True).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalpersError(f"{path}: not UTF-8 text (byte {exc.start}); remove the file") from None
    rows: list[RejectedOutput] = []
    # Lines end at "\n" only: the file is written with ensure_ascii=False, and str.splitlines would also
    # split inside a JSON string at U+2028 or \x85.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(RejectedOutput(**json.loads(line)))
        except (ValueError, TypeError, RecursionError) as exc:
            raise LocalpersError(
                f"{path} line {number}: not a rejected-output record ({one_line(str(exc), 80)}); {fix}"
            ) from None
    return rows


def reject_output(
    user: User,
    *,
    task: str,
    input_text: str,
    output: str,
    method: str,
    strength: float | None,
    top_k: int | None,
) -> tuple[RejectedOutput, bool]:
    """Keep `output` as a negative for `input_text`; (the record, False when it was already kept)."""
    if not output.strip():
        raise LocalpersError("there is no output to reject yet")
    if not input_text.strip():
        raise LocalpersError("the draft is empty; there is nothing to reject an output for")
    # NFC as history items are stored: the same text in NFD was otherwise kept twice
    input_text, output = (unicodedata.normalize("NFC", text.strip()) for text in (input_text, output))
    for what, text in (("the draft", input_text), ("the output", output)):
        try:
            text.encode("utf-8")
        # a lone surrogate: the record's id and file could not be written (a crash)
        except UnicodeEncodeError:
            raise LocalpersError(
                f"cannot reject this output: {what} holds a lone surrogate, no text"
            ) from None
    record = RejectedOutput(
        id=item_id(task, input_text, output),
        task=task,
        input=input_text,
        output=output,
        method=method,
        strength=strength,
        top_k=top_k,
        rejected_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    with user.locked(TUI_LOCK_WAIT_SECONDS):
        existing = read_rejected(user)
        if any(row.id == record.id for row in existing):
            return record, False
        lines = [json.dumps(row.to_json(), ensure_ascii=False) for row in [*existing, record]]
        atomic_write_text(rejected_path(user), "\n".join(lines) + "\n")
    return record, True


@dataclass(frozen=True)
class ImportSummary:
    user: str
    added: int
    skipped: int
    total: int
    created: bool


def expand_home(path: str) -> Path:
    """`path` with a leading ~ or ~user expanded; as typed when there is no such home (then, as for the CLI,
    whose shell leaves it so, it names no file)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def import_history_file(store: UserStore, user_name: str, path: Path | str) -> ImportSummary:
    """Parse `path` (any `localpers history import` format) into `user_name`'s history, creating the user.

    The file is validated before the user is created, so a bad file leaves no empty user behind.
    """
    file = expand_home(str(path))
    parsed = parse_history(
        file,
        too_many_hint=(  # the dialog has no --keep-latest
            f"or import its latest from a terminal: `localpers history import {shlex.quote(str(file))}"
            f" --keep-latest {MAX_HISTORY_ITEMS} --user {user_name}`"
        ),
        choose_user_hint=(  # nor --user-id
            f"import one from a terminal: `localpers history import {shlex.quote(str(file))} --user-id ID"
            f" --user {user_name}`"
        ),
    )
    created = user_name not in store.list()
    user = store.create(user_name) if created else store.get(user_name)
    with user.locked(TUI_LOCK_WAIT_SECONDS):
        merged, already = merge_history(user.history(), parsed.items)
        check_history_size(
            len(merged),
            what=f"user {user_name!r} would have",
            hint=tui_room_hint(user_name, len(merged) - MAX_HISTORY_ITEMS),
        )
        if len(already) < len(parsed.items):  # as the CLI: a file of items already there changes nothing
            user.save_history(merged)
    skipped = len(parsed.duplicates) + len(already)
    return ImportSummary(user_name, len(parsed.items) - len(already), skipped, len(merged), created)
