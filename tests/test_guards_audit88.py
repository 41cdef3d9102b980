"""Checks the eighty-eighth session's mutation audit found no test guarding: each test here fails when the check it
names is removed from the code (the audit removed each and ran the suite, which passed)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_serve_pull import BACKBONE_SHA, make_bundle, publish
from test_signed_pull import nothing_installed, pull

from localpers.bundle import format as bundle_module
from localpers.bundle.format import open_bundle
from localpers.bundle.locations import installed_bundle_dir
from localpers.engine.decoding import Candidates
from localpers.engine.sampler_chain import TOKEN_DATA
from localpers.errors import LocalpersError
from localpers.methods.card.correction import CardCorrection, build_correction
from localpers.methods.card.token_bias import TokenBias
from localpers.paths import config_dir

REPO_ROOT = Path(__file__).resolve().parents[1]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_pulled_bundles_file_changed_after_install_is_refused_when_opened(tmp_path: Path) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    pull(repo, trust=publish(make_bundle(tmp_path / "bundle"), repo, keys))
    installed = installed_bundle_dir()
    assert installed is not None
    _flip_a_byte(installed / "adapters" / "global.gguf")  # same size: only its hash tells
    with pytest.raises(LocalpersError, match=r"adapters/global.gguf: sha256 is .* the file is damaged"):
        open_bundle(backbone_sha256=BACKBONE_SHA)


def test_the_embedded_demo_bundle_is_hash_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = tmp_path / "demo-bundle"
    shutil.copytree(REPO_ROOT / "models" / "demo-bundle", demo)
    monkeypatch.setattr(bundle_module, "embedded_bundle_dir", lambda: demo)
    _flip_a_byte(demo / "head.safetensors")
    with pytest.raises(LocalpersError, match=r"head.safetensors: sha256 is .*reinstall localpers"):
        open_bundle()


def test_a_first_root_whose_signature_does_not_verify_is_not_trusted(tmp_path: Path) -> None:
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "bundle"), repo, keys)
    first = repo / "metadata" / "1.root.json"
    document = json.loads(first.read_text())
    signature = document["signatures"][0]["sig"]
    document["signatures"][0]["sig"] = ("0" if signature[0] != "0" else "1") + signature[1:]
    first.write_text(json.dumps(document))
    with pytest.raises(LocalpersError, match="not signed by its root key"):
        pull(repo, trust=fingerprint)
    assert not (config_dir() / "trust" / fingerprint).exists() and nothing_installed()


def test_a_signed_backbone_whose_hash_is_not_its_name_is_refused(tmp_path: Path) -> None:
    from localpers.bundle.pull import pull_bundle
    from localpers.bundle.repository import add_file_target
    from localpers.bundle.repository_metadata import BACKBONE_PREFIX
    from localpers.bundle.serve import start_background_server

    named = hashlib.sha256(b"the backbone the bundle names").hexdigest()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF another file under that name")
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "bundle", backbone_sha256=named), repo, keys)
    add_file_target(repo, f"{BACKBONE_PREFIX}{named}.gguf", other, keys)  # signed with the other file's hash
    server, url = start_background_server(repo)
    try:
        with pytest.raises(LocalpersError, match="another sha256"):
            pull_bundle(url, with_backbone=True, trust=fingerprint)
    finally:
        server.close()
    assert nothing_installed()


def test_the_atomic_writer_never_replaces_a_fifo_or_a_folder(tmp_path: Path) -> None:
    from localpers.atomic import atomic_write_bytes

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in (fifo, folder):
        with pytest.raises(LocalpersError, match="is not a regular file"):
            atomic_write_bytes(path, b"x")
    assert fifo.is_fifo() and folder.is_dir()


def test_a_key_in_another_authorization_scheme_is_refused() -> None:
    from starlette.testclient import TestClient

    from localpers.api.app import create_app

    with TestClient(create_app(None, api_key="s3cret")) as client:  # type: ignore[arg-type]
        for header in ("Basic s3cret", "Token s3cret", "s3cret"):
            assert client.get("/v1/models", headers={"Authorization": header}).status_code == 401, header


def test_a_history_cache_that_cannot_be_written_is_dropped_not_left_stale(tmp_path: Path) -> None:
    from types import SimpleNamespace

    import localpers.users.history_index as history_index
    from localpers.errors import StorageError
    from localpers.users.history_index import INDEX_FILE, HistoryIndex

    item = SimpleNamespace(task="headline", input="An article.", output="A Headline")
    HistoryIndex.write(tmp_path, "history v1\n", [item])
    assert (tmp_path / INDEX_FILE).exists()

    def full_disk(path: Path, text: str, **kwargs: object) -> None:
        raise StorageError(f"cannot write {path} (No space left on device)")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(history_index, "atomic_write_text", full_disk)
        HistoryIndex.write(tmp_path, "history v2\n", [item, item])  # a cache: never an error
    assert not (tmp_path / INDEX_FILE).exists()  # not the stale one, which a reader would check and rebuild


def _candidates(ids: list[int], logits: list[float]) -> Candidates:
    entries = np.zeros(len(ids), dtype=TOKEN_DATA)
    entries["id"] = ids
    entries["logit"] = logits
    return Candidates(entries)


def test_a_closing_habit_takes_a_share_of_the_ending_through_the_correction() -> None:
    newline, habit = 5, 8
    bias = TokenBias(closing={habit: 0.4})
    correction = CardCorrection(
        None,  # type: ignore[arg-type]  # no head is needed at strength 0
        np.zeros(4),
        0.0,
        3,
        bias=bias,
        bias_strength=1.0,
        end_tokens=np.asarray([newline]),
    )
    correction.accept(11)  # not the first step: a closing habit applies from the second on
    candidates = _candidates([newline, habit, 2], [2.0, 0.0, 1.0])
    correction.apply(candidates, np.zeros(4, dtype=np.float32))
    by_id = dict(zip(candidates.ids.tolist(), candidates.logits.tolist(), strict=True))
    logits = np.array([by_id[newline], by_id[habit], by_id[2]])
    p = np.exp(logits - np.logaddexp.reduce(logits))
    before = np.exp(np.array([2.0, 0.0, 1.0]) - np.logaddexp.reduce([2.0, 0.0, 1.0]))
    assert (
        p[1] > before[1] and p[0] < before[0]
    )  # the ending's probability moved from the newline to the habit
    assert np.isclose(p[2], before[2])  # the other token keeps its share
    correction.accept(habit)  # the output now ends with the habit: it may end as the model wants
    again = _candidates([newline, habit, 2], [2.0, 0.0, 1.0])
    correction.apply(again, np.zeros(4, dtype=np.float32))
    assert dict(zip(again.ids.tolist(), again.logits.tolist(), strict=True)) == {
        newline: 2.0,
        habit: 0.0,
        2: 1.0,
    }


def test_without_a_fitted_vector_the_correction_is_the_prior_weights() -> None:
    class Head:
        def default_vector(self, cluster: int | None) -> np.ndarray:
            return np.ones(4)

    class Config:
        default_strength, top_k = 1.0, 20

    correction, _, _ = build_correction(
        Head(),  # type: ignore[arg-type]
        Config(),  # type: ignore[arg-type]
        cluster=0,
        vector=None,
        strength=None,
        top_k=None,
        bias=None,
        bias_strength=None,
    )
    from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT

    assert np.array_equal(correction.vector, DEFAULT_PRIOR_WEIGHT * np.ones(4))


@pytest.mark.parametrize("lock", ["user_lock", "fit_lock"])
def test_a_lock_taken_after_its_folder_was_renamed_away_says_the_user_is_gone(
    tmp_path: Path, lock: str
) -> None:
    # folders made before identity tokens, and every fit's lock, rest on the lock file still being the folder's
    import fcntl
    import threading

    from localpers.users import lock as lock_module

    folder = tmp_path / "ann"
    folder.mkdir()
    name = lock_module.LOCK_FILE if lock == "user_lock" else lock_module.FIT_LOCK_FILE
    holder = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)  # another command holds it
    fcntl.flock(holder, fcntl.LOCK_EX)
    outcome: list[BaseException | None] = []

    def waiting() -> None:
        try:
            with getattr(lock_module, lock)(folder, who="user 'ann'", wait_seconds=20):
                outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the lock ended with is the point
            outcome.append(exc)

    polling = threading.Event()
    sleep = lock_module.time.sleep

    def polled(seconds: float) -> None:  # the waiter opened the lock file and found it held
        polling.set()
        sleep(seconds)

    waiter = threading.Thread(target=waiting)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(lock_module.time, "sleep", polled)
        waiter.start()
        try:
            assert polling.wait(timeout=20)
            folder.rename(tmp_path / "ann-deleted")  # `user delete` moves the folder away first
            folder.mkdir()  # and a user of the same name is made anew
        finally:
            os.close(holder)
        waiter.join(timeout=30)
    (ended,) = outcome
    assert isinstance(ended, LocalpersError) and "user 'ann' no longer exists" in str(ended)
