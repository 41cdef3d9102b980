"""What tests of "read the history once" share: a patch of `User.history` that counts its reads."""

from __future__ import annotations

import pytest


def count_history_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the users whose history is read from now on, one entry per read."""
    from localpers.users.folder import User

    reads: list[str] = []
    real = User.history

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(User, "history", counted)
    return reads
