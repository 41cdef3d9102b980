"""A FIFO in the bundle cache or the trust store (ninetieth session's trust audit): records, stamps, pointers and
python-tuf's kept metadata were opened blocking, so a FIFO at any of them hung `pull`, `bundle info` and
`rewrite` for good (and `pull`, the mend an error gave, hung too). Each is now a one-line refusal, or read as
absent where a missing file is. Commands run in a subprocess with a timeout: the old code never returned."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_serve_pull import BACKBONE_SHA, make_bundle, publish
from test_signed_pull import pull

from localpers.bundle.locations import bundles_root, installed_bundle_dir
from localpers.bundle.record import record_path
from localpers.bundle.trust import trust_store

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")

PULL = """
import sys
from localpers.bundle.pull import pull_bundle
from localpers.errors import LocalpersError
try:
    pull_bundle(sys.argv[1], backbone_sha256=sys.argv[2])
except LocalpersError as exc:
    sys.exit(f"error: {exc}")
"""


def run_bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """Run python with `args` in this test's LOCALPERS_HOME; a hang fails the test after 60 s."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ)
    )


@pytest.fixture
def pulled(tmp_path: Path) -> tuple[Path, str]:
    """(repository, fingerprint), its bundle pulled once."""
    repository = tmp_path / "repo"
    fingerprint = publish(make_bundle(tmp_path / "bundle"), repository, tmp_path / "keys")
    pull(repository, trust=fingerprint)
    return repository, fingerprint


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def test_a_fifo_at_the_pull_record_is_refused_in_one_line(pulled: tuple[Path, str]) -> None:
    installed = installed_bundle_dir()
    assert installed is not None
    record = record_path(installed)
    replace_with_fifo(record)
    info = run_bounded("-m", "localpers", "bundle", "info")
    assert info.returncode != 0 and info.stderr.count("\n") == 1, info.stderr
    assert f"{record} is not a regular file" in info.stderr and "localpers pull" in info.stderr
    repository, _ = pulled
    again = run_bounded("-c", PULL, str(repository), BACKBONE_SHA)  # it cannot write the record through it
    assert again.returncode != 0 and again.stderr.count("\n") == 1 and str(record) in again.stderr, (
        again.stderr
    )


def test_a_fifo_in_the_trust_store_is_refused_naming_it(pulled: tuple[Path, str]) -> None:
    repository, fingerprint = pulled
    timestamp = trust_store(fingerprint) / "timestamp.json"
    replace_with_fifo(timestamp)
    result = run_bounded("-c", PULL, str(repository), BACKBONE_SHA)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert (
        f"{timestamp} is not a regular file" in result.stderr and "delete it and pull again" in result.stderr
    )


@pytest.mark.parametrize("name", [".pull.lock", "in-use"])
def test_a_fifo_at_a_lock_file_is_not_waited_on(pulled: tuple[Path, str], name: str) -> None:
    installed = installed_bundle_dir()
    assert installed is not None
    path = bundles_root() / name if name.startswith(".") else installed.with_name(f"{installed.name}.in-use")
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    repository, _ = pulled
    if name == "in-use":  # every command opening the pulled bundle holds it: not held, not waited on
        result = run_bounded("-m", "localpers", "bundle", "info")
        assert result.returncode == 0, result.stderr
    else:
        result = run_bounded("-c", PULL, str(repository), BACKBONE_SHA)
        assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
        assert f"{path}: cannot be opened (not a regular file" in result.stderr


def test_a_fifo_at_the_content_stamp_reads_as_not_checked(pulled: tuple[Path, str]) -> None:
    from localpers.bundle.format import open_bundle
    from localpers.methods.card.bundle_content import CHECKED_STAMP, passed_before

    stamp = bundles_root() / CHECKED_STAMP
    if stamp.exists():
        stamp.unlink()
    os.mkfifo(stamp)
    bundle = open_bundle(backbone_sha256=BACKBONE_SHA)
    answers: list[bool] = []
    reader = threading.Thread(target=lambda: answers.append(passed_before(bundle)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # let the old code's blocked open return, so the test run can end
        with open(stamp, "wb"):
            pass
        pytest.fail("passed_before waited on the FIFO")
    assert answers == [False]


def test_a_pull_lock_that_cannot_be_made_is_not_told_to_be_deleted(tmp_path: Path, monkeypatch) -> None:
    """With nothing in the lock file's place, "delete it" named a file that is not there (the session's review)."""
    from localpers.bundle import pull as pull_module
    from localpers.errors import LocalpersError

    def denied(path: Path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(pull_module, "open_lock_file", denied)
    with (
        pytest.raises(
            LocalpersError, match=f"cannot be opened \\(Permission denied\\); make {tmp_path} writable"
        ),
        pull_module._pull_lock(tmp_path),
    ):
        pass
    (tmp_path / pull_module.LOCK_NAME).mkdir()
    with pytest.raises(LocalpersError, match="move it away"), pull_module._pull_lock(tmp_path):
        pass


def test_hashing_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    """`sha256_of_file`'s callers check for a regular file first; a FIFO put there after the check blocked the
    open for a writer (ninety-first session). A helper thread writes to it after a while, so the old code fails
    instead of hanging."""
    from fifo_helpers import fed_fifo

    from localpers.bundle.format import sha256_of_file

    fifo = tmp_path / "manifest.json"
    with fed_fifo(fifo, b"{}", seconds=2.0), pytest.raises(OSError, match="not a regular file"):
        sha256_of_file(fifo)


def test_a_listed_file_that_cannot_be_hashed_is_a_bundle_problem_not_a_bare_os_error(
    tmp_path: Path, monkeypatch
) -> None:
    """A file swapped for a FIFO between `check_file`'s stat and its hash (or unreadable there) reached the command
    line as a bare OSError; it is a `BundleProblem` naming the file, as the stat's own failures are."""
    import errno

    from localpers.bundle import format as bundle_format
    from localpers.bundle.manifest import BundleProblem

    (tmp_path / "head.safetensors").write_bytes(b"weights")

    def swapped(path: Path) -> str:
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder)", str(path))

    monkeypatch.setattr(bundle_format, "sha256_of_file", swapped)
    entry = {"sha256": "0" * 64, "size": len(b"weights")}
    with pytest.raises(BundleProblem, match=r"head\.safetensors: cannot be read \(not a regular file"):
        bundle_format.check_file(tmp_path, "head.safetensors", entry)
