"""matplotlib for the PNG figures that bench and publish draw: the Agg backend (no display), its files in ours.

matplotlib keeps a font list and its config under the home folder (`~/.cache/matplotlib`, `~/.config/matplotlib`);
`pyplot` points it at localpers' cache instead (`MPLCONFIGDIR`, unless the environment sets it), so that
`LOCALPERS_HOME` keeps every file a command writes under one folder (matplotlib makes the folder, or uses a
temporary one when it cannot). This module draws nothing itself.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from localpers.errors import LocalpersError
from localpers.paths import cache_dir

MATPLOTLIB_FOLDER = "matplotlib"


def pyplot() -> Any:
    """`matplotlib.pyplot`, imported with the Agg backend and its config folder in localpers' cache."""
    if not os.environ.get("MPLCONFIGDIR"):
        # read when matplotlib is first imported; a process that imported it before keeps its folder
        # a LOCALPERS_HOME refused: the figure is still drawn, and matplotlib keeps its files where it would
        with contextlib.suppress(LocalpersError):
            os.environ["MPLCONFIGDIR"] = str(cache_dir(create=False) / MATPLOTLIB_FOLDER)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
