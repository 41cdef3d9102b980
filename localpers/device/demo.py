"""The demo user: created from the shipped (invented) history and fitted with CARD when missing or stale.

Used by `localpers demo`, the TUI's first run and scripts; it writes only the demo user's own folder, and refuses
a user that merely shares its name.
`compare_on_demo` rewrites the shipped articles with the registry's compared methods (baseline first),
each through its `Method.rewrite`, exactly as `localpers rewrite --method NAME --user demo` would;
`style_hits` counts the headlines that carry the demo user's markers (`carries_demo_style`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from localpers.errors import LocalpersError
from localpers.methods.base import RewriteOptions
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.registry import compared_methods, get_method
from localpers.methods.stored_files import fit_made_for
from localpers.users.store import User, UserStore

# A first demo fit takes ~10-20 s on 2 cores; a second `localpers demo` started meanwhile waits this long for it.
DEMO_FIT_WAIT_SECONDS = 600.0

DEMO_USER = "demo"
_DEMO_KICKER = re.compile(r"^[^:]{2,40}: \S")


def ensure_demo_user(
    personalizer: Personalizer,
    store: UserStore,
    progress: Any = None,
    on_restored: Callable[[int], None] | None = None,
) -> tuple[User, bool]:
    """The demo user, created from the shipped history and fitted when missing or stale.

    A user called `demo` is taken as the shipped one while its history holds every shipped item (items added
    since may follow them), or while every item of it is a shipped one or an output accepted in the TUI (whose
    History tab may also have removed shipped items); one with a history of its own is refused, never fitted or
    written to. One that holds shipped items only, but not all of them (a
    damaged line deleted, as its error advised), gets the shipped history back and is fitted anew, so the demo's
    figures are the shipped user's; `on_restored` is told how many items were put back (`history remove` may have
    taken them on purpose, so the caller says so).
    """
    from localpers.users.history import TUI_SOURCE, demo_history_path
    from localpers.users.history_import import parse_history_file

    try:
        demo = store.get(DEMO_USER) if DEMO_USER in store.list() else store.create(DEMO_USER)
    except LocalpersError:
        if DEMO_USER not in store.list():
            raise
        demo = store.get(DEMO_USER)  # another `localpers demo` created it a moment ago
    shipped = parse_history_file(demo_history_path())
    shipped_ids = {item.id for item in shipped}
    restored = False
    with demo.locked():
        history = demo.history()
        history_ids = {item.id for item in history}
        own = {item.id for item in history if item.source != TUI_SOURCE}
        if not history:
            demo.save_history(shipped)
        elif history_ids < shipped_ids:
            demo.save_history(shipped)
            restored = True
            put_back = len(shipped_ids - history_ids)
        elif not (shipped_ids <= history_ids or own <= shipped_ids):
            raise LocalpersError(
                f"a user named '{DEMO_USER}' exists with a history of its own, so it is not the shipped demo user and"
                " the demo leaves it alone; rename it (`localpers user export demo --with-history -o FILE.zip`, `localpers"
                " user import FILE.zip --as NAME`, then `localpers user delete demo`) or run the demo with another"
                " LOCALPERS_HOME"
            )
    if restored and on_restored is not None:
        on_restored(put_back)
    fitted_now = False
    # another `localpers demo` fitting the demo user is waited for: its fit is then this one's
    with demo.fitting(wait_seconds=DEMO_FIT_WAIT_SECONDS):
        state = demo.state()
        if restored or not state.get("fit") or not fit_made_for(state, personalizer.bundle_sha256):
            personalizer.fit_user(demo, progress=progress)
            fitted_now = True
    return demo, fitted_now


def demo_articles() -> list[str]:
    """Inputs of the shipped demo articles (invented text, see models/demo-user/README.md)."""
    from localpers.users.history import demo_history_path

    path = demo_history_path().with_name("articles.jsonl")
    return [json.loads(line)["input"] for line in path.read_text().splitlines() if line.strip()]


def demo_methods() -> tuple[str, ...]:
    """The methods `localpers demo` compares, in its column order: the baseline first, CARD last."""
    return tuple(reversed(compared_methods()))


def compare_on_demo(
    personalizer: Personalizer,
    demo: User,
    articles: Sequence[str],
    progress: Callable[[str, int, int], None] | None = None,
    candidates: int = 1,
) -> list[dict[str, str]]:
    """One row per article: `article` (its body, after any "Headline:"-style label) and each method's text.

    `progress(stage, done, total)` is called after each article, as the fit's progress callback is.
    `candidates` > 1: every method keeps the consensus of that many candidates (`localpers rewrite --candidates`).
    """
    rows = []
    for done, article in enumerate(articles, start=1):
        outputs = {
            name: get_method(name).rewrite(
                personalizer, demo, article, RewriteOptions(candidates=candidates)
            )["text"]
            for name in demo_methods()
        }
        rows.append({"article": article.split(":", 1)[-1].strip(), **outputs})
        if progress is not None:
            progress("demo articles", done, len(articles))
    return rows


def style_hits(rows: Sequence[dict[str, str]]) -> dict[str, int]:
    """How many of each compared method's headlines in `rows` carry the demo user's markers."""
    return {method: sum(carries_demo_style(row[method]) for row in rows) for method in demo_methods()}


def carries_demo_style(text: str) -> bool:
    """Whether a headline shows the demo user's habit: a short kicker before a colon, or "Here's Why"."""
    return bool(_DEMO_KICKER.match(text)) or "here's why" in text.lower().replace("\u2019", "'")
