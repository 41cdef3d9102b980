"""What CARD reads back from a user's stored fit: cluster, vector, state and token bias.

The fit itself (`user_fit.fit_user`) writes these through `localpers.users.store`; this module only
reads them, for `rewrite`, the TUI, the API and the benchmark alike. `refuse_fit_past_bundle` refuses a fit
for the bundle in use whose cluster it lacks or whose vector its head cannot take (rewrite, fit, the TUI), and
`check_stored_fit` refuses what a rewrite would, for `doctor`, `user import` and `user export` (with
`head_dim_of`, the head width a manifest states), and what `fit` would of a fit it keeps as it came
(`kept_fit_report`: a user imported without its history).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from localpers.errors import InputError, LocalpersError
from localpers.methods.card.stored_report import check_choice_words, stored_fit_report
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.reports import FitReport
from localpers.untrusted import one_line
from localpers.users.folder import IMPORTED_WITHOUT_HISTORY
from localpers.users.store import User


def user_profile(user: User) -> tuple[int | None, np.ndarray | None, dict[str, Any]]:
    """`(cluster, vector, state)` of a stored user, as `rewrite` needs them (the state and vector of one fit)."""
    state, vector = user.fit_files()
    cluster = state.get("cluster")
    if cluster is not None and (not isinstance(cluster, int) or isinstance(cluster, bool) or cluster < 0):
        raise InputError(
            f"{user.state_path} is damaged: field 'cluster' is {one_line(repr(cluster), 40)}, not a cluster "
            f"number; {user.refit_advice}"
        )
    return cluster, vector, state


def stored_token_bias(user: User, state: dict[str, Any] | None = None) -> TokenBias | None:
    """The token bias stored with the user's fit; None for no fit or a fit made before it existed."""
    entry = (user.state() if state is None else state).get("token_bias")
    if entry is None:
        return None
    try:
        return TokenBias.from_json(entry)
    except ValueError as exc:
        raise InputError(
            f"{user.state_path}: field 'token_bias' is damaged ({exc}); {user.refit_advice}"
        ) from None


def check_stored_fit(
    user: User,
    bundle_sha256: str | None = None,
    clusters: int | None = None,
    head_d: int | None = None,
    *,
    with_history: bool = True,
) -> None:
    """Refuse (InputError naming the file and field) what a rewrite would refuse of `user`'s stored files: the
    vector, cluster, token bias, the fit's choice and, `with_history`, the history; the cluster against `clusters`
    and the vector's length against `head_d` where the fit was made for the bundle whose manifest has
    `bundle_sha256` (the bundle in use). A damaged choice or token bias is refused even in a fit of another bundle,
    which a rewrite would not read (it falls back). A fit `fit` keeps as it came (`fit_kept_without_history`) has
    its report and choice's words checked too (`kept_fit_report`), as `fit` prints them."""
    from localpers.methods.card.choice import stored_choice

    cluster, vector, state = user_profile(user)
    stored_token_bias(user, state)
    stored_choice(state, str(user.state_path), user.refit_advice)
    if fit_kept_without_history(user, state):
        kept_fit_report(user, state)
    made_here = bundle_sha256 is not None and state.get("bundle_sha256") == bundle_sha256
    if made_here:
        refuse_fit_past_bundle(user, cluster, vector, clusters, head_d)
    if with_history:
        user.history()


def fit_kept_without_history(user: User, state: dict[str, Any]) -> bool:
    """Whether `fit` keeps `user`'s stored fit (`state`) as it came instead of fitting anew: a user imported without
    its history (`user export` marked the fit one of the history it left out) that has no items yet, with a fit
    that is not a cold start (`user_fit.fit_without_history`)."""
    if not state.get(IMPORTED_WITHOUT_HISTORY) or state.get("cluster") is None:
        return False
    try:
        return not user.history()
    except LocalpersError:
        return False  # a damaged history is refused by what reads it


def kept_fit_advice(user_name: str) -> str:
    """What mends a kept fit (`fit_kept_without_history`) that `fit` refuses: a fit of the user's items."""
    return (
        f"add your items (`localpers history import FILE --user {user_name}`), then `localpers fit --user"
        f" {user_name}` fits them anew"
    )


def kept_fit_report(user: User, state: dict[str, Any]) -> FitReport | None:
    """The report of a fit `fit` keeps as it came, with its choice's words checked: InputError naming state.json
    and the field where `fit` could not print them (`stored_report`). None where the report lacks a field every
    report has: `fit` then fits anew, as for any other damage."""
    where = str(user.state_path)
    check_choice_words(state.get("choice"), where, kept_fit_advice(user.name))
    return stored_fit_report(state.get("fit"), where, kept_fit_advice(user.name))


def refuse_fit_past_bundle(
    user: User,
    cluster: int | None,
    vector: np.ndarray | None,
    clusters: int | None,
    head_d: int | None = None,
) -> None:
    """Refuse (InputError naming the file) a fit for the bundle in use whose cluster it lacks (`clusters`: its
    k) or whose vector is not as long as its head's (`head_d`): each ended every rewrite in a traceback."""
    if clusters is not None and cluster is not None and cluster >= clusters:
        raise InputError(
            f"{user.state_path} is damaged: field 'cluster' is {cluster}, but the bundle has {clusters} clusters;"
            f" {user.refit_advice}"
        )
    if head_d is not None and vector is not None and vector.shape != (head_d,):
        raise InputError(
            f"{user.vector_path() or user.state_path} is damaged: the vector has {vector.size} values, but the"
            f" bundle's head takes {head_d}; {user.refit_advice}"
        )


def head_dim_of(manifest: dict[str, Any]) -> int | None:
    """The head's D a bundle manifest states (`head.d`), or None where it states none usable."""
    head = manifest.get("head")
    value = head.get("d") if isinstance(head, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None
