"""Where localpers keeps its files: platformdirs locations, overridable with `LOCALPERS_HOME`.

`LOCALPERS_HOME` puts every directory under one root (tests and portable installs use it).
This module only computes paths and creates directories; it never writes files.
"""

import os
from pathlib import Path

import platformdirs

APP_NAME = "localpers"


def _root_override() -> Path | None:
    value = os.environ.get("LOCALPERS_HOME")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Rebuildable data: the assembled backbone GGUF, pulled bundles."""
    root = _root_override()
    path = root / "cache" if root else Path(platformdirs.user_cache_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """User state that must survive: users, histories, fitted vectors."""
    root = _root_override()
    path = root / "data" if root else Path(platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    """Settings such as the backbone path."""
    root = _root_override()
    path = root / "config" if root else Path(platformdirs.user_config_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path
