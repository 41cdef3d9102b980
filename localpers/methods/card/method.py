"""CARD as a registry method: `fit` learns cluster, vector, token bias and strengths; `rewrite` applies them.

The rewrite path of every method that runs on the `Personalizer`'s adapters (CARD and the baselines in
`localpers.methods.baselines`) lives in `AdapterMethod`: read the user's stored fit (`profile_for_rewrite`:
without a usable one CARD shows the user's history on the global adapter, uncorrected, and says so; a user
without history gets the plain global adapter), decode. CARD's correction itself is built in
`localpers.methods.card.correction`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from localpers.errors import LocalpersError
from localpers.methods import stored_files
from localpers.methods.base import Fitted, Method, Progress, RewriteOptions, note_cut_text
from localpers.methods.card.choice import MIN_ITEMS_TO_CHOOSE, chosen_bias, stored_choice
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.card.user_state import refuse_fit_past_bundle, stored_token_bias, user_profile
from localpers.methods.reports import FitReport
from localpers.methods.stored_files import fit_format_of, fit_is_outdated
from localpers.tasks import get_task
from localpers.untrusted import one_line
from localpers.users.folder import IMPORTED_WITHOUT_HISTORY
from localpers.users.history_index import HistoryIndex
from localpers.users.store import User

# The global adapter with the user's history in the prompt: needs no fit, so it is what CARD falls back to.
HISTORY_ONLY_METHOD = "global-history"


@dataclass(frozen=True)
class RewriteProfile:
    """What one rewrite decodes with: the method used (a fallback's, when `note` says why) and the user's fit."""

    method: str
    cluster: int | None = None
    vector: Any = None
    bias: TokenBias | None = None
    state: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def _history_not_here(user: User, state: dict[str, Any]) -> str | None:
    """The note for a fitted user with no history at all on this device (an export made without
    --with-history, imported): their fit applies, but no prompt can show their examples. None where the user has
    history for another task (its prompts show it) or the fit saw none."""
    fitted_on = state["fit"].get("n_items") if isinstance(state.get("fit"), dict) else None
    if not isinstance(fitted_on, int) or isinstance(fitted_on, bool) or fitted_on <= 0 or user.history():
        return None
    return (
        f"user {user.name!r} has no history on this device (the fit saw {fitted_on} item"
        f"{'' if fitted_on == 1 else 's'}): the prompt shows none of your examples, where most of the"
        f" personalization comes from; add it with `localpers history import FILE --user {user.name}` (an export"
        " made with --with-history carries it)"
    )


def unfitted_method(method: str, shows_history: bool) -> str | None:
    """What a user without a usable fit gets for `method`; None where the method needs the fit.

    `global` and `global-history` need none; CARD shows the user's history (`shows_history`: the user has
    items for the task and the bundle's adapters were trained to read them) without its correction, or is
    the plain global adapter. `localpers rewrite`, the TUI and the API (which refuses CARD instead) share it.
    """
    if method in ("global", HISTORY_ONLY_METHOD):
        return method
    if method != "card":
        return None
    return HISTORY_ONLY_METHOD if shows_history else "global"


def profile_for_rewrite(
    target: User | None,
    method: str,
    personalizer: Personalizer,
    history: HistoryIndex | None,
    *,
    strict: bool = False,
) -> RewriteProfile:
    """The user's fit for `method`, or the fallback a user without a usable fit gets.

    `global` needs no user, and `global-history` (the global adapter with the user's history in the prompt)
    needs no fit. The other methods need a fit for this bundle and fit format that assigned a cluster. Without
    one (never fitted, fitted to another bundle or by a localpers of another fit format, or fitted before the
    history held anything) `card` still shows the user's history in the prompt, on the global adapter without a
    correction, and says so in `note`; `strict` (the API) refuses instead. A user with no history for the task
    (`history`, the user's index for it) gets the plain global adapter.
    """
    if target is None or method == "global":
        return RewriteProfile("global")
    if method == HISTORY_ONLY_METHOD:
        return RewriteProfile(method)
    cluster, vector, state = user_profile(target)
    has_items = history is not None and bool(history.pool)
    refit = f"`localpers fit --user {target.name}`"
    if not state.get("fit"):
        unusable = f"user {target.name!r} is not fitted"
    elif state.get("bundle_sha256") != personalizer.bundle_sha256:
        unusable = (
            f"user {target.name!r} was fitted with another bundle than the one in use (one pulled or shipped"
            " before this one)"
        )
    elif fit_is_outdated(state):
        unusable = (
            f"user {target.name!r} was fitted by a localpers of another fit format"
            f" ({fit_format_of(state.get('fitted_by')) or 1}; this one reads format {stored_files.FIT_FORMAT})"
        )
    elif cluster is None and has_items and _fit_left_out_every_item(state):
        unusable = (
            f"user {target.name!r}'s fit could use none of its history items (each too long for the model's"
            " context once tokenized: shorten them)"
        )
    elif cluster is None and has_items:
        unusable = f"user {target.name!r} was fitted before its history held anything"
    elif cluster is None:
        return RewriteProfile(
            "global", state=state, note="this user has no history yet; using the global adapter"
        )
    else:
        refuse_fit_past_bundle(target, cluster, vector, personalizer.bundle.k, personalizer.head_config.d)
        return RewriteProfile(
            method,
            cluster,
            vector,
            stored_token_bias(target, state),
            state,
            note=None
            if has_items or personalizer.prompt_format is None
            else _history_not_here(target, state),
        )
    fallback = (
        None if strict else unfitted_method(method, has_items and personalizer.prompt_format is not None)
    )
    if fallback is None and not has_items:  # a fit of no history fits nothing: the history comes first
        raise LocalpersError(
            f"{unusable} and has no history for this task: add some (`localpers history import FILE --user"
            f" {target.name}`), then run {refit}; method global needs neither"
        )
    if fallback is None:
        raise LocalpersError(f"{unusable}: run {refit} (method {HISTORY_ONLY_METHOD} needs no fit)")
    if fallback == HISTORY_ONLY_METHOD:
        note = f"{unusable}: your history is in the prompt, without CARD's correction; {refit} adds it"
        return RewriteProfile(fallback, note=note)
    if not has_items:
        return RewriteProfile(
            fallback, note=f"{unusable} and has no history for this task; using the global adapter"
        )
    # a bundle trained on plain prompts shows no history
    return RewriteProfile(fallback, note=f"{unusable}; using the global adapter until {refit}")


class AdapterMethod(Method):
    """A method decoded by the Personalizer on one of the bundle's adapters (CARD's correction or none)."""

    fits: ClassVar[bool] = False
    uses_choice: ClassVar[bool] = False  # whether the strengths chosen at fit time apply

    def rewrite(
        self, personalizer: Personalizer, user: User | None, text: str, options: RewriteOptions
    ) -> dict[str, Any]:
        # the global adapter's plain prompt shows no history: a history it cannot read does not stop it
        history = user.history_index(get_task(options.task)) if user is not None and self.needs_user else None
        profile = profile_for_rewrite(user, self.name, personalizer, history)
        if profile.note:
            options.note(profile.note)
        given = [
            name
            for name, value in (("strength", options.strength), ("top-k", options.top_k))
            if value is not None
        ]
        if profile.method != self.name and given:
            # the fallback decodes without CARD's correction: what tunes it changes nothing, and says so
            tune = "tune" if len(given) > 1 else "tunes"
            options.note(
                f"the {' and '.join(given)} given {tune} CARD's correction, which {profile.method} has not"
            )
        state = profile.state
        uses_choice = self.uses_choice and profile.method == self.name
        chosen_strength, chosen_bias_strength, _ = (
            stored_choice(state, str(user.state_path), user.refit_advice)
            if uses_choice and user is not None
            else (None, None, None)
        )
        bias = chosen_bias(state, profile.bias) if uses_choice else profile.bias
        strength = chosen_strength if options.strength is None else options.strength
        result = personalizer.rewrite(
            text,
            task=options.task,
            method=profile.method,
            cluster=profile.cluster,
            vector=profile.vector,
            strength=strength,
            top_k=options.top_k,
            max_tokens=options.max_tokens,
            sampling=options.sampling,
            on_text=options.on_text,
            history=history,
            bias=bias,
            bias_strength=chosen_bias_strength,
            candidates=options.candidates,
            show_examples=True,
        )
        note_cut_text(text, result, options)
        return {"user": user.name if user else None, **result.to_json()}


class CardMethod(AdapterMethod):
    name = "card"
    summary = (
        "the bundle's base adapter (global, or your cluster's) with your history in the prompt + a top-k logit"
        " correction from your vector and token bias (fitted here)"
    )
    fits = True
    uses_choice = True
    takes_strength = True
    takes_top_k = True

    def fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None, progress: Progress | None
    ) -> Fitted:
        report = personalizer.fit_user(user, progress=progress, history_limit=history_limit)
        kept = report.kept_without_history
        choice = user.state().get("choice")
        summary = fit_summary(user.name, report, choice)
        if kept:
            summary = (
                f"user {user.name!r} was imported without its history, so there is nothing to fit: it keeps the"
                f" fit it came with; add your items (`localpers history import FILE --user {user.name}`) and"
                f" `localpers fit --user {user.name}` fits them here. The kept fit:\n" + summary
            )
        report_json = {"user": user.name, **report.to_json(), "choice": choice, "kept_without_history": kept}
        return Fitted(report_json, summary)

    def current_fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None
    ) -> Fitted | None:
        from localpers.methods.card.user_fit import stored_fit_if_current

        stored = stored_fit_if_current(user, personalizer.bundle_sha256, history_limit)
        if stored is None:
            return None
        report, state = stored
        choice = state.get("choice")
        try:  # kept only if a rewrite can use all of it, read as a rewrite reads it; anything damaged: refit
            cluster, vector, _ = user_profile(user)  # the vector too, checked against its sha256
            stored_token_bias(user, state)
            stored_choice(state, str(user.state_path), user.refit_advice)
            refuse_fit_past_bundle(user, cluster, vector, personalizer.bundle.k, personalizer.head_config.d)
            # the keys of a fit's report, this one among them
            kept = bool(state.get(IMPORTED_WITHOUT_HISTORY))
            return Fitted(
                {"user": user.name, **report.to_json(), "choice": choice, "kept_without_history": kept},
                fit_summary(user.name, report, choice),
            )
        except (LocalpersError, TypeError, ValueError, KeyError, AttributeError):
            return None

    def stored_bytes(self, user: User) -> int:
        path = user.vector_path()
        return (path.stat().st_size if path else 0) + (
            user.state_path.stat().st_size if user.state_path.exists() else 0
        )


def _fit_left_out_every_item(state: dict[str, Any]) -> bool:
    """Whether the stored fit is a cold start because every history item was too long (not for want of items)."""
    fit = state.get("fit")
    return isinstance(fit, dict) and fit.get("mode") == "cold-start" and bool(fit.get("n_too_long"))


def fit_summary(user: str, report: FitReport, choice: dict[str, Any] | None = None) -> str:
    """CARD's fit in a few lines: cluster, pairs, held-out accuracy, the chosen strengths, timings."""
    if report.mode == "cold-start" and report.n_too_long:
        return (
            f"{user}: all {report.n_too_long} history items are too long for the model's context once"
            " tokenized (emoji or dense scripts), so rewrites get no CARD correction; shorten them and fit again"
        )
    if report.mode == "cold-start":
        return f"{user}: no history yet, so rewrites use the global adapter. Add items with `localpers history import`."
    lines = [f"user {user}: cluster {report.cluster} (similarities {report.cluster_similarities})"]
    if report.mode == "too-few-pairs":
        pairs = f"{report.n_pairs} usable pair{'' if report.n_pairs == 1 else 's'}"
        lines.append(
            f"only {pairs}: no personal vector yet, rewrites use the adapter without a correction;"
            " add history and refit"
        )
    else:
        heldout = (
            f"held-out pair accuracy {report.heldout_accuracy:.2f} on {report.n_heldout} pairs"
            f" (cluster default {report.heldout_accuracy_default:.2f})"
            if report.heldout_accuracy is not None
            else "too few pairs for a held-out split"
        )
        lines.append(f"{report.n_pairs} pairs, training pair accuracy {report.train_accuracy:.2f}, {heldout}")
    if report.n_too_long:
        lines.append(
            f"{report.n_too_long} history item(s) left out: too long for the model's context once tokenized"
            " (emoji or dense scripts); shorten them to fit them too"
        )
    # a stored fit's words are escaped: an imported archive's or a hand-edited state.json is kept as it is
    if report.habits:
        lines.append(
            "habits found in your outputs: " + "; ".join(one_line(str(habit)) for habit in report.habits)
        )
    if report.mode == "vector":
        if choice:
            lines.append(f"chose {one_line(str(choice['label']))}: {one_line(str(choice['reason']))}")
        elif report.n_items < MIN_ITEMS_TO_CHOOSE:
            lines.append(
                "too few items to choose a correction on your own recent items: the bundle's defaults apply"
            )
        else:  # the fit of the items before the recent ones had too few usable pairs to compare on
            lines.append(
                "your earlier items gave too few usable pairs to compare corrections on your recent items:"
                " the bundle's defaults apply"
            )
    total = sum(report.seconds.values())
    lines.append(f"fit took {total:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in report.seconds.items())})")
    return "\n".join(lines)
