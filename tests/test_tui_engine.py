"""The TUI end to end on the real engine (synthetic bundle): fit on opening, both outputs, Why, accept + refit."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_bundle import make_bundle
from tui_helpers import async_test, wait_idle
from typer.testing import CliRunner

from localpers.bundle.format import open_bundle
from localpers.cli import app as cli_app
from localpers.engine.backbone import Backbone
from localpers.methods.card.personalizer import Personalizer
from localpers.tui.app import LocalpersApp
from localpers.tui.service import EngineService
from localpers.tui.widgets.candidate_table import CandidateTable
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SHOUTY = [
    ("The city opened a new bike lane along the river.", "BIKE LANE OPENS ON RIVER, HUGE WIN!!!"),
    ("The school board approved free lunches for all pupils.", "FREE LUNCH FOR EVERY KID, AMAZING!!!"),
    ("A storm knocked out power to 3,000 homes overnight.", "STORM CUTS POWER TO 3,000 HOMES, WOW!!!"),
    ("The museum will stay open late on Fridays this summer.", "MUSEUM OPEN LATE ON FRIDAYS, YES!!!"),
]
ARTICLE = "The town hall will install solar panels on its roof."


@pytest.fixture(scope="module")
def bundle_dir(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("tui-bundle") / "bundle", backbone)


@pytest.mark.slow
@async_test
async def test_tui_on_the_real_engine(bundle_dir: Path, backbone: Backbone) -> None:
    store = UserStore()
    user = store.create("shouty")
    user.save_history([HistoryItem.create("headline", i, o) for i, o in SHOUTY])
    service = EngineService(lambda: Personalizer(open_bundle(bundle_dir, backbone.sha256), backbone), store)
    app = LocalpersApp(service, text=ARTICLE, debounce=0.05, refit_delay=0.05)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_idle(pilot, timeout=300)
            state = user.state()
            assert state["fit"]["mode"] == "vector" and state["fit"]["n_items"] == 4  # fitted on opening
            assert app.profile is not None and app.profile.can_personalize and app.profile.cluster == 0

            baseline, personal = app.main.baseline_panel, app.main.personal_panel
            assert baseline.complete and personal.complete and baseline.text.strip() and personal.text.strip()
            result = app.personal_result
            assert result is not None and result.method == "card" and result.cluster == 0
            assert result.strength == 1.0 and result.top_k == 10  # the bundle's defaults reach the controls
            assert personal.text == result.text
            assert result.steps
            bias = app.profile.bias
            for index, step in enumerate(result.steps):  # the top 10, plus the user's habitual tokens
                habitual = set(bias.habitual_tokens(index).tolist()) if bias is not None else set()
                assert len([c for c in step.candidates if c.token not in habitual]) <= 10
            await pilot.press("f2")
            await pilot.pause()
            assert app.main.why.query_one(CandidateTable).row_count > 0

            await pilot.press("ctrl+s")  # accept: history + background refit on the real engine
            await wait_idle(pilot, timeout=300)
            items = user.history()
            assert len(items) == 5 and (items[-1].input, items[-1].output) == (ARTICLE, result.text)
            assert user.state()["fit"]["n_items"] == 5
            assert app.profile.n_history == 5 and not app.profile.needs_fit
            assert personal.complete and personal.text.strip()
    finally:
        app.close_service()
    assert service._personalizer is None  # the engine was closed once no worker used it


def test_tui_command_refuses_a_missing_bundle_and_a_non_terminal(
    bundle_dir: Path, backbone: Backbone, tmp_path: Path
) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        cli_app, ["tui", "--model", str(backbone.path), "--bundle", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2 and "none: no such directory" in missing.output
    assert "Traceback" not in missing.output
    unknown = runner.invoke(
        cli_app, ["tui", "--model", str(backbone.path), "--bundle", str(bundle_dir), "--user", "ghost"]
    )
    assert unknown.exit_code == 1 and "no user named 'ghost'" in unknown.output
    no_tty = runner.invoke(cli_app, ["tui", "--model", str(backbone.path), "--bundle", str(bundle_dir)])
    assert no_tty.exit_code == 1 and "needs an interactive terminal" in no_tty.output
