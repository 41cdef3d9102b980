"""What the shell completes for option and argument values: user names, methods, tasks.

Typer's completion (`localpers --install-completion`) runs the program at every TAB with the words typed so
far; these functions answer for the values. They only read: a users folder that does not exist yet is not
created, and a problem (a bad LOCALPERS_HOME, an unreadable folder) completes nothing rather than printing.
"""

from __future__ import annotations

from localpers.errors import LocalpersError


def user_names(incomplete: str) -> list[str]:
    """The users on this device whose names start with `incomplete`."""
    from localpers.paths import data_dir
    from localpers.users.names import NAME_PATTERN

    try:
        users = data_dir(create=False) / "users"
        names = [path.name for path in users.iterdir() if path.is_dir() and NAME_PATTERN.fullmatch(path.name)]
    except (OSError, LocalpersError):
        return []
    return sorted(name for name in names if name.startswith(incomplete))


def method_names(incomplete: str) -> list[str]:
    """Every method `rewrite --method` takes."""
    from localpers.methods.registry import method_names as all_methods

    return [name for name in all_methods() if name.startswith(incomplete)]


def fitted_method_names(incomplete: str) -> list[str]:
    """The methods `fit --method` learns something for."""
    from localpers.methods.registry import method_names as all_methods

    return [name for name in all_methods(fitted=True) if name.startswith(incomplete)]


def task_names(incomplete: str) -> list[str]:
    """headline, title, paraphrase, free."""
    from localpers.tasks import TASKS

    return [name for name in TASKS if name.startswith(incomplete)]
