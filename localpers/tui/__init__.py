"""`localpers tui`: a Textual app to write, compare, understand and teach your style.

`LocalpersApp` (app.py) holds the behaviour, `screens/` the layout and dialogs, `widgets/` one widget per
module, `service.py` the small Protocol to the engine (so tests can use a fake) and `userdata.py` the
reads and writes of the user's folder. Start it with `run_app(EngineService(...))` or `localpers tui`.
"""

from localpers.tui.app import LocalpersApp, run_app
from localpers.tui.service import EngineService, RewriteRequest, WritingService

__all__ = ["EngineService", "LocalpersApp", "RewriteRequest", "WritingService", "run_app"]
