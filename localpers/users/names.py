"""User names: which names a user folder may have, and which a new user may take.

A name is 1-32 lowercase letters, digits, '-' or '_', starting with a letter or digit (`NAME_PATTERN`), so it is
a folder name on every system and never differs from another only in case. A new user may not take a name
Windows reserves for a device. This module only checks names; `localpers.users.store` makes and lists folders.
"""

from __future__ import annotations

import re

from localpers.errors import InputError

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


def validate_name(name: str) -> str:
    """`name` if it is a valid user name, else a one-line error (exit 2) saying what is allowed."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InputError(
            f"invalid user name {name!r}: use 1-32 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


# Names Windows reserves for devices whatever the extension: a folder so named cannot be made there. Refused for
# new users on every system, so a user exported here can be imported on any machine under its own name.
WINDOWS_RESERVED_NAMES = frozenset(
    ["con", "prn", "aux", "nul", *(f"com{n}" for n in range(1, 10)), *(f"lpt{n}" for n in range(1, 10))]
)


def validate_new_name(name: str, advice: str = "choose another") -> str:
    """`name` if a new user may take it: a valid name (`validate_name`) that no system reserves."""
    validate_name(name)
    if name in WINDOWS_RESERVED_NAMES:
        raise InputError(
            f"user name {name!r} is a device name on Windows, where no folder can take it; {advice}"
        )
    return name
