"""One fit of a user at a time: a second is refused at once (CLI, TUI), `localpers demo` waits for the first.

Two fits of one user used to both run, each doing the same minutes of work, the last to finish winning. The
fit lock is not the write lock: the user's history can still be changed while a fit runs.
"""

from __future__ import annotations

import multiprocessing
import time
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import LocalpersError
from localpers.methods.card.method import CardMethod
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

BUSY = r"^user 'ann' is being fitted by another localpers command"


def _hold_fit_lock(root: str, held: multiprocessing.synchronize.Event, seconds: float) -> None:
    with UserStore(root=Path(root)).get("ann").fitting():
        held.set()
        time.sleep(seconds)


@pytest.fixture
def fitting_elsewhere(localpers_home: Path):  # noqa: ANN201
    """A user 'ann' whose fit lock another process holds for 3 s."""
    store = UserStore()
    store.create("ann")
    context = multiprocessing.get_context("fork")
    held = context.Event()
    holder = context.Process(target=_hold_fit_lock, args=(str(store.root), held, 3.0))
    holder.start()
    assert held.wait(20)
    yield
    holder.join(20)


def test_a_second_fit_is_refused_at_once_while_history_can_still_change(fitting_elsewhere: None) -> None:
    ann = UserStore().get("ann")
    started = time.monotonic()
    with pytest.raises(LocalpersError, match=BUSY), ann.fitting():
        pass
    assert time.monotonic() - started < 1.0
    with ann.locked():  # the write lock is another lock: imports and accepted outputs go on
        ann.save_history([HistoryItem.create("headline", "an article", "A Headline")])
    with ann.fitting(wait_seconds=20):  # waits for the other fit (as `localpers demo` does), then holds it
        pass


def test_the_fit_command_says_so_in_one_line_before_loading_the_model(fitting_elsewhere: None) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(app, ["fit", "--user", "ann"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "being fitted by another localpers command" in result.output
    assert time.monotonic() - started < 2.0  # refused before the model is loaded


def test_a_stopped_fit_whose_cache_could_not_be_written_does_not_say_its_work_is_saved(
    localpers_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers import interrupts
    from localpers.methods.exact_method import ExactMethod

    UserStore().create("ann")

    def interrupted_unsaved(*args: object, **kwargs: object) -> None:
        stop = KeyboardInterrupt()
        interrupts.mark_unsaved(stop)
        raise stop

    monkeypatch.setattr(
        "localpers.methods.card.personalizer.Personalizer.open",
        lambda **_: types.SimpleNamespace(bundle_sha256="0" * 64),
    )
    monkeypatch.setattr(CardMethod, "fit", interrupted_unsaved)
    monkeypatch.setattr(ExactMethod, "fit", interrupted_unsaved)
    card = CliRunner().invoke(app, ["fit", "--user", "ann"])
    assert card.exit_code == 130 and "are saved" not in card.output
    assert (
        "user 'ann' has no fit yet; the pairs scored so far could not all be saved (a cache in its folder could not"
        " be written): `localpers fit --user ann` does that work again" in card.output
    )
    exact = CliRunner().invoke(app, ["fit", "--user", "ann", "--method", "exact"])
    assert exact.exit_code == 130 and "are saved" not in exact.output
    assert "the attributes chosen so far could not all be saved" in exact.output


def test_a_ctrl_c_during_a_fit_says_what_is_kept_and_frees_the_lock(
    localpers_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = UserStore().create("ann")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(
        "localpers.methods.card.personalizer.Personalizer.open",
        lambda **_: types.SimpleNamespace(bundle_sha256="0" * 64),
    )
    monkeypatch.setattr(CardMethod, "fit", interrupted)
    early = CliRunner().invoke(app, ["fit", "--user", "ann"])  # stopped before any pair: nothing is saved
    assert early.exit_code == 130 and "are saved" not in early.output
    assert (
        "user 'ann' has no fit yet; nothing of this fit was saved (it stopped before its first pair was done):"
        " `localpers fit --user ann` starts again" in early.output
    )
    (ann.dir / "negatives.json").write_text("{}")  # a pair's y- saved before the stop
    result = CliRunner().invoke(app, ["fit", "--user", "ann"])
    assert result.exit_code == 130
    assert (
        "user 'ann' has no fit yet; the pairs scored so far are saved: `localpers fit --user ann` goes on from there"
        in result.output
    )
    ann.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": {"mode": "vector"}})
    again = CliRunner().invoke(app, ["fit", "--user", "ann", "--history-limit", "20"])
    assert (
        "user 'ann' keeps its previous fit, and the pairs scored so far are saved: `localpers fit --user ann"
        in (again.output)
        and "--history-limit 20` goes on from there" in again.output
    )
    options = CliRunner().invoke(app, ["fit", "--user", "ann", "--refit", "--bundle", "my bundle"])
    assert "`localpers fit --user ann --refit --bundle 'my bundle'` goes on from there" in options.output
    with ann.fitting():  # released
        pass

    def deleted_then_interrupted(*args: object, **kwargs: object) -> None:
        UserStore().delete("ann")  # `localpers user delete ann` in another shell
        raise KeyboardInterrupt

    monkeypatch.setattr(CardMethod, "fit", deleted_then_interrupted)
    gone = CliRunner().invoke(app, ["fit", "--user", "ann"])
    assert gone.exit_code == 130
    assert (
        "user 'ann' no longer exists (deleted while this fit ran); nothing of the fit was kept" in gone.output
    )


def test_a_user_imported_without_history_keeps_its_fit_and_an_emptied_history_does_not(
    localpers_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`user export` (no history), `user import --as`, then `fit`: the fit of no history replaced the imported
    fit with the global adapter's cold start, and rewrites lost the correction (first-time-user audit, seventy-ninth
    session). Kept only for a user imported so: a history emptied by `history remove`, or deleted by hand, is
    fitted anew, so the fit forgets what those items taught it; an imported fit no rewrite can use is refused, not
    thrown away."""
    import json

    from localpers.methods.card import user_fit
    from localpers.methods.stored_files import fit_mark
    from localpers.users.history import history_digest

    sha = "0" * 64
    host = types.SimpleNamespace(
        bundle_sha256=sha,
        pairs=types.SimpleNamespace(items_within_context=lambda items: (items, 0)),
        head=types.SimpleNamespace(d=4),  # as wide as the stored vectors
    )
    host.fit_user = lambda user, **kwargs: user_fit.fit_user(host, user, **kwargs)  # type: ignore[attr-defined]
    monkeypatch.setattr("localpers.methods.card.personalizer.Personalizer.open", lambda **_: host)
    vector_fit = types.SimpleNamespace(
        train_accuracy=0.9,
        heldout_accuracy=0.8,
        heldout_accuracy_default=0.6,
        n_heldout=5,
        regularisation=0.1,
        vector=np.ones(4),
    )
    report = user_fit.fit_report(sha, "vector", 1, [0.5, 0.9, 0.1], 24, 20, 4, vector_fit, {"fit": 1.0})

    def fitted(name: str, bundle: str = sha) -> None:
        user = UserStore().create(name)
        user.save_history([HistoryItem.create("headline", "an article", "A Headline")])
        report.history_sha256 = history_digest(user.history())  # a fit of the history as it is
        user.save_fit(
            np.ones(4, np.float32),
            {"cluster": 1, "bundle_sha256": bundle, "fit": report.to_json(), "fitted_by": fit_mark()},
        )

    def moved(source: str, name: str) -> None:  # `user export` without the history, `user import --as`
        archive = tmp_path / f"{source}.zip"
        assert CliRunner().invoke(app, ["user", "export", source, "-o", str(archive)]).exit_code == 0
        assert CliRunner().invoke(app, ["user", "import", str(archive), "--as", name]).exit_code == 0

    def fit(name: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["fit", "--user", name, "--json"])
        return result.exit_code, result.output

    fitted("source")
    moved("source", "imported")
    before = UserStore().get("imported").state_path.read_bytes()
    kept = CliRunner().invoke(app, ["fit", "--user", "imported"])
    assert kept.exit_code == 0, kept.output
    assert (
        "user 'imported' was imported without its history, so there is nothing to fit: it keeps"
        in kept.output
    )
    assert "cluster 1" in kept.output
    assert UserStore().get("imported").state_path.read_bytes() == before
    code, output = fit("imported")
    assert (
        code == 0 and json.loads(output)["kept_without_history"] is True and json.loads(output)["unchanged"]
    )

    fitted("emptied")
    UserStore().get("emptied").save_history([], removing=True)  # `history remove` of its one item
    code, output = fit("emptied")
    assert code == 0 and json.loads(output)["kept_without_history"] is False
    assert UserStore().get("emptied").state()["fit"]["mode"] == "cold-start"

    fitted("deleted")
    UserStore().get("deleted").history_path.unlink()  # removed by hand
    assert fit("deleted")[0] == 0 and UserStore().get("deleted").state()["fit"]["mode"] == "cold-start"

    # a fit whose items were removed before the export: the fit after the import forgets them, as it would have
    fitted("stale")
    UserStore().get("stale").save_history([], removing=True)
    moved("stale", "restale")
    assert fit("restale")[0] == 0 and UserStore().get("restale").state()["fit"]["mode"] == "cold-start"

    moved("imported", "twice")  # exported again, still without a history: still the fit it stands for
    assert json.loads(fit("twice")[1])["kept_without_history"] is True

    fitted("elsewhere", bundle="1" * 64)
    moved("elsewhere", "other")
    state = UserStore().get("other").state_path.read_bytes()
    code, output = fit("other")
    assert (
        code == 1 and "was imported without its history, with another bundle's fit, which rewrites" in output
    )
    assert UserStore().get("other").state_path.read_bytes() == state

    # items added, then all removed before any fit: still the fit it came with (no fit here learned from them)
    imported = UserStore().get("imported")
    imported.save_history([HistoryItem.create("headline", "another", "Another Headline")])
    assert user_fit.fit_without_history(imported, sha) is None  # items to fit: the usual fit
    imported.save_history([], removing=True)
    assert json.loads(fit("imported")[1])["kept_without_history"] is True

    # a cold start exported and imported: nothing to keep, the fit is a cold start again
    cold = UserStore().create("cold")
    cold.save_fit(None, {"cluster": None, "bundle_sha256": sha, "fit": {"mode": "cold-start"}})
    moved("cold", "recold")
    assert fit("recold")[0] == 0 and UserStore().get("recold").state()["fit"]["mode"] == "cold-start"


def test_fit_of_a_method_with_nothing_to_fit_says_so(localpers_home: Path) -> None:
    """`fit -m global` said "unknown method 'global'" of a method every rewrite takes (first-time-user audit)."""
    UserStore().create("ann")
    result = CliRunner().invoke(app, ["fit", "--user", "ann", "--method", "global"])
    assert result.exit_code == 2
    assert "method 'global' has no fit of its own (the methods on the adapters use CARD's, made by" in (
        result.output
    )
    assert "fit takes: card, cope, exact" in result.output
    unknown = CliRunner().invoke(app, ["fit", "--user", "ann", "--method", "nope"])
    assert (
        unknown.exit_code == 2 and "unknown method 'nope'; choose one of: card, cope, exact" in unknown.output
    )
