"""Unit tests of the TUI's pure parts: user-folder writes, cache keys, colours, summaries, the stepper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tui_helpers import async_test, visible_lines

from localpers.errors import LocalpersError
from localpers.methods.reports import CandidateShift, RewriteResult, RewriteStep
from localpers.tui.runs import ResultCache, plan_runs, request_key
from localpers.tui.service import RewriteRequest
from localpers.tui.teaching import fit_summary
from localpers.tui.userdata import (
    accept_output,
    import_history_file,
    load_profile,
    read_rejected,
    reject_output,
    remove_history_item,
)
from localpers.tui.widgets.stepper import Stepper
from localpers.tui.widgets.token_strip import NEUTRAL, choice_changed, correction_color, visible_piece
from localpers.tui.widgets.why_view import shown_text, summarize
from localpers.users.folder import REJECTED_FILE
from localpers.users.history import HistoryItem, history_digest
from localpers.users.store import UserStore


def test_accept_output_adds_once_and_validates() -> None:
    user = UserStore().create("ann")
    item, added, history = accept_output(user, "headline", "An article", "My Headline")
    assert added and user.history() == [item] == history and item.source == "tui"
    _, again, history = accept_output(
        user, "headline", "An article", "My  Headline "
    )  # same after normalisation
    assert not again and user.history() == [item] == history
    with pytest.raises(LocalpersError, match="field 'output' is empty"):
        accept_output(user, "headline", "An article", "   ")


def test_remove_history_item() -> None:
    user = UserStore().create("ann")
    first = accept_output(user, "headline", "a", "A").item
    second = accept_output(user, "headline", "b", "B").item
    assert remove_history_item(user, first.id).item == first
    assert user.history() == [second]
    with pytest.raises(LocalpersError, match="already removed"):
        remove_history_item(user, first.id)


def test_reject_output_writes_jsonl_atomically_and_dedupes() -> None:
    user = UserStore().create("ann")
    options = {"task": "headline", "method": "card", "strength": 1.5, "top_k": 10}
    record, added = reject_output(user, input_text="An article", output="Bad Headline", **options)
    assert added
    _, again = reject_output(user, input_text="An article", output="Bad Headline", **options)
    assert not again
    reject_output(user, input_text="An article", output="Other", **options)
    lines = (user.dir / REJECTED_FILE).read_text().splitlines()
    assert [json.loads(line)["output"] for line in lines] == ["Bad Headline", "Other"]
    assert read_rejected(user)[0] == record
    assert not list(user.dir.glob(".*.tmp"))  # no temporary file left behind
    assert user.history() == []
    with pytest.raises(LocalpersError, match="no output"):
        reject_output(user, input_text="x", output=" ", **options)
    # the same text in NFD is the same rejected output, stored in NFC as the history is (text audit)
    _, nfd_again = reject_output(
        user, input_text="An article", output="Cre\u0300me Bru\u0302le\u0301e", **options
    )
    _, nfc_again = reject_output(user, input_text="An article", output="Crème Brûlée", **options)
    assert nfd_again and not nfc_again and read_rejected(user)[-1].output == "Crème Brûlée"


def test_damaged_rejected_file_names_the_line() -> None:
    user = UserStore().create("ann")
    (user.dir / REJECTED_FILE).write_text('{"id": "x"}\n')
    with pytest.raises(LocalpersError, match=rf"{REJECTED_FILE} line 1"):
        read_rejected(user)


def test_import_validates_before_creating_the_user(tmp_path: Path) -> None:
    store = UserStore()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(LocalpersError, match="line 1: not valid JSON"):
        import_history_file(store, "ann", bad)
    assert store.list() == []
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"input": "a", "output": "A"}\n{"input": "a", "output": "A"}\n{"input": "b", "output": "B"}\n'
    )
    summary = import_history_file(store, "ann", good)
    assert (summary.added, summary.skipped, summary.total, summary.created) == (2, 1, 2, True)
    again = import_history_file(store, "ann", good)
    assert (again.added, again.created) == (0, False)


def test_profile_says_when_a_fit_is_due() -> None:
    user = UserStore().create("ann")
    assert not load_profile(user, "sha").needs_fit  # nothing to fit
    accept_output(user, "headline", "a", "A")
    assert load_profile(user, "sha").needs_fit
    report = {"mode": "too-few-pairs", "n_items": 1, "history_sha256": history_digest(user.history())}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "bundle_sha256": "sha", "fit": report})
    profile = load_profile(user, "sha")
    assert not profile.needs_fit and profile.can_personalize and profile.cluster == 1
    assert load_profile(user, "other").needs_fit  # fitted with another bundle
    assert load_profile(user, None).bundle_matches is None and not load_profile(user, None).can_personalize
    accept_output(user, "headline", "b", "B")
    assert load_profile(user, "sha").needs_fit  # history changed


def test_a_fit_is_due_when_the_history_changed_but_not_its_size() -> None:
    from localpers.tui.widgets.profile_panel import status_line

    user = UserStore().create("ann")
    accept_output(user, "headline", "a", "A")
    report = {"mode": "vector", "n_items": 1, "history_sha256": history_digest(user.history())}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "bundle_sha256": "sha", "fit": report})
    assert not load_profile(user, "sha").needs_fit
    remove_history_item(user, user.history()[0].id)
    accept_output(user, "headline", "b", "B")  # one item again, another one
    profile = load_profile(user, "sha")
    assert profile.needs_fit and "refit due" in status_line(profile).plain


def test_a_fit_that_did_not_record_its_items_is_due_even_at_the_same_size() -> None:
    """An earlier localpers recorded only the count: a removed and replaced item went unnoticed, and the CLI
    already says so; the app refits once, which records the items."""
    from localpers.tui.widgets.profile_panel import status_line

    user = UserStore().create("ann")
    accept_output(user, "headline", "a", "A")
    old_report = {"mode": "vector", "n_items": 1}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "bundle_sha256": "sha", "fit": old_report})
    profile = load_profile(user, "sha")
    assert profile.history_unrecorded and not profile.history_changed and profile.needs_fit
    assert "did not record which items: refit due" in status_line(profile).plain
    new_report = {**old_report, "history_sha256": history_digest(user.history())}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "bundle_sha256": "sha", "fit": new_report})
    assert not load_profile(user, "sha").needs_fit


def test_profile_panel_shows_the_choice_habits_and_series() -> None:
    from rich.console import Console

    from localpers.tui.widgets.profile_panel import profile_table

    user = UserStore().create("ann")
    for week in (1, 2, 3):
        accept_output(user, "headline", f"cats of week {week}", f"Week {week} In Cats: Naps")
    accept_output(user, "headline", "a storm", "Storm [Shuts] Road")
    report = {"mode": "vector", "n_items": 4, "habits": ["opens with 'Week'"], "n_pairs": 4}
    state = {
        "cluster": 0,
        "bundle_sha256": "sha",
        "fit": report,
        "choice": {"label": "vector", "reason": "r", "vector_strength": 0.1, "bias_strength": 0.0},
    }
    user.save_fit(np.ones(4, np.float32), state)
    profile = load_profile(user, "sha")
    assert profile.choice == "vector" and profile.series == ((3, "Week 3 In Cats: Naps"),)
    console = Console(width=120, record=True)
    console.print(profile_table(profile))
    rows = {
        line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1].strip()
        for line in console.export_text().splitlines()
    }
    assert rows["correction"] == "vector (chosen on your recent items)"
    assert rows["habits"] == "opens with 'Week'"
    assert rows["series"] == "3 alike, the latest: Week 3 In Cats: Naps"


def test_profile_panel_shows_an_imported_fit_report_as_plain_text() -> None:
    from rich.console import Console

    from localpers.tui.widgets.profile_panel import profile_table

    user = UserStore().create("ann")
    accept_output(user, "headline", "a storm", "Storm Shuts Road")
    report = {"mode": "[bold]x[/bold]\x1b]0;retitled\x07", "n_items": 1}  # an archive's state.json, as it is
    user.save_fit(np.ones(4, np.float32), {"cluster": 0, "bundle_sha256": "sha", "fit": report})
    console = Console(width=120, record=True)
    console.print(profile_table(load_profile(user, "sha")))
    shown = console.export_text()
    assert "[bold]x[/bold]\\x1b]0;retitled\\x07" in shown and "\x1b" not in shown


@pytest.mark.parametrize(
    ("fields", "row", "shown"),
    [
        ({"heldout_accuracy": "0.8"}, "pair accuracy", "held-out 0.8 on"),
        ({"cluster_similarities": ["0.61", 0.23]}, "cluster", "(similarities 0.61, 0.23)"),
        ({"cluster_similarities": 0.61}, "cluster", "(similarities 0.61)"),
        ({"seconds": {"fit": "0.1", "choice": 2}}, "fit time", "2.0 s (fit 0.1 s, choice 2.0 s)"),
        ({"seconds": "5.2"}, "fit time", "5.2 s"),
        ({"habits": [1, None]}, "habits", "1; None"),
        ({"habits": "Title Case"}, "habits", "Title Case"),
        ({"updated_at": 1733400000}, "fitted at", "1733400000"),
    ],
)
def test_profile_panel_shows_a_hand_edited_fit_report_as_it_is(
    fields: dict[str, object], row: str, shown: str
) -> None:
    """Figures stored as text, a lone habit, a number for a date: the app ended in a traceback (a state.json edited
    by hand, or from an imported archive, which `user show`, rewrites and the API accept)."""
    from rich.console import Console

    from localpers.tui.widgets.profile_panel import profile_table

    user = UserStore().create("ann")
    accept_output(user, "headline", "a storm", "Storm Shuts Road")
    report = {"mode": "vector", "n_items": 1, "n_pairs": 1, "heldout_accuracy": 0.5}
    top = {key: value for key, value in fields.items() if key == "updated_at"}
    report.update({key: value for key, value in fields.items() if key != "updated_at"})
    user.save_fit(np.ones(4, np.float32), {"cluster": 0, "bundle_sha256": "sha", "fit": report})
    if top:
        state = json.loads(user.state_path.read_text())
        user.state_path.write_text(json.dumps({**state, **top}))
    console = Console(width=160, record=True)
    console.print(profile_table(load_profile(user, "sha")))
    lines = [line.strip() for line in console.export_text().splitlines() if line.startswith(row)]
    assert len(lines) == 1 and shown in lines[0], lines


def test_damaged_state_becomes_a_problem_not_a_crash() -> None:
    user = UserStore().create("ann")
    user.state_path.write_text("{broken")
    profile = load_profile(user, "sha")
    assert profile.problem is not None and "state.json" in profile.problem


def test_request_key_tells_outputs_apart() -> None:
    vector = np.arange(4, dtype=np.float32)
    base = RewriteRequest("text", "headline", "card", 0, vector, 1.0, 10)
    assert request_key(base) == request_key(
        RewriteRequest("text", "headline", "card", 0, vector.copy(), 1.0, 10)
    )
    for other in (
        RewriteRequest("text", "headline", "card", 0, vector + 1, 1.0, 10),
        RewriteRequest("text", "headline", "card", 0, vector, 1.5, 10),
        RewriteRequest("text", "headline", "card", 0, vector, 1.0, 5),
        RewriteRequest("text", "title", "card", 0, vector, 1.0, 10),
        RewriteRequest("text", "headline", "cluster", 0),
    ):
        assert request_key(other) != request_key(base)


def _result(text: str) -> RewriteResult:
    return RewriteResult(text, "global", "headline", None, "global", None, None, 1, 1.0, 1.0, 1.0)


def test_plan_runs_uses_the_cache_and_shares_equal_requests() -> None:
    cache = ResultCache(size=2)
    baseline = RewriteRequest("text", "headline", "global")
    personal = RewriteRequest("text", "headline", "cluster", cluster=1)
    cached, runs = plan_runs([("personal", baseline), ("baseline", baseline)], cache, force=False)
    assert cached == {} and [run.targets for run in runs] == [("personal", "baseline")]  # one generation
    cache.put(request_key(baseline), _result("plain"))
    cached, runs = plan_runs([("personal", personal), ("baseline", baseline)], cache, force=False)
    assert cached["baseline"].text == "plain" and [run.targets for run in runs] == [("personal",)]
    _, forced = plan_runs([("personal", personal), ("baseline", baseline)], cache, force=True)
    assert len(forced) == 2
    cache.put(request_key(personal), _result("b"))
    cache.get(request_key(baseline))  # baseline is now the most recently used
    cache.put(request_key(RewriteRequest("other", "headline", "global")), _result("c"))
    assert len(cache) == 2 and cache.get(request_key(personal)) is None


def test_correction_colours() -> None:
    assert correction_color(0.0, 1.0) == "rgb({},{},{})".format(*NEUTRAL)
    assert correction_color(2.0, 2.0) == "rgb(24,150,72)"
    assert correction_color(-5.0, 2.0) == "rgb(190,48,48)"  # capped at full strength
    half = correction_color(1.0, 2.0)
    assert half not in (correction_color(0.0, 2.0), correction_color(2.0, 2.0))
    assert visible_piece("a\nb") == "a⏎b" and visible_piece("") == "∅"


def _step(token: int, before: dict[int, float], delta: dict[int, float]) -> RewriteStep:
    shifts = [CandidateShift(t, f"t{t}", b, b + delta.get(t, 0.0)) for t, b in before.items()]
    shifts.sort(key=lambda s: -s.after)
    return RewriteStep(token, f"t{token}", delta.get(token, 0.0), shifts)


def test_choice_changed_and_summary() -> None:
    kept = _step(1, {1: 5.0, 2: 4.0}, {1: 0.5})
    flipped = _step(2, {1: 5.0, 2: 4.0}, {2: 2.0})
    assert not choice_changed(kept) and choice_changed(flipped)
    result = RewriteResult(
        "t1t2", "card", "headline", 0, "cluster-0", 1.0, 10, 2, 1.0, 10.0, 20.0, [kept, flipped]
    )
    assert summarize(result) == (
        "2 tokens · 1 choice changed by your vector · largest shift +2.00 on 't2' · α 1, top-10"
    )
    result.strength = 0.066257  # a fit's chosen strength: three figures, not six
    assert summarize(result).endswith("· α 0.0663, top-10")


def test_fit_summary() -> None:
    assert "global adapter" in fit_summary({"mode": "cold-start"})
    assert fit_summary({"mode": "too-few-pairs", "cluster": 1, "n_pairs": 2}) == (
        "cluster 1, no own vector yet (only 2 usable pairs)"
    )
    assert fit_summary({"mode": "too-few-pairs", "cluster": 1, "n_pairs": 1}).endswith("(only 1 usable pair)")
    assert fit_summary({"mode": "vector", "cluster": 0, "n_pairs": 9, "heldout_accuracy": 0.75}) == (
        "cluster 0, own vector from 9 pairs (held-out pair accuracy 0.75)"
    )


@async_test
async def test_stepper_steps_within_its_values() -> None:
    from textual.app import App, ComposeResult

    changes: list[float] = []

    class Harness(App[None]):
        def compose(self) -> ComposeResult:
            yield Stepper("α", (0.5, 1.0, 2.0), 1.0, id="s")

        def on_stepper_changed(self, event: Stepper.Changed) -> None:
            changes.append(event.value)

    app = Harness()
    async with app.run_test() as pilot:
        stepper = app.query_one(Stepper)
        stepper.focus()
        await pilot.press("right", "right", "right", "left", "minus", "minus")
        await pilot.pause()
        assert changes == [2.0, 1.0, 0.5]
        stepper.set_value(0.75)  # a value from the bundle that is not in the list is added
        assert stepper.values == [0.5, 0.75, 1.0, 2.0] and stepper.value == 0.75


def test_visible_lines_reads_svg_rows() -> None:
    svg = (
        '<svg><text x="0" y="20">b&#160;c</text><text x="0" y="10">a</text><text x="9" y="20">d</text></svg>'
    )
    assert visible_lines(svg) == ["a", "b cd"]


def test_history_items_in_a_store_stay_valid_after_tui_writes() -> None:
    user = UserStore().create("ann")
    accept_output(user, "title", "Some text", "A Title")
    assert user.history()[0] == HistoryItem.create("title", "Some text", "A Title", source="tui")


def test_the_why_views_history_lines_say_why_and_keep_user_text_literal() -> None:
    from localpers.users.history_prompt import ShownExample

    text = shown_text(
        [
            ShownExample("a1", "Plain [bold]not markup[/]", "recent"),
            ShownExample("b2", "Week 3 Picks", "series", described=True),
        ]
    )
    lines = text.plain.splitlines()
    assert lines[0] == "Your history shown to the model (2):"
    assert "one of your latest" in lines[1] and lines[1].endswith("Plain [bold]not markup[/]")
    assert "a series you repeat, with its text" in lines[2] and lines[2].endswith("Week 3 Picks")


def test_accepting_into_a_full_history_says_how_to_make_room_in_the_tui_and_beside_it() -> None:
    """At 500 items the TUI's accept was refused with advice only for the CLI's import (scale audit)."""
    from localpers.users.history import MAX_HISTORY_ITEMS

    user = UserStore().create("full")
    user.save_history(
        [HistoryItem.create("headline", f"article {n}", f"Headline {n}") for n in range(MAX_HISTORY_ITEMS)]
    )
    with pytest.raises(LocalpersError) as refused:
        accept_output(user, "headline", "one more article", "One More Headline")
    message = str(refused.value)
    assert "remove 1 in the History tab (F3, then x on each)" in message
    assert "`localpers history remove --oldest 1 --user full`" in message
