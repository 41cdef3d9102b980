"""What `pull` records beside each installed version, so that the installed bundle's manifest stays the pulled one.

The per-file sha256 checks cover the files a manifest lists, not the manifest itself: an installed
`manifest.json` edited on disk (new hashes, a changed `head.alpha`) would pass them. `pull` therefore writes
`versions/<id>.pulled.json` (the signed manifest's sha256, the TUF target hash, where it came from and its
publisher's fingerprint) before it
renames the staged bundle into `versions/<id>`, and `check_installed_manifest` refuses the installed bundle when
its manifest no longer has that hash. A version pulled by a localpers that wrote no record is not checked (the
next pull that finds it up to date writes one). A pulled version given by its path (`bundles/current`,
`versions/<id>`) is checked as the default bundle is; other bundle directories have no record: they are checked
against their own manifest only.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from localpers.atomic import atomic_write_bytes
from localpers.bundle.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from localpers.errors import InputError, LocalpersError
from localpers.regular_files import read_regular_file
from localpers.untrusted import JSONProblem, one_line, parse_json

RECORD_SUFFIX = ".pulled.json"
RECORD_LIMIT = 64 << 10  # a record is a few hundred bytes
_SHA256 = re.compile(r"[0-9a-f]{64}")


def record_path(version_dir: Path) -> Path:
    """`versions/<id>.pulled.json` for the installed version `versions/<id>`."""
    return version_dir.with_name(version_dir.name + RECORD_SUFFIX)


def write_record(
    version_dir: Path, manifest_sha256: str, source: str, *, signed: bool, publisher: str | None = None
) -> None:
    """Record which manifest `pull` installed as `version_dir` (written before the directory is renamed in), and
    for a signed one the fingerprint of its publisher."""
    document: dict[str, object] = {"manifest_sha256": manifest_sha256, "source": source, "signed": signed}
    if publisher is not None:
        document["publisher"] = publisher
    atomic_write_bytes(record_path(version_dir), json.dumps(document).encode())


def _read_record(version_dir: Path) -> bytes | None:
    """The record's bytes, None where there is none; a FIFO, device or folder there is a one-line refusal (read
    blocking, a FIFO hung every command that opened the bundle)."""
    path = record_path(version_dir)
    if not path.exists() and not path.is_symlink():
        return None
    return read_regular_file(path, RECORD_LIMIT, what="pull record", stored=True)


def recorded_publisher(version_dir: Path) -> str | None:
    """The publisher fingerprint `pull` recorded for the installed version, or None (unsigned, an older record,
    or none readable: `check_installed_manifest` speaks of a damaged one)."""
    try:
        data = _read_record(version_dir)
        record = parse_json(data) if data is not None else None
    except (LocalpersError, JSONProblem):
        return None
    publisher = record.get("publisher") if isinstance(record, dict) else None
    return publisher if isinstance(publisher, str) and _SHA256.fullmatch(publisher) else None


def _pull_command(record: object) -> str:
    source = record.get("source") if isinstance(record, dict) else None
    if not isinstance(source, str) or not source:
        return "localpers pull URL"
    signed = record.get("signed", True) if isinstance(record, dict) else True
    return f"localpers pull {one_line(source, 200)}" + ("" if signed else " --unsigned")


def pull_command(version_dir: Path) -> str:
    """The command that pulls the installed bundle at `version_dir` again (`localpers pull URL` if unknown)."""
    try:
        data = _read_record(version_dir)
        return _pull_command(parse_json(data)) if data is not None else "localpers pull URL"
    except (LocalpersError, JSONProblem):
        return "localpers pull URL"


def check_installed_manifest(version_dir: Path) -> None:
    """Refuse the installed bundle at `version_dir` if its manifest.json is not the one `pull` recorded."""
    path = record_path(version_dir)
    try:
        data = _read_record(version_dir)
    except LocalpersError as exc:
        raise InputError(f"{exc}; then run `localpers pull URL` again") from None
    if data is None:
        return  # installed by a localpers that kept no record
    try:
        record = parse_json(data)
    except JSONProblem:
        record = None
    expected = record.get("manifest_sha256") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(expected, str) or not _SHA256.fullmatch(expected):
        raise InputError(
            f"{path}: the record of the installed bundle is damaged; run `localpers pull URL` again"
        )
    manifest = version_dir / MANIFEST_NAME
    try:
        actual = hashlib.sha256(
            read_regular_file(manifest, MAX_MANIFEST_BYTES, what="bundle manifest", stored=True)
        ).hexdigest()
    except LocalpersError as exc:
        raise InputError(f"{exc}; then run `{_pull_command(record)}` again") from None
    if actual != expected:
        raise InputError(
            f"the installed bundle's manifest.json ({manifest}) changed since it was pulled; run"
            f" `{_pull_command(record)}` again"
        )


def record_holds(version_dir: Path) -> bool:
    """Whether the installed version has a record its manifest passes (`check_installed_manifest`)."""
    if not record_path(version_dir).exists():
        return False
    try:
        check_installed_manifest(version_dir)
    except LocalpersError:
        return False
    return True
