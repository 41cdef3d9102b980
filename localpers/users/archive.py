"""The `localpers user export|import` archive: one user's folder as a zip with a checked manifest.

`pack_archive` writes the zip (manifest.json: format, version, name, time, cluster, and each member's
sha256); `read_archive` reads one back, refusing anything that is not such an archive before it
decompresses a byte too many (member count, names, sizes, a single vector) and checking every member
against its sha256. Which files of a user go in, and where an imported user lands, is
`localpers.users.store.UserStore`'s; this module touches no user folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

from localpers.errors import InputError, LocalpersError
from localpers.untrusted import JSONProblem, one_line, parse_json, reject_duplicate_keys
from localpers.users import folder
from localpers.users.folder import VECTOR_FILE_PATTERN

try:
    from lzma import LZMAError
except ImportError:  # a Python built without lzma: zipfile then refuses LZMA members with NotImplementedError

    class LZMAError(Exception):  # type: ignore[no-redef]
        """Never raised."""


ARCHIVE_FORMAT = "localpers-user"
ARCHIVE_VERSION = 1
MAX_ARCHIVE_MEMBER_BYTES = 64 * 1024 * 1024
# An export holds manifest.json, state.json, at most one vector and optionally history.jsonl: a zip with
# more members, or more bytes in all, is not one (and may be a zip bomb). The total leaves room beside the
# largest history a user may have (64 MiB) for the rest (a few KB in practice), so every export imports back.
ARCHIVE_MEMBER_DATE = (1980, 1, 1, 0, 0, 0)
MAX_ARCHIVE_MEMBERS = 4
MAX_ARCHIVE_TOTAL_BYTES = MAX_ARCHIVE_MEMBER_BYTES + 4 * 1024 * 1024
MAX_ARCHIVE_FILE_BYTES = MAX_ARCHIVE_TOTAL_BYTES


def pack_archive(name: str, cluster: Any, members: dict[str, bytes]) -> bytes:
    """The zip of a user archive: `members` (file name -> bytes) under a manifest that lists their sha256."""
    manifest = {
        "format": ARCHIVE_FORMAT,
        "format_version": ARCHIVE_VERSION,
        "name": name,
        "exported_at": folder.now(),
        "cluster": cluster,
        "with_history": "history.jsonl" in members,
        "files": {member: hashlib.sha256(data).hexdigest() for member, data in members.items()},
    }
    largest = max(members, key=lambda member: len(members[member]), default=None)
    if largest is not None and len(members[largest]) > MAX_ARCHIVE_MEMBER_BYTES:
        raise LocalpersError(
            f"the user's {largest} is {len(members[largest]):,} bytes, more than the {MAX_ARCHIVE_MEMBER_BYTES:,}"
            " an archive can hold; `localpers history remove --oldest N` makes the history smaller"
        )
    if sum(map(len, members.values())) > MAX_ARCHIVE_TOTAL_BYTES - (1 << 20):  # 1 MiB for the manifest
        raise LocalpersError(
            f"the user's files are more than the {MAX_ARCHIVE_TOTAL_BYTES:,} bytes an archive can hold;"
            " `localpers history remove --oldest N` makes the history smaller"
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(_member("manifest.json"), json.dumps(manifest, indent=2) + "\n")
        for member, data in members.items():
            archive.writestr(_member(member), data)
    return buffer.getvalue()


def _member(name: str) -> zipfile.ZipInfo:
    """A member with a fixed date (the manifest's `exported_at` says when): zip can write no date before 1980 or
    after 2107, and a device without a battery-backed clock may boot at 1970."""
    info = zipfile.ZipInfo(name, date_time=ARCHIVE_MEMBER_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o600 << 16
    return info


def read_archive(archive: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(manifest, the other members by name) of a user archive whose files match their recorded sha256.

    Refused before anything is decompressed: a non-regular file, more than MAX_ARCHIVE_MEMBERS
    members, a repeated or unexpected member name, more than one vector, or declared sizes over the
    per-member or total caps. Decompression is capped again at the declared sizes.
    """
    from localpers.regular_files import read_regular_file

    raw_archive = read_regular_file(
        archive,
        MAX_ARCHIVE_FILE_BYTES,
        what="user archive (.zip)",
        too_big="`localpers user export` writes none so large: not a localpers user archive",
    )
    allowed = {"manifest.json", "state.json", "history.jsonl"}
    try:
        with zipfile.ZipFile(io.BytesIO(raw_archive)) as zipped:
            infos = zipped.infolist()
            if len(infos) > MAX_ARCHIVE_MEMBERS:
                raise InputError(
                    f"{archive}: {len(infos)} members, more than the {MAX_ARCHIVE_MEMBERS} of a user archive;"
                    " not a localpers user archive"
                )
            names = [info.filename for info in infos]
            for info in infos:
                shown = one_line(repr(info.filename), 80)
                if info.filename not in allowed and not VECTOR_FILE_PATTERN.fullmatch(info.filename):
                    raise InputError(f"{archive}: unexpected file {shown}; not a localpers user archive")
                if names.count(info.filename) > 1:
                    raise InputError(f"{archive}: member {shown} appears twice; not a localpers user archive")
                if info.file_size > MAX_ARCHIVE_MEMBER_BYTES:
                    raise InputError(f"{archive}: {info.filename} is too large for a user archive")
                if info.flag_bits & 0x1:  # zipfile asks a password with a RuntimeError; localpers writes none
                    raise InputError(
                        f"{archive}: {info.filename} is encrypted; a localpers user archive never is: export the"
                        " user again with `localpers user export`"
                    )
            if sum(1 for n in names if VECTOR_FILE_PATTERN.fullmatch(n)) > 1:
                raise InputError(f"{archive}: more than one vector file; not a localpers user archive")
            declared = sum(info.file_size for info in infos)
            if declared > MAX_ARCHIVE_TOTAL_BYTES:
                raise InputError(
                    f"{archive}: its members unpack to {declared} bytes, more than the"
                    f" {MAX_ARCHIVE_TOTAL_BYTES} of a user archive"
                )
            raw: dict[str, bytes] = {}
            for info in infos:
                with zipped.open(info) as member:
                    data = member.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise InputError(f"{archive}: {info.filename} is not the size the archive declares")
                raw[info.filename] = data
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        NotImplementedError,
        ValueError,
        zlib.error,  # a damaged deflate stream (a truncated or bit-flipped download)
        LZMAError,  # a damaged LZMA member
    ) as exc:
        reason = one_line(str(exc), 120)
        raise InputError(f"{archive} is not a localpers user archive ({reason})") from None
    if "manifest.json" not in raw:
        raise InputError(f"{archive} has no manifest.json; not a localpers user archive")
    try:
        # a key given twice (two names, two file lists): which was meant is unknown, so refused, not the last taken
        manifest = parse_json(raw["manifest.json"], object_pairs_hook=reject_duplicate_keys)
    except JSONProblem as exc:
        raise InputError(f"{archive}: manifest.json is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARCHIVE_FORMAT:
        raise InputError(f"{archive} is not a localpers user archive (manifest.json field 'format')")
    if manifest.get("format_version") != ARCHIVE_VERSION:
        shown = one_line(repr(manifest.get("format_version")), 40)
        raise InputError(
            f"{archive}: manifest.json field 'format_version' is {shown}; this localpers reads "
            f"version {ARCHIVE_VERSION}: upgrade localpers"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict) or set(listed) != set(raw) - {"manifest.json"}:
        raise InputError(f"{archive}: manifest.json field 'files' does not list the archive's files")
    for member, expected in listed.items():
        if hashlib.sha256(raw[member]).hexdigest() != expected:
            raise InputError(f"{archive}: {member} does not match its sha256 in manifest.json (damaged)")
    del raw["manifest.json"]
    return manifest, raw
