"""A user's interpretable style profile: EXACT's attribute frequencies, CARD's fit, the series they repeat.

`user_style_profile(user, text=None)` reads what the fits stored in the user's folder (the EXACT index,
CARD's state.json: cluster, chosen correction, habits found), finds the series the history holds (the
formulas the device's prompt shows in full for a text about them, `localpers.users.series`) and, given a text,
retrieves the attributes EXACT would use for it (one sentence-encoder call). A damaged EXACT index, or a CARD fit
whose state.json or vector a rewrite refuses, is reported as `{"damaged": <why>}` in its place, the rest of the
profile shown. It loads no language model and writes nothing.
"""

from __future__ import annotations

from typing import Any

from localpers.bundle.format import bundle_in_use_sha256
from localpers.errors import LocalpersError
from localpers.methods.exact import index_path, load_index
from localpers.methods.exact_rewrite import retrieve
from localpers.methods.stored_files import fit_is_outdated
from localpers.users.series import history_series
from localpers.users.store import User


def card_summary(user: User) -> dict[str, Any] | None:
    """CARD's cluster and fit mode from state.json, or None when the user was never fitted; `bundle_in_use`
    says whether the fit was made with the bundle rewrites use now (None: no bundle to compare with),
    `outdated_format` whether a localpers of another fit format made it (rewrites cannot use it either).
    `{"damaged": <why>}` when state.json, or the vector it names, is refused as a rewrite refuses it."""
    try:
        state, _ = user.fit_files()  # the pair a rewrite reads: a fit whose vector is gone is no fit to show
    except LocalpersError as exc:
        return {"damaged": str(exc)}
    fit = state.get("fit")
    if not isinstance(fit, dict):
        return None
    in_use = bundle_in_use_sha256()
    return {
        "bundle_in_use": None if in_use is None else state.get("bundle_sha256") == in_use,
        "outdated_format": fit_is_outdated(state),  # made by a localpers of another fit format
        "cluster": state.get("cluster"),
        "mode": fit.get("mode"),
        "cluster_similarities": fit.get("cluster_similarities"),
        "n_pairs": fit.get("n_pairs"),
        "heldout_accuracy": fit.get("heldout_accuracy"),
        "habits": _habits(fit.get("habits")),
        "choice": _choice_summary(state.get("choice")),
    }


def _habits(stored: Any) -> list[str]:
    """The fit's habits as text; a state.json edited by hand may hold one habit alone, or numbers."""
    if not stored:
        return []
    return [str(habit) for habit in (stored if isinstance(stored, list) else [stored])]


def _choice_summary(choice: Any) -> dict[str, Any] | None:
    if not isinstance(choice, dict) or "label" not in choice:
        return None
    return {"label": choice["label"], "reason": choice.get("reason", "")}


def user_style_profile(user: User, text: str | None = None, task: str = "headline") -> dict[str, Any]:
    """Attribute frequencies (EXACT), the attributes for `text`, CARD's cluster, the series and the size of the
    history, as one JSON-ready dict."""
    card = card_summary(user)
    history = user.history()
    common: dict[str, Any] = {
        "card": card,
        "series": [found.to_json() for found in history_series(history)],
        "history_items": len(history),
    }
    if not index_path(user).is_file():
        # the front end says which fit makes one (a user without any fit gets the same view)
        return {"user": user.name, "exact": None, **common}
    try:
        index = load_index(user)
    except LocalpersError as exc:  # the rest of the profile is still the user's to see (as `user show` does)
        return {"user": user.name, "exact": {"damaged": str(exc)}, **common}
    n = len(index.entries)
    exact: dict[str, Any] = {
        "k": index.meta.get("k"),
        "cluster": index.meta.get("cluster"),
        "indexed_inputs": n,
        "frequencies": [
            {"attribute": name, "count": count, "share": round(count / n, 4)}
            for name, count in index.frequencies()
        ],
    }
    if text is not None:
        exact["retrieved"] = retrieve(index, text, task).to_json()
    return {"user": user.name, "exact": exact, **common}
