"""The device's fit of one user: cluster, preference pairs, lambda, token bias, and the per-user choice.

`fit_user` runs the whole fit on a user's history (or its most recent `history_limit` items) and stores the
result atomically in the user's own folder through `localpers.users.store` (a user imported without its history
keeps the fit it came with: `fit_without_history`); `fit_items` fits given items and
stores nothing (the per-user choice fits the earlier items this way). The work is done elsewhere and only
sequenced here: the pairs (y-, their cache, pair features) by `localpers.methods.card.pairs`, lambda by
`fitting`, the habits by `token_bias`, `recasing` and `respelling`, the choice of strengths by `choice`. This
module does not generate or rewrite; it needs the engine, the head and the pair builder of CARD's
`Personalizer`, which calls it (a protocol, not an import, so that `personalizer` -> `user_fit` runs one way).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from localpers.errors import LocalpersError
from localpers.methods.card.choice import Scorer, choose_correction, stored_choice
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT, DEFAULT_REGULARISATION, fit_with_heldout
from localpers.methods.card.recasing import fit_recasing
from localpers.methods.card.respelling import fit_respelling
from localpers.methods.card.token_bias import TokenBias, describe_habits, fit_token_bias
from localpers.methods.card.user_state import (
    fit_kept_without_history,
    kept_fit_report,
    refuse_fit_past_bundle,
    stored_token_bias,
    user_profile,
)
from localpers.methods.reports import FitReport
from localpers.methods.stored_files import fit_is_outdated, fit_made_for, fit_mark, is_current_fit
from localpers.tasks import get_task
from localpers.users.folder import check_history_limit
from localpers.users.history import fitted_on_this_history, history_digest

if TYPE_CHECKING:
    from localpers.engine import Engine
    from localpers.methods.card.head import CardHead
    from localpers.methods.card.pairs import PairBuilder, Progress
    from localpers.users.history import HistoryItem
    from localpers.users.store import User

MIN_PAIRS_FOR_VECTOR = 3


class FitHost(Scorer, Protocol):
    """What the fit needs of CARD's `Personalizer`: its engine, head, pair builder and cluster assignment."""

    engine: Engine
    head: CardHead
    pairs: PairBuilder
    bundle_sha256: str

    def assign_cluster(self, outputs: Sequence[str]) -> tuple[int, list[float]]: ...


@dataclass
class FitOutcome:
    """A fit before it is stored: the report, the cluster, lambda and the token bias (None without pairs)."""

    report: FitReport
    cluster: int
    vector: np.ndarray
    bias: TokenBias | None


def fit_user(
    host: FitHost,
    user: User,
    *,
    progress: Progress | None = None,
    regularisation: float = DEFAULT_REGULARISATION,
    history_limit: int | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    choose: bool = True,
) -> FitReport:
    """Cluster, pairs, features, lambda and token bias for `user`; stores the result atomically in its folder
    (for a user imported without its history, returns the fit it came with, stored as it was).

    lambda is shrunk towards `prior_weight` x the cluster's default vector; with fewer than
    MIN_PAIRS_FOR_VECTOR usable pairs it is that prior itself (w = 0: no correction, the cluster model).
    With `choose` and enough history, the correction's strengths are then chosen on the user's own most
    recent items (`localpers.methods.card.choice`) and stored with the fit; `rewrite` applies them.
    """
    history = user.history()
    if not history and (kept := fit_without_history(user, host.bundle_sha256, host.head.d)) is not None:
        return kept
    items = history[-check_history_limit(history_limit) :] if history_limit is not None else history
    offset = len(history) - len(items)  # items before the window: the fit's block groups count from there
    items, too_long = host.pairs.items_within_context(items)
    if not items:
        report = fit_report(host.bundle_sha256, "cold-start", None, [], 0, 0, 0, None, {})
        report.n_too_long = too_long
        report.history_sha256 = history_digest(history)
        user.save_fit(
            None,
            {
                "cluster": None,
                "bundle_sha256": host.bundle_sha256,
                "fit": report.to_json(),
                "fitted_by": fit_mark(),
            },
        )
        return report
    outcome = fit_items(
        host,
        user,
        items,
        progress=progress,
        regularisation=regularisation,
        prior_weight=prior_weight,
        history_offset=offset,
    )
    outcome.report.n_too_long = too_long
    outcome.report.history_sha256 = history_digest(history)
    state: dict[str, Any] = {
        "cluster": outcome.cluster,
        "bundle_sha256": host.bundle_sha256,
        "fit": outcome.report.to_json(),
        "fitted_by": fit_mark(),
    }
    if outcome.bias is not None:
        state["token_bias"] = outcome.bias.to_json()
    if choose and outcome.report.mode == "vector":
        choice = choose_correction(
            host,
            user,
            items,
            regularisation=regularisation,
            prior_weight=prior_weight,
            progress=progress,
            history_offset=offset,
            cluster=outcome.cluster,
        )
        if choice is not None:
            state["choice"] = choice.to_json()
            outcome.report.seconds["choice"] = round(choice.seconds, 3)
            state["fit"] = outcome.report.to_json()
    user.save_fit(outcome.vector, state, {"bundle_sha256": host.bundle_sha256, "mode": outcome.report.mode})
    return outcome.report


def fit_without_history(user: User, bundle_sha256: str, head_d: int | None = None) -> FitReport | None:
    """The fit a user imported without its history came with (`user export` marked it a fit of the history it left
    out), which a fit keeps until items are added: a fit of no history would replace it with the global adapter's
    cold start. None for any other user, and for one with items now: a history emptied by `history remove` or lost
    is fitted anew, so the fit forgets what those items taught it. A marked fit never learned from this device's
    items (any fit here writes a state without the mark).

    A kept fit no rewrite can use (a vector not `head_d` long, say) is damaged: None, and the fit replaces it.
    Raises for such a user whose fit no rewrite with this bundle can use: the imported fit may be the only copy,
    and a fit of nothing would only throw it away. For the same reason a fit rewrites can use whose report or
    choice's words are damaged is refused in one line naming the field (`user_state.kept_fit_report`), not thrown
    away: printing them ended the command in a traceback."""
    try:
        state = user.state()
    except LocalpersError:
        return None
    # not imported so, items to fit, or a cold start (it holds nothing a new one would lose)
    if not fit_kept_without_history(user, state):
        return None
    refit = f"`localpers history import FILE --user {user.name}`, then `localpers fit --user {user.name}`"
    if not fit_made_for(state, bundle_sha256):
        cause = "another fit format's" if fit_is_outdated(state) else "another bundle's"
        also = "" if fit_is_outdated(state) else ", or rewrite with the bundle it was fitted with (--bundle)"
        raise LocalpersError(
            f"user {user.name!r} was imported without its history, with {cause} fit, which rewrites here cannot"
            f" use; there is nothing to fit it anew from: add your items ({refit}){also}"
        )
    try:
        cluster, vector, _ = user_profile(user)  # the vector checked against its sha256
        refuse_fit_past_bundle(user, cluster, vector, None, head_d)  # and against the head it feeds
        stored_token_bias(user, state)
        stored_choice(state, str(user.state_path), user.refit_advice)
    except (LocalpersError, TypeError, ValueError, KeyError, AttributeError):
        return None  # damaged: the fit replaces it, as for any other user
    report = kept_fit_report(user, state)
    return None if report is None else dataclasses.replace(report, kept_without_history=True)


def stored_fit_if_current(
    user: User, bundle_sha256: str, history_limit: int | None
) -> tuple[FitReport, dict[str, Any]] | None:
    """(the stored fit's report, the state) when `fit_user` would fit exactly what it was made from: the same
    whole history (its digest) and window, the same bundle, this version of localpers; else None.

    A new fit of the same items would only redraw what it samples (its y-), so a caller may skip it."""
    try:
        state = user.state()
        history = user.history()
    except LocalpersError:
        return None  # a damaged file: the fit says so (or mends it)
    fit = state.get("fit")
    if (
        not isinstance(fit, dict)
        or not is_current_fit(state.get("fitted_by"))
        or state.get("bundle_sha256") != bundle_sha256
        or not fitted_on_this_history(fit, history)
    ):
        return None
    try:
        report = FitReport(**fit)
    except TypeError:
        return None
    counts = (report.n_items, report.n_too_long)
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
        return None
    window = len(history) if history_limit is None else min(history_limit, len(history))
    if report.n_items + report.n_too_long != window:
        return None
    if report.mode == "vector" and user.vector_path() is None:
        return None
    return report, state


def fit_items(
    host: FitHost,
    user: User,
    items: Sequence[HistoryItem],
    *,
    progress: Progress | None = None,
    regularisation: float = DEFAULT_REGULARISATION,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    history_offset: int = 0,
    cluster: int | None = None,
) -> FitOutcome:
    """The fit of `items` (non-empty), stored nowhere (y- are cached in the user's folder).

    `history_offset`: how many of the user's items come before `items` (a history limit's window). `cluster`:
    the cluster to fit on (the per-user choice's, the whole history's), else the one `items` are closest to.
    """
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    assigned, similarities = host.assign_cluster([item.output for item in items])
    cluster = assigned if cluster is None else cluster
    seconds["cluster"] = time.perf_counter() - started

    negatives, differences, first_logprobs, pair_seconds = host.pairs.negatives_and_differences(
        user, items, cluster, progress, history_offset
    )
    seconds.update(pair_seconds)
    distinct = [(i, n) for i, n in zip(items, negatives, strict=True) if n and n != i.output]
    skipped = len(items) - len(distinct)

    if len(distinct) < MIN_PAIRS_FOR_VECTOR:
        report = fit_report(
            host.bundle_sha256,
            "too-few-pairs",
            cluster,
            similarities,
            len(items),
            len(distinct),
            skipped,
            None,
            seconds,
        )
        return FitOutcome(report, cluster, prior_weight * host.head.default_vector(cluster), None)

    started = time.perf_counter()
    default = host.head.default_vector(cluster)
    fit = fit_with_heldout(
        differences, prior_weight * default, regularisation=regularisation, reference=default
    )
    bias = token_bias(host.engine, items, negatives, first_logprobs)
    seconds["fit"] = time.perf_counter() - started
    report = fit_report(
        host.bundle_sha256, "vector", cluster, similarities, len(items), len(distinct), skipped, fit, seconds
    )
    report.habits = describe_habits(
        bias, lambda token: host.engine.token_bytes(token).decode("utf-8", errors="replace")
    )
    return FitOutcome(report, cluster, fit.vector, bias)


def token_bias(
    engine: Engine,
    items: Sequence[HistoryItem],
    negatives: Sequence[str],
    first_logprobs: Sequence[float | None] | None = None,
) -> TokenBias:
    """The user's token bias: their outputs against the cluster model's for the same prompts.

    `first_logprobs[i]`: the cluster model's log-probability of item i's first output token (None where
    the pair was not scored); they calibrate the opening habits. Closing habits are punctuation only; an
    opening habit is never whitespace only (the backbone writes " 🐸" as a bare space, then the emoji).
    """
    positives = [engine.tokenize(" " + item.output, add_bos=False) for item in items]
    generated = [engine.tokenize(" " + negative, add_bos=False) for negative in negatives if negative]
    endings = {tokens[-1] for tokens in positives if tokens}
    punctuation = {t for t in endings if _is_punctuation(engine.token_bytes(t))}
    openings = {tokens[0] for tokens in positives if tokens}
    blank = {t for t in openings if _is_blank(engine.token_bytes(t))}
    bias = fit_token_bias(
        positives,
        generated,
        first_logprobs=first_logprobs,
        closing_allowed=punctuation,
        blank=blank,
    )
    recasing = fit_recasing(
        [item.output for item in items],
        [get_task(item.task).content(item.input) for item in items],
        [negative for negative in negatives if negative],
    )
    if recasing is not None:
        # Applied to the finished words, the habit leaves the model's choice of words alone; moving
        # probability between spellings while decoding (`case`) drifted it (docs/RESULTS.md 0d).
        bias.recasing = recasing
    bias.respelling = fit_respelling(
        [item.output for item in items], [negative for negative in negatives if negative]
    )
    return bias


def fit_report(
    bundle_sha256: str,
    mode: str,
    cluster: int | None,
    similarities: list[float],
    n_items: int,
    n_pairs: int,
    skipped: int,
    fit: Any,
    seconds: dict[str, float],
) -> FitReport:
    """The fit's report; `fit` is `fitting.fit_with_heldout`'s result, None when no vector was fitted."""
    return FitReport(
        mode=mode,
        cluster=cluster,
        cluster_similarities=similarities,
        n_items=n_items,
        n_pairs=n_pairs,
        n_identical_skipped=skipped,
        train_accuracy=None if fit is None else round(fit.train_accuracy, 4),
        heldout_accuracy=None
        if fit is None or fit.heldout_accuracy is None
        else round(fit.heldout_accuracy, 4),
        heldout_accuracy_default=(
            None
            if fit is None or fit.heldout_accuracy_default is None
            else round(fit.heldout_accuracy_default, 4)
        ),
        n_heldout=0 if fit is None else fit.n_heldout,
        regularisation=None if fit is None else fit.regularisation,
        vector_norm=None if fit is None else round(float(np.linalg.norm(fit.vector)), 4),
        seconds={k: round(v, 3) for k, v in seconds.items()},
        bundle_sha256=bundle_sha256,
    )


def _is_punctuation(piece: bytes) -> bool:
    """A token of punctuation only ("?", "!", "?\""), the kind a closing habit may be."""
    text = piece.decode("utf-8", errors="ignore").strip()
    return bool(text) and not any(c.isalnum() for c in text)


def _is_blank(piece: bytes) -> bool:
    """A token of whitespace only (a space, a newline) or of no text: never an opening habit."""
    return not piece.decode("utf-8", errors="replace").strip()
