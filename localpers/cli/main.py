"""The assembled `localpers` command line: every command module registered on the shared Typer app.

Command modules import `localpers.cli.common` and the shared helper modules (`sampling`, `numbers`, `progress`,
`expiry`, `completion`, `user_show`, `history_hints`, `streams`), never one another; this module is the one place
that imports them all, so adding a command group is one module with a `register(app)` (or a Typer group added
with `add_typer`, as `user` and `history` are) and one line here. A command of a group kept in a module of its
own registers on the group it is given (`history_remove.register(history.history_app)`).
"""

from __future__ import annotations

from localpers.cli import (
    api,
    bench,
    bundle,
    demo,
    device,
    doctor,
    generate,
    history,
    history_remove,
    profile,
    publish,
    repo,
    tui,
    users,
)
from localpers.cli.common import app

doctor.register(app)
generate.register(app)
app.add_typer(users.user_app, name="user")
history_remove.register(history.history_app)
app.add_typer(history.history_app, name="history")
for _module in (bundle, device, demo, bench, tui, profile, api, repo, publish):
    _module.register(app)

__all__ = ["app"]
