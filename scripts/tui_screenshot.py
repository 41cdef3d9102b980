"""Render the README's screenshot of `localpers tui` on the real demo bundle, demo user and one demo article.

The app runs headless (Textual's test pilot) against a throwaway data directory, so nothing of the caller's
users is read or changed: the demo user is created there from `models/demo-user/history.jsonl`, fitted on
opening as the app does for any user, and shown one of `models/demo-user/articles.jsonl`'s articles (which the
history does not hold). The Why view is opened as a user opens it (on the token CARD's correction moved most).
The screen is saved as PNG where `cairosvg` (pip) or `rsvg-convert` is installed, as SVG otherwise. It chooses
nothing and measures nothing; the outputs are whatever this CPU decodes.

    python scripts/tui_screenshot.py --article 1 --out docs/img/tui.png     # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localpers.engine.backbone import Backbone

DEMO_USER = "demo"
SIZE = (120, 40)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--article", type=int, default=1, help="1-based line of models/demo-user/articles.jsonl"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/img/tui.png"), help="the PNG (SVG beside it)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the fit and outputs"
    )
    return parser.parse_args()


def demo_article(number: int) -> str:
    from localpers.users.history import demo_history_path

    path = demo_history_path().with_name("articles.jsonl")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not 1 <= number <= len(lines):
        raise SystemExit(f"--article {number}: {path} holds articles 1-{len(lines)}")
    return str(json.loads(lines[number - 1])["input"])


async def wait_idle(app: object, timeout: float) -> None:
    """Wait until the app has no fit or generation pending, twice in a row."""
    waited, quiet = 0.0, 0
    while quiet < 2:
        await asyncio.sleep(0.2)
        waited += 0.2
        if waited > timeout:
            raise SystemExit(f"the app stayed busy for more than {timeout:g} s")
        quiet = 0 if app.busy else quiet + 1  # type: ignore[attr-defined]


async def render(article: str, svg: Path, timeout: float, backbone: Backbone | None = None) -> None:
    """The screen as SVG; `backbone` resolved before the data directory was switched (else resolved here)."""
    from localpers.bundle.format import open_bundle
    from localpers.engine.backbone import resolve_backbone
    from localpers.methods.card.personalizer import Personalizer
    from localpers.tui.app import LocalpersApp
    from localpers.tui.service import EngineService
    from localpers.tui.userdata import import_history_file
    from localpers.users.history import demo_history_path
    from localpers.users.store import UserStore

    store = UserStore()
    import_history_file(store, DEMO_USER, demo_history_path())
    store.use(DEMO_USER)
    backbone = backbone or resolve_backbone(None)
    bundle = open_bundle(None, backbone_sha256=backbone.sha256)
    service = EngineService(lambda: Personalizer(bundle, backbone), store)
    app = LocalpersApp(service, user=DEMO_USER, text=article)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_idle(app, timeout)
            await pilot.press("f2")
            await pilot.pause(0.5)
            app.save_screenshot(filename=svg.name, path=str(svg.parent))
            print(f"global:   {app.main.baseline_panel.text.strip()}")
            print(f"personal: {app.main.personal_panel.text.strip()}")
    finally:
        app.close_service()


def to_png(svg: Path, png: Path) -> bool:
    try:
        import cairosvg  # type: ignore[import-not-found]  # not a project dependency: `pip install cairosvg`
    except ImportError:
        cairosvg = None
    if cairosvg is not None:
        cairosvg.svg2png(url=str(svg), write_to=str(png))
        return True
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-o", str(png), str(svg)], check=True)
        return True
    return False


def main() -> None:
    args = parse_args()
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    article = demo_article(args.article)
    from localpers.engine.backbone import resolve_backbone

    backbone = resolve_backbone(None)  # the caller's (LOCALPERS_MODEL, pulled or default), before the switch
    with tempfile.TemporaryDirectory(prefix="localpers-screenshot-") as scratch:
        os.environ["LOCALPERS_HOME"] = str(Path(scratch) / "home")  # the caller's users stay untouched
        svg = Path(scratch) / "tui.svg"
        asyncio.run(render(article, svg, args.timeout, backbone))
        if to_png(svg, out):
            print(f"wrote {out}")
            return
        kept = shutil.copy(svg, out.with_suffix(".svg"))
    raise SystemExit(
        f"wrote {kept} only; `pip install cairosvg` (or install rsvg-convert) to make {out.name}"
    )


if __name__ == "__main__":
    main()
