"""Where localpers keeps its files: platformdirs locations, overridable with `LOCALPERS_HOME`.

`LOCALPERS_HOME` puts every directory under one root (tests and portable installs use it).
This module only computes paths and creates directories; it never writes files. `check_own_directory`
guards the output folders that commands replace files in (`publish --out`, `bench --out`).
"""

import os
from collections.abc import Callable
from pathlib import Path

import platformdirs

from localpers.errors import InputError, LocalpersError

APP_NAME = "localpers"


def _root_override() -> Path | None:
    """LOCALPERS_HOME as an absolute path; None when unset or blank. A relative one is refused: it would name
    another folder in every directory a command runs from."""
    value = os.environ.get("LOCALPERS_HOME", "")
    if not value.strip():
        return None
    root = Path(value).expanduser()
    if not root.is_absolute():
        raise InputError(  # a usage error (exit 2), as other bad environment variables are
            f"LOCALPERS_HOME={value} is a relative path, which would name another folder wherever a command runs;"
            f" give an absolute one (e.g. {Path.cwd() / root})"
        )
    return root


def expand_user(path: str | Path) -> Path:
    """`path` with a leading `~` or `~user` expanded; a one-line error naming it when no such home folder is known
    (`Path.expanduser` raises a bare RuntimeError then)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise InputError(
            f"{path}: no home folder is known for {Path(path).parts[0]}; give the path in full"
        ) from None


def _made(path: Path, root: Path | None) -> Path:
    """`path`, created if missing; a one-line error naming LOCALPERS_HOME when that is what points wrong."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
        if root is not None:
            raise LocalpersError(
                f"LOCALPERS_HOME={root} cannot hold localpers' folders ({problem}: {path}); point it at a"
                " folder you can write in, or unset it"
            ) from None
        raise LocalpersError(f"cannot create {path} ({problem}); make it a folder you can write in") from None
    return path


def cache_dir(*, create: bool = True) -> Path:
    """Rebuildable data: the assembled backbone GGUF, pulled bundles (not created with `create=False`)."""
    root = _root_override()
    path = root / "cache" if root else Path(platformdirs.user_cache_dir(APP_NAME))
    return _made(path, root) if create else path


def data_dir(*, create: bool = True) -> Path:
    """User state that must survive: users, histories, fitted vectors (not created with `create=False`)."""
    root = _root_override()
    path = root / "data" if root else Path(platformdirs.user_data_dir(APP_NAME))
    return _made(path, root) if create else path


def config_dir(*, create: bool = True) -> Path:
    """Settings such as the backbone path (not created with `create=False`: reading a setting makes no folder)."""
    root = _root_override()
    path = root / "config" if root else Path(platformdirs.user_config_dir(APP_NAME))
    return _made(path, root) if create else path


def _check_creatable(directory: Path, option: str) -> None:
    """Refuse a new `directory` that could not be made (its closest existing ancestor a file, or not writable), so
    a long command is refused at its start rather than after its work, when it writes its results."""
    ancestor = next((parent for parent in directory.absolute().parents if parent.exists()), None)
    if ancestor is None:
        return
    if not ancestor.is_dir():
        raise LocalpersError(
            f"{option} {directory} cannot be made: {ancestor} is a file, not a directory; give another path"
        )
    refuse_unwritable(ancestor, f"{option} {directory} cannot be made: {ancestor}", "give another path")


def refuse_unwritable(directory: Path, what: str, fix: str) -> None:
    """Refuse `directory` unless this process may create files in it (by its effective ids where the OS can say);
    `what` opens the message."""
    effective = os.access in os.supports_effective_ids
    if not os.access(directory, os.W_OK | os.X_OK, effective_ids=effective):
        raise LocalpersError(f"{what} cannot be written (its permissions, or a read-only file system); {fix}")


def check_own_directory(
    directory: Path, *, option: str, writer: str, replaces: str, is_ours: Callable[[list[Path]], bool]
) -> None:
    """Refuse `directory` unless it is new, empty, or `is_ours(its entries)`: a command replaces files there.

    `option` and `writer` name the flag and the command ("--out", "a publish"); `replaces` says what would
    be lost ("a bundle replaces its adapters and plots"). A one-line error lists what is there. A new `directory`
    must be one that can be made (checked, not made).
    """
    if not directory.exists():
        _check_creatable(directory, option)
        return
    if not directory.is_dir():
        raise LocalpersError(
            f"{option} {directory} exists and is not a directory; give a new or empty directory"
        )
    refuse_unwritable(directory, f"{option} {directory}", "give another directory")
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise LocalpersError(f"{option} {directory}: cannot list it ({exc.strerror})") from None
    if not entries or is_ours(entries):
        return
    names = [entry.name for entry in entries]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise LocalpersError(
        f"{option} {directory} already holds files {writer} did not write ({shown}); {replaces}:"
        " give a new or empty directory"
    )
