"""`scripts/tui_screenshot.py` renders the app on the real demo bundle and demo user, fitted on opening."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from localpers.engine.backbone import Backbone
from localpers.users.store import UserStore

SCRIPT = Path(__file__).parent.parent / "scripts" / "tui_screenshot.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tui_screenshot", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_article_number_out_of_range_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--article", "99", "--out", str(tmp_path / "tui.png")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "--article 99" in done.stderr and "articles 1-16" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "tui.png").exists()


@pytest.mark.slow
def test_the_screen_shows_both_outputs_the_examples_and_the_why_view(
    backbone: Backbone, tmp_path: Path
) -> None:
    script = load_script()
    svg = tmp_path / "tui.svg"
    asyncio.run(script.render(script.demo_article(1), svg, timeout=300))
    screen = svg.read_text(encoding="utf-8").replace("&#160;", " ")
    for shown in (
        "user demo",
        "24 examples",
        "Non-personalized",
        "Personalized",
        "Why (F2)",
        "changed by your vector",  # "N choices" or "1 choice", whatever this CPU decodes
    ):
        assert shown in screen, shown
    assert "Your history shown to the model (5)" in screen
    fit = UserStore().get("demo").state()["fit"]  # fitted on opening, in the test's own data directory
    assert fit["n_items"] == 24 and isinstance(fit["history_sha256"], str)
