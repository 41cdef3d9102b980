"""`ProfilePanel`: the current user's cluster, fit report, habits and series, as a small table.

It renders a `Profile` (see `localpers.tui.userdata`) and says whether a refit is due; it reads no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from localpers.tui.text import flatten_whitespace, readable_on
from localpers.tui.userdata import Profile
from localpers.untrusted import one_line as escaped

MODE_LABELS = {
    "vector": "own vector (fitted on your pairs)",
    "too-few-pairs": "no own vector yet (too few pairs): the adapter alone",
    "cold-start": "cold start (no history): global adapter",
}


def _number(value: Any, digits: int = 2) -> str:
    """A stored figure to `digits` places; "–" when absent, and anything else as the text it is (a state.json
    edited by hand, or one from an imported archive, may hold "0.8" where localpers writes 0.8)."""
    if value is None:
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{digits}f}"
    return str(value)


def _listed(value: Any) -> list[Any]:
    """A stored list's items; a lone value as one item (a hand-edited "habits": "Title Case")."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


@dataclass(frozen=True)
class StatusColors:
    """The status line's colours: Rich colour names or hex; the panel passes its theme's text colours."""

    error: str = "red"
    warning: str = "yellow"
    success: str = "green"


def status_line(profile: Profile, colors: StatusColors | None = None) -> Text:
    """Whether the profile is usable as is, e.g. 'up to date' or 'refit due: history changed'; in the theme's
    text colours when given (the named ones read poorly on a light theme)."""
    colors = colors or StatusColors()
    if profile.problem:
        mend = " (ctrl+f fits again)" if profile.refit_mends else ""
        return Text(f"damaged: {profile.problem}{mend}", style=f"bold {colors.error}")
    if profile.fit_error:
        return Text(
            f"the last fit failed: {flatten_whitespace(profile.fit_error)}; the fit shown is the one before (ctrl+f tries"
            " again)",
            style=f"bold {colors.error}",
        )
    if profile.n_history == 0:
        return Text("no history yet: accept outputs (ctrl+s) or import a file (ctrl+o)", style=colors.warning)
    if profile.fit is None:
        return Text("not fitted yet (ctrl+f fits)", style=colors.warning)
    if profile.bundle_matches is None:
        return Text("fitted (checking it against the bundle while the model loads)", style="dim")
    if not profile.bundle_matches:
        return Text("fitted with another bundle or fit format: refit due", style=colors.warning)
    if profile.history_changed:
        return Text("history changed since the fit: refit due", style=colors.warning)
    if profile.history_unrecorded:
        return Text(
            "fitted by an earlier localpers that did not record which items: refit due", style=colors.warning
        )
    return Text("up to date", style=colors.success)


def profile_table(profile: Profile, colors: StatusColors | None = None) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()

    def add_row(label: str, value: object) -> None:
        # plain text, control characters escaped: what a state.json from an imported archive holds is shown, never
        # read as markup or sent to the terminal
        table.add_row(
            label, value if isinstance(value, Text) else Text(escaped(flatten_whitespace(str(value))))
        )

    add_row("user", profile.user)
    add_row("status", status_line(profile, colors))
    add_row("history", f"{profile.n_history} items · {profile.n_rejected} rejected outputs kept")
    fit = profile.fit
    if fit is not None:
        similarities = ", ".join(_number(s) for s in _listed(fit.get("cluster_similarities")))
        cluster = "none" if profile.cluster is None else str(profile.cluster)
        add_row("cluster", f"{cluster}" + (f"  (similarities {similarities})" if similarities else ""))
        add_row("vector", MODE_LABELS.get(str(fit.get("mode")), str(fit.get("mode"))))
        if fit.get("mode") == "vector":
            add_row(
                "pairs",
                f"{fit.get('n_pairs')} used · {fit.get('n_identical_skipped', 0)} skipped (output = model's)",
            )
            add_row(
                "pair accuracy",
                f"train {_number(fit.get('train_accuracy'))} · held-out "
                f"{_number(fit.get('heldout_accuracy'))} on {fit.get('n_heldout')} "
                f"(cluster default {_number(fit.get('heldout_accuracy_default'))})",
            )
            add_row("vector norm", f"{fit.get('vector_norm')}")
            if profile.choice:
                add_row("correction", f"{profile.choice} (chosen on your recent items)")
        habits = _listed(fit.get("habits"))
        if habits:
            add_row("habits", "; ".join(str(habit) for habit in habits))
        seconds = fit.get("seconds")
        if isinstance(seconds, dict) and seconds:
            parts = ", ".join(f"{k} {_number(v, 1)} s" for k, v in seconds.items())
            counted = [v for v in seconds.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            add_row("fit time", f"{_number(sum(counted), 1)} s ({parts})")
        elif seconds:
            add_row("fit time", f"{seconds} s")
        if profile.fitted_at:
            add_row("fitted at", profile.fitted_at)
    for size, latest in profile.series:
        series = (
            f"{size} alike, the latest: {flatten_whitespace(latest)}"  # one line: the other rows stay in view
        )
        add_row("series", Text(series, no_wrap=True, overflow="ellipsis"))
    return table


class ProfilePanel(Static):
    """The profile of the current user, or a hint when there is none."""

    DEFAULT_CSS = """
    ProfilePanel {
        height: auto;
        padding: 0 1;
    }
    """

    profile: reactive[Profile | None] = reactive(None, always_update=True)

    def watch_profile(self, profile: Profile | None) -> None:
        if profile is None:
            self.update(
                Text(
                    "No user yet: import a history file (ctrl+o), or wait for the demo user if you chose it.",
                    style="dim",
                )
            )
        else:
            theme = self.app.theme_variables
            colors = StatusColors(
                *(readable_on(theme[name], theme["background"]) for name in ("error", "warning", "success"))
            )
            self.update(profile_table(profile, colors))
