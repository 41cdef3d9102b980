"""The README's first quick-start command: `localpers demo` on the shipped demo bundle and demo user."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localpers.bundle.locations import embedded_bundle_dir
from localpers.cli import app
from localpers.engine.backbone import Backbone

pytestmark = pytest.mark.skipif(
    not (embedded_bundle_dir() / "manifest.json").is_file(), reason="the demo bundle is not in this checkout"
)


def test_demo_fits_the_demo_user_and_compares_three_methods(backbone: Backbone) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["demo", "--json", "--articles", "2", "--model", str(backbone.path)])
    assert first.exit_code == 0, first.output
    payload = json.loads(first.stdout)
    assert payload["fitted_now"] is True
    assert payload["fit"]["mode"] == "vector"
    assert payload["fit"]["n_pairs"] >= 10
    assert len(payload["rows"]) == 2
    for row in payload["rows"]:
        assert all(row[method].strip() for method in ("global", "global-history", "card"))
    assert set(payload["style_hits"]) == {"global", "global-history", "card"}
    assert all(0 <= hits <= 2 for hits in payload["style_hits"].values())
    from localpers.users.history import HistoryItem
    from localpers.users.store import UserStore

    demo = UserStore().get("demo")  # a headline accepted in the TUI, without the demo's markers
    demo.save_history(
        [*demo.history(), HistoryItem.create("headline", "A plain article.", "A plain headline")]
    )
    again = runner.invoke(app, ["demo", "--articles", "1", "--rows", "1", "--model", str(backbone.path)])
    assert again.exit_code == 0, again.output
    assert "1 of the 1 articles" in again.output and "headlines of 1 invented article:" in again.output
    assert "24 of its 25 history items have one" in again.output
    chosen = runner.invoke(
        app, ["demo", "--json", "--articles", "1", "--candidates", "4", "--model", str(backbone.path)]
    )
    assert chosen.exit_code == 0, chosen.output
    consensus = json.loads(chosen.stdout)
    assert consensus["candidates"] == 4 and consensus["fitted_now"] is False
    assert all(consensus["rows"][0][method].strip() for method in ("global", "global-history", "card"))


def test_demo_refuses_more_articles_than_ship_in_one_line() -> None:
    from localpers.device.demo import demo_articles

    shipped = len(demo_articles())
    result = CliRunner().invoke(app, ["demo", "--articles", str(shipped + 1)])
    assert result.exit_code == 2  # a bad argument, as Typer's own refusal of --articles 0
    assert f"{shipped} demo articles ship with localpers" in result.output
    assert "Traceback" not in result.output


def test_the_demo_articles_are_distinct_and_not_in_the_history() -> None:
    from localpers.device.demo import demo_articles
    from localpers.users.history import demo_history_path
    from localpers.users.history_import import parse_history_file

    articles = demo_articles()
    history_inputs = {item.input for item in parse_history_file(demo_history_path())}
    assert len(articles) >= 12 and len(set(articles)) == len(articles)
    assert not history_inputs & set(articles)


def test_the_demo_style_detector_matches_the_demo_history_and_not_plain_headlines() -> None:
    from localpers.device.demo import carries_demo_style
    from localpers.users.history import demo_history_path
    from localpers.users.history_import import parse_history_file

    outputs = [item.output for item in parse_history_file(demo_history_path())]
    assert len(outputs) == 24 and all(carries_demo_style(text) for text in outputs)
    plain = ["Amtrak Adds 10 Late-Night Trains On Weekend", "Study Finds A Walk After Lunch Sharpens Focus"]
    assert not any(carries_demo_style(text) for text in plain)


def test_demo_leaves_a_users_own_demo_user_alone(backbone: Backbone) -> None:
    from localpers.users.history import HistoryItem
    from localpers.users.store import UserStore

    store = UserStore()
    mine = store.create("demo")
    mine.save_history(
        [
            HistoryItem.create("headline", f"Article number {i} about things", f"Headline {i}")
            for i in range(3)
        ]
    )
    before = {path.name: path.read_bytes() for path in mine.dir.iterdir() if path.is_file()}
    result = CliRunner().invoke(app, ["demo", "--articles", "1", "--model", str(backbone.path)])
    assert result.exit_code == 1
    assert "not the shipped demo user" in result.output and "Traceback" not in result.output
    after = {path.name: path.read_bytes() for path in mine.dir.iterdir() if path.is_file()}
    assert after == before, "the demo wrote into a user it did not create"


def test_a_demo_user_missing_some_shipped_items_gets_them_back_and_is_refitted() -> None:
    """Deleting a damaged line, as the history's error advised, made the demo call its own user foreign."""
    from types import SimpleNamespace

    from localpers.device.demo import ensure_demo_user
    from localpers.users.history import demo_history_path
    from localpers.users.history_import import parse_history_file
    from localpers.users.store import UserStore

    shipped = parse_history_file(demo_history_path())
    store = UserStore()
    store.create("demo").save_history(shipped[:-1])
    fitted: list[str] = []
    personalizer = SimpleNamespace(
        bundle_sha256="b" * 64, fit_user=lambda user, progress=None: fitted.append(user.name)
    )
    demo, fitted_now = ensure_demo_user(personalizer, store)  # type: ignore[arg-type]
    assert [item.id for item in demo.history()] == [item.id for item in shipped]
    assert fitted_now and fitted == ["demo"]


def test_a_demo_user_taught_in_the_tui_stays_the_demo_user() -> None:
    """An output accepted in the TUI and a shipped item removed in its History tab made `localpers demo` call the
    demo user "a history of its own" and refuse it (TUI audit, eighty-fourth session); a history imported into it
    from a file is still its own."""
    from types import SimpleNamespace

    from localpers.device.demo import ensure_demo_user
    from localpers.errors import LocalpersError
    from localpers.users.history import TUI_SOURCE, HistoryItem, demo_history_path
    from localpers.users.history_import import parse_history_file
    from localpers.users.store import UserStore

    shipped = parse_history_file(demo_history_path())
    accepted = HistoryItem.create(
        "headline", "The river bike lane opens this week.", "Lane Change: Bikes Roll", TUI_SOURCE
    )
    store = UserStore()
    store.create("demo").save_history([*shipped[1:], accepted])
    personalizer = SimpleNamespace(bundle_sha256="b" * 64, fit_user=lambda user, progress=None: None)
    demo, _ = ensure_demo_user(personalizer, store)  # type: ignore[arg-type]
    assert [item.id for item in demo.history()] == [item.id for item in [*shipped[1:], accepted]]
    imported = HistoryItem.create("headline", "An article of mine.", "My own headline", "mine.jsonl:1")
    demo.save_history([*shipped[1:], imported])
    with pytest.raises(LocalpersError, match="not the shipped demo user"):
        ensure_demo_user(personalizer, store)  # type: ignore[arg-type]
