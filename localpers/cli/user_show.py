"""The lines `localpers user show` prints about a user's stored fits: what state.json holds, whether the stored
CARD fit, CoPe fit and EXACT index serve rewrites now (or are refused, and what mends them), in words.

It reads the user's files and the bundle in use's manifest; it writes nothing and decides nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from localpers.cli.common import items_phrase
from localpers.errors import LocalpersError
from localpers.methods.stored_files import COPE_STATE_FILE, EXACT_INDEX_FILE, fit_is_outdated, refit_advice
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import one_line, parse_json
from localpers.users.folder import IMPORTED_WITHOUT_HISTORY
from localpers.users.history import MAX_HISTORY_FILE_BYTES, HistoryItem, fitted_on_this_history
from localpers.users.store import User


def rejected_count(user: User) -> int:
    """How many outputs the user rejected in the TUI (lines of its file; 0 when absent or unreadable)."""
    if not user.rejected_path.exists():
        return 0
    try:
        raw = read_regular_file(
            user.rejected_path, MAX_HISTORY_FILE_BYTES, what="rejected outputs", stored=True
        )
    except LocalpersError:
        return 0
    return sum(1 for line in raw.split(b"\n") if line.strip())


# state.json keys that `user show`'s own lines show, or that only the files' bookkeeping needs.
_SHOWN_STATE_KEYS = frozenset(
    {
        "cluster",
        "vector_file",
        "vector_sha256",
        "vector_dim",
        IMPORTED_WITHOUT_HISTORY,
    }  # the last: in `fitted`
)
_SUMMARISED_STATE_KEYS = frozenset(
    {"fit", "choice", "token_bias", "bundle_sha256", "created_at", "updated_at"}
)
_LONGEST_OTHER_VALUE = 100


def state_summary(state: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """(label, text) lines that say what a stored fit holds; `--json` keeps every number.

    The token bias's tables and every candidate's score are summarised, not printed: hundreds of token ids
    tell a person nothing (`localpers profile` shows the habits and series in words).
    """
    lines: list[tuple[str, str]] = []
    fit = state.get("fit")
    if isinstance(fit, dict):
        lines.append(("fit", _fit_line(fit)))
    choice = state.get("choice")
    if isinstance(choice, dict) and isinstance(choice.get("label"), str):
        reason = choice.get("reason")
        lines.append(
            ("correction", f"{choice['label']}" + (f": {reason}" if isinstance(reason, str) else ""))
        )
    habits = fit.get("habits") if isinstance(fit, dict) else None
    if isinstance(habits, list) and habits:
        lines.append(("habits", "; ".join(str(habit) for habit in habits)))
    bias = state.get("token_bias")
    if bias is not None:
        from localpers.methods.card.token_bias import TokenBias

        try:
            TokenBias.from_json(bias)  # as a rewrite reads it
            lines.append(("token bias", _token_bias_line(bias)))
        except ValueError as exc:
            damaged = f"damaged ({one_line(str(exc), 120)}): rewrites refuse this fit; run `localpers fit --user {name}`"
            lines.append(("token bias", damaged))
    if isinstance(state.get("bundle_sha256"), str):
        lines.append(("bundle", _fit_bundle_line(state["bundle_sha256"], name)))
    if fit_is_outdated(state):
        lines.append(
            (
                "refit due",
                "made by a localpers of another fit format (see fitted_by), whose fits this one does not read:"
                f" rewrites show your history without CARD's correction until `localpers fit --user {name}`",
            )
        )
    for key in ("created_at", "updated_at"):
        if isinstance(state.get(key), str):
            # escaped: an imported archive's state.json is kept as it is
            lines.append((key.replace("_at", ""), one_line(state[key], 64)))
    for key, value in state.items():
        if key not in _SHOWN_STATE_KEYS | _SUMMARISED_STATE_KEYS:
            # a string as it is, anything else as JSON; escaped either way (C1 controls such as U+009B pass
            # json.dumps)
            text = one_line(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            if len(text) > _LONGEST_OTHER_VALUE:
                text = text[: _LONGEST_OTHER_VALUE - 1] + "…"
            lines.append((key, text))
    return lines


def cluster_text(cluster: Any, name: str) -> str:
    """The stored cluster as `user show` prints it; one that is not a cluster number is named as rewrites name it
    (they refuse the fit), not shown as if it were one."""
    if cluster is None:
        return "not assigned"
    if isinstance(cluster, int) and not isinstance(cluster, bool) and cluster >= 0:
        return str(cluster)
    return (
        f"{one_line(repr(cluster), 40)}, not a cluster number (state.json is damaged): rewrites refuse this fit;"
        f" run `localpers fit --user {name}`"
    )


def other_fits(folder: Path, history: list[HistoryItem] | None = None) -> list[tuple[str, str]]:
    """CoPe's and EXACT's fits, which live in files of their own: whether rewrites can use them, or are refused,
    and (given the `history` as it is now) whether CoPe's LoRA learned from another history."""
    lines: list[tuple[str, str]] = []
    cope_state = folder / COPE_STATE_FILE
    if cope_state.is_file():
        try:
            raw = read_regular_file(cope_state, STATE_FILE_LIMIT, what="CoPe state", stored=True)
            cope = parse_json(raw)
            line = f"LoRA rank {int(cope['rank'])} fitted on {items_phrase(int(cope['n_items']))}"
            due = _refit_due(cope, "cope", folder.name)
            if (
                not due
                and history is not None
                and isinstance(cope.get("history_sha256"), str)
                and not fitted_on_this_history(cope, history)
            ):
                due = f", but the history has changed since ({refit_advice('cope', folder.name)} to refit)"
            lines.append(("cope", line + due))
        except (LocalpersError, OSError, ValueError, TypeError, KeyError, ArithmeticError):  # JSONProblem too
            lines.append(("cope", f"{cope_state.name} is damaged; {refit_advice('cope', folder.name)}"))
    if (folder / EXACT_INDEX_FILE).is_file():
        from localpers.methods.exact_index import ExactIndex

        try:
            meta = ExactIndex.load(folder / EXACT_INDEX_FILE, folder.name).meta
        except LocalpersError as exc:
            lines.append(("exact", one_line(str(exc))))
        else:
            line = "attribute index stored (`localpers profile` shows it)"
            lines.append(("exact", line + _refit_due(meta, "exact", folder.name)))
    return lines


def _refit_due(stored: dict[str, Any], method: str, name: str) -> str:
    """'' or why `rewrite --method METHOD` refuses a stored CoPe fit or EXACT index (`stored`: cope.json, the
    index's meta), and what mends it."""
    from localpers.bundle.format import bundle_in_use_sha256

    if fit_is_outdated(stored):
        why = "made by a localpers of another fit format"
    elif (in_use := bundle_in_use_sha256()) is not None and stored.get("bundle_sha256") != in_use:
        why = "made with another bundle than the one in use"
    else:
        return ""
    return f"; {why}: refit due, {refit_advice(method, name)}"


def _fit_line(fit: dict[str, Any]) -> str:
    """e.g. "vector; 37 pairs, held-out pair accuracy 0.78 on 9 (cluster default 0.89); 14.3 s"."""
    parts = [str(fit.get("mode", "unknown mode"))]
    if isinstance(fit.get("n_pairs"), int):
        pairs = f"{fit['n_pairs']} pair{'' if fit['n_pairs'] == 1 else 's'}"
        accuracy, n_heldout = _finite(fit.get("heldout_accuracy")), fit.get("n_heldout")
        if accuracy is not None and isinstance(n_heldout, int) and n_heldout:
            pairs += f", held-out pair accuracy {accuracy:.2f} on {n_heldout}"
            default = _finite(fit.get("heldout_accuracy_default"))
            if default is not None:
                pairs += f" (cluster default {default:.2f})"
        parts.append(pairs)
    seconds = fit.get("seconds")
    if isinstance(seconds, dict):
        total = _finite(sum(value for value in map(_finite, seconds.values()) if value is not None))
        if total is not None:
            parts.append(f"{total:.1f} s")
    return "; ".join(parts)


def _finite(value: Any) -> float | None:
    """`value` as a float where it is a number a float holds; None for anything else (an imported state may carry
    an integer of 400 digits, which no float holds: `user show` ended in an OverflowError)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _token_bias_line(bias: dict[str, Any]) -> str:
    """How many tokens each of the bias's tables moves, and its spelling and casing habits."""
    counts = [
        f"{len(bias[name])} {label}"
        for name, label in (
            ("first", "first-word"),
            ("rest", "later-word"),
            ("opening", "opening"),
            ("closing", "closing"),
        )
        if isinstance(bias.get(name), list) and bias[name]
    ]
    extras = [name for name in ("recasing", "respelling") if bias.get(name)]
    text = ", ".join(counts) + " tokens" if counts else "no tokens"
    return text + (f"; {' and '.join(extras)}" if extras else "")


def fit_freshness(
    fit: Any, history: list[HistoryItem], name: str, *, imported_without_history: bool = False
) -> str:
    """Whether the stored fit saw the history as it is now: the digest of its items' ids the fit recorded, or
    (a fit made before it recorded one) the item counts. `--history-limit` fits fewer items than it holds. A user
    imported without its history is told to add it; one whose history was emptied, that a fit forgets it."""
    n_history = len(history)
    refit = f"`localpers fit --user {name}`"
    if not isinstance(fit, dict) and n_history == 0:
        return "no (no history yet)"
    if not isinstance(fit, dict):
        return f"no (rewrites show your history without CARD's correction until {refit})"
    fitted_on = fit.get("n_items")
    if not isinstance(fitted_on, int) or isinstance(fitted_on, bool):
        return f"on an unknown number of items (state.json's fit.n_items is damaged; {refit} refits)"
    digest = fit.get("history_sha256")
    if n_history == 0 and fitted_on and imported_without_history:  # an export made without --with-history
        return (
            f"on {items_phrase(fitted_on)}, but the history holds none now (add it: `localpers history import"
            f" FILE --user {name}`; an export made with --with-history carries it)"
        )
    if n_history == 0 and fitted_on:  # removed, lost, or an import of a fit of other items than it left out
        return (
            f"on {items_phrase(fitted_on)}, but the history holds none now ({refit} replaces this fit with the global"
            " adapter's; add items first to fit them)"
        )
    if isinstance(digest, str):
        if not fitted_on_this_history(fit, history):
            return (
                f"on {items_phrase(fitted_on)}, but the history has changed since (it holds {n_history} now;"
                f" {refit} refits)"
            )
        if fitted_on == n_history:
            return f"on the {items_phrase(n_history)} the history holds"
        return f"on {fitted_on} of the {items_phrase(n_history)} the history holds (unchanged since the fit)"
    if fitted_on == n_history:  # an older localpers recorded no digest: the same count may hide other items
        return (
            f"on {items_phrase(n_history)}, as many as the history holds (an earlier localpers did not record"
            f" which: if you removed or replaced items since, {refit} refits)"
        )
    return f"on {items_phrase(int(fitted_on or 0))}; the history holds {n_history} now ({refit} refits)"


def _fit_bundle_line(fitted_with: str, name: str) -> str:
    """The bundle the fit was made with, and whether it is the one rewrites use (read without a model load)."""
    from localpers.bundle.format import bundle_in_use_sha256

    shown = f"sha256 {fitted_with[:16]}"
    in_use = bundle_in_use_sha256()
    if in_use is None:
        return f"{shown} (the bundle the fit was made with)"
    if in_use == fitted_with:
        return f"{shown} (the bundle in use)"
    return (
        f"{shown}, not the bundle in use ({in_use[:16]}, pulled or shipped since): rewrites show your history"
        f" without CARD's correction until `localpers fit --user {name}`"
    )
