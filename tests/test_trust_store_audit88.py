"""A device's trust store under stops, races and damage (eighty-eighth session's audit of device and trust code).

python-tuf removes the store's root.json and links it again on every pull; a stop between the two left a store the
next pull read as untrusted and started over (the newest metadata gone, so an older repository state installed);
a second pull in that moment was told the publisher was unknown; a FIFO at root.json hung every pull.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from pathlib import Path

import pytest
from test_serve_pull import make_bundle, publish
from test_signed_pull import pull

from localpers.bundle import signed, trust
from localpers.bundle.repository import add_bundle
from localpers.errors import InputError, LocalpersError
from localpers.paths import config_dir


def test_a_store_whose_root_link_a_stop_removed_is_still_trusted_and_refuses_rollbacks(
    tmp_path: Path,
) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "a", seed="a"), repo, keys)
    pull(repo, trust=fingerprint)
    shutil.copytree(repo, tmp_path / "old-repo")  # what a replaying mirror keeps
    add_bundle(repo, make_bundle(tmp_path / "b", seed="b"), keys)
    pull(repo)
    store = trust.trust_store(fingerprint)
    (store / "root.json").unlink()  # python-tuf's os.remove done, its os.symlink not
    assert trust.trusted_fingerprints() == [fingerprint]
    with pytest.raises(LocalpersError, match="refusing a rollback"):
        pull(tmp_path / "old-repo", trust=fingerprint)
    (store / "root.json").unlink()
    pull(repo)  # no --trust asked for
    assert (store / "timestamp.json").exists() and (store / "root.json").is_symlink()


def test_the_demo_publishers_store_is_mended_not_started_over() -> None:
    demo = trust.demo_root_bytes()
    fingerprint = trust.root_fingerprint(demo, "demo")
    store = trust.trust_store(fingerprint)
    (store / "root_history").mkdir(parents=True)
    (store / "root_history" / "1.root.json").write_bytes(demo)
    (store / "timestamp.json").write_text('{"kept": "the newest timestamp seen"}')

    class ServesTheDemoRoot:
        def chunks(self, url: str) -> list[bytes]:
            return [demo]

    trust.choose_trusted_root(ServesTheDemoRoot(), "http://127.0.0.1:9/", None)  # type: ignore[arg-type]
    assert (store / "timestamp.json").read_text() == '{"kept": "the newest timestamp seen"}'
    assert (store / "root.json").read_bytes() == demo


def test_a_fifo_at_a_trusted_root_is_refused_not_waited_on(tmp_path: Path) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "a"), repo, keys)
    pull(repo, trust=fingerprint)
    root = trust.trust_store(fingerprint) / "root.json"
    root.unlink()
    os.mkfifo(root)
    outcome: list[BaseException | None] = []

    def pulling() -> None:
        try:
            pull(repo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the pull ended with is the point
            outcome.append(exc)

    worker = threading.Thread(target=pulling, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():
        with open(root, "wb"):  # let the stuck read end, so the thread does too
            pass
        pytest.fail("the pull waited on the FIFO")
    (refused,) = outcome
    assert (
        isinstance(refused, InputError)
        and "is damaged" in str(refused)
        and "not a regular file" in str(refused)
    )


def _trust_store_locked() -> bool:
    """Whether someone holds the trust store's lock now (a folder not made yet: no one can)."""
    folder = config_dir() / trust.TRUST_DIR
    if not folder.is_dir():
        return False
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)


def test_a_pull_chooses_and_updates_its_root_under_the_trust_stores_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "a"), repo, keys)
    held: list[bool] = []
    choose = signed.choose_trusted_root

    def observed(*args: object, **kwargs: object) -> object:
        held.append(_trust_store_locked())
        return choose(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(signed, "choose_trusted_root", observed)
    pull(repo, trust=fingerprint)
    assert held == [True]


def test_a_pull_waiting_for_the_trust_store_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # a second pull waited without a word while the first sat at the trust question (session review)
    folder = config_dir() / trust.TRUST_DIR
    folder.mkdir(parents=True, exist_ok=True)
    holder = os.open(folder, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    entered = threading.Event()

    def second_pull() -> None:
        with trust.trust_store_lock():
            entered.set()

    waiting = threading.Thread(target=second_pull, daemon=True)
    try:
        waiting.start()
        for _ in range(200):
            if "waiting for another `localpers pull`" in capsys.readouterr().err:
                break
            entered.wait(0.05)
        else:
            pytest.fail("nothing said while waiting")
        assert not entered.is_set()
    finally:
        os.close(holder)  # releases the lock
    waiting.join(timeout=30)
    assert entered.is_set()


def test_the_trust_question_is_asked_before_the_trust_stores_lock(tmp_path: Path) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    publish(make_bundle(tmp_path / "a"), repo, keys)
    held: list[bool] = []

    def answer(fingerprint: str) -> bool:
        held.append(_trust_store_locked())
        return True

    pull(repo, confirm_trust=answer)
    assert held == [False]
