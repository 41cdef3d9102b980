"""Cases the ninety-first session's mutation round found untested (each let a changed line pass every test).

An export's files must leave the archive room for its manifest: a user whose files filled the archive's whole
bound wrote an archive no import would take back.
"""

from __future__ import annotations

import pytest

from localpers.errors import LocalpersError
from localpers.users.archive import MAX_ARCHIVE_MEMBER_BYTES, MAX_ARCHIVE_TOTAL_BYTES, pack_archive

MANIFEST_ROOM = 1 << 20


def test_an_export_keeps_a_mebibyte_of_the_archives_bound_for_its_manifest() -> None:
    room_for_files = MAX_ARCHIVE_TOTAL_BYTES - MANIFEST_ROOM
    history = b"\n" * MAX_ARCHIVE_MEMBER_BYTES
    fits = {"history.jsonl": history, "state.json": b" " * (room_for_files - len(history))}
    assert pack_archive("ann", 0, fits)[:2] == b"PK"
    over = {"history.jsonl": history, "state.json": b" " * (room_for_files - len(history) + 1)}
    with pytest.raises(LocalpersError, match="more than the .* bytes an archive can hold"):
        pack_archive("ann", 0, over)
