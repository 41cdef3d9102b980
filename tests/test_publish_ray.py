"""The publisher's executors: Ray tasks give what the sequential run gives, survive a killed worker, and stay
out of the device install; plus MiniBatchKMeans for many users.

Ray tests share one local Ray (2 CPUs) for the session (`ray_session` in conftest.py) and skip without
the ray package. The pairs/features equivalence on real stages is in tests/test_publish.py (it reuses
that module's published work directory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from localpers.errors import LocalpersError
from localpers.publish.executor import GIB, Resources, SequentialExecutor, Task, shards

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_corpus import write_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _squarer():  # noqa: ANN202
    """A function Ray pickles by value (the tests folder is not importable in Ray's workers)."""

    def square(value: int) -> int:
        return value * value

    return square


_square = _squarer()


def test_sequential_executor_runs_in_order_and_reports_each() -> None:
    seen: list[tuple[int, int]] = []
    results = SequentialExecutor().map(
        [Task(_square, (i,)) for i in range(4)], Resources(), on_done=lambda i, r: seen.append((i, r))
    )
    assert results == [0, 1, 4, 9] and seen == [(0, 0), (1, 1), (2, 4), (3, 9)]
    assert shards(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


def test_ray_returns_results_in_task_order(ray_session) -> None:
    from localpers.publish.ray_executor import RayExecutor

    executor = RayExecutor()
    assert executor.info.kind == "ray" and executor.info.workers == 2
    results = executor.map([Task(_square, (i,), f"square {i}") for i in range(6)], Resources(memory=GIB // 4))
    assert results == [i * i for i in range(6)]
    executor.close()
    assert ray_session.is_initialized()  # a Ray started elsewhere is left running


def test_a_worker_killed_mid_task_is_retried_and_the_run_completes(ray_session, tmp_path: Path) -> None:
    """Task 1 records its worker's pid and hangs; the test SIGKILLs that process; Ray re-runs the task."""
    from localpers.publish.ray_executor import RayExecutor

    attempts = tmp_path / "attempts"

    def task(value: int) -> int:
        if value == 1:
            with attempts.open("a") as handle:
                handle.write(f"{os.getpid()}\n")
            if len(attempts.read_text().split()) == 1:
                time.sleep(120)  # the first attempt never finishes by itself
        return value * 10

    def kill_first_attempt() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if attempts.exists() and attempts.read_text().split():
                os.kill(int(attempts.read_text().split()[0]), signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_attempt)
    killer.start()
    started = time.monotonic()
    results = RayExecutor(retries=2).map([Task(task, (i,)) for i in range(3)], Resources(memory=GIB // 4))
    killer.join()
    assert results == [0, 10, 20]
    pids = attempts.read_text().split()
    assert len(pids) == 2 and pids[0] != pids[1]  # the retry ran in a new worker process
    assert time.monotonic() - started < 60


def test_a_task_error_comes_back_as_its_one_line_error(ray_session) -> None:
    from localpers.publish.ray_executor import RayExecutor

    def fail(_: int) -> None:
        raise LocalpersError("corpus x.jsonl:3: bad line")

    with pytest.raises(LocalpersError, match=r"^corpus x.jsonl:3: bad line$"):
        RayExecutor().map([Task(fail, (0,))], Resources(memory=GIB // 4))


def test_a_task_no_node_can_run_is_refused(ray_session) -> None:
    from localpers.publish.ray_executor import RayExecutor

    with pytest.raises(LocalpersError, match="no Ray node has 64 CPU"):
        RayExecutor().map([Task(_square, (1,))], Resources(cpus=64))
    with pytest.raises(LocalpersError, match="has 0 GPU"):
        RayExecutor().gpus_per_task(1.0)
    assert RayExecutor().gpus_per_task(None) == 0.0


def test_clusters_stage_is_the_same_under_ray_and_sequential(ray_session, tmp_path: Path) -> None:
    from localpers.publish.options import PublishOptions
    from localpers.publish.pipeline import publish

    corpus = write_corpus(tmp_path / "corpus.jsonl", n_users=8)
    outputs = {}
    for executor in ("sequential", "ray"):
        options = PublishOptions(
            corpus=corpus, out=tmp_path / executor, k=2, executor=executor, shard_users=3
        )
        result = publish(options, until="clusters")
        assert result["executor"]["kind"] == executor
        directory = options.work_dir / "clusters"
        outputs[executor] = {
            name: (directory / name).read_bytes()
            for name in ("assignment.json", "centroids.safetensors", "users.npz")
        }
    assert outputs["ray"] == outputs["sequential"]


def test_minibatch_kmeans_above_the_threshold_has_the_same_interface() -> None:
    from localpers.publish.clusters import choose_k, kmeans

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16))
    points = np.concatenate([c + 0.05 * rng.normal(size=(40, 16)) for c in centres])
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    exact_labels, exact_centroids = kmeans(points, 3, seed=0)
    labels, centroids = kmeans(points, 3, seed=0, minibatch_above=50)
    assert labels.shape == exact_labels.shape and centroids.shape == exact_centroids.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, rtol=1e-5)
    # the same partition up to the clusters' numbering
    assert len({(a, b) for a, b in zip(labels.tolist(), exact_labels.tolist(), strict=True)}) == 3
    best, scores = choose_k(points, (2, 4), seed=0, minibatch_above=50)
    assert best == 3 and set(scores) == {2, 3, 4}


@pytest.fixture
def fake_ray_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a fake Ray: the settings a real one would re-read stay as they are (this process may hold the test
    session's Ray), and the token variables the executor sets are undone after the test."""
    from localpers.publish import ray_executor

    monkeypatch.setattr(ray_executor, "_reread_ray_settings", lambda: None)
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.setenv(name, "")  # recorded, so what the executor sets is undone
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("fake_ray_settings")
def test_a_local_ray_is_started_with_its_usage_statistics_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray reports usage to usage-stats.ray.io after a minute unless RAY_USAGE_STATS_ENABLED=0 (publisher audit,
    eightieth session); a value the publisher set is kept."""
    import types

    from localpers.publish import ray_executor

    started: list[dict[str, object]] = []
    fake = types.SimpleNamespace(
        is_initialized=lambda: False,
        init=lambda **kwargs: started.append({**kwargs, "usage": os.environ.get("RAY_USAGE_STATS_ENABLED")}),
        cluster_resources=lambda: {"CPU": 2.0},
        nodes=lambda: [{"Alive": True}],
    )
    monkeypatch.setattr(ray_executor, "_import_ray", lambda: fake)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "")  # recorded, so the value the executor sets is undone
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED")
    ray_executor.RayExecutor(workers=2)
    assert started[-1]["usage"] == "0" and started[-1]["include_dashboard"] is False
    assert started[-1]["address"] == "local"  # a Ray of its own, never one RAY_ADDRESS or `ray start` left
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    ray_executor.RayExecutor(workers=2)
    assert started[-1]["usage"] == "1"


def test_ray_stays_out_of_the_device_install() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert not any(
        dep.split("=")[0].split(">")[0].strip() == "ray" for dep in config["project"]["dependencies"]
    )
    assert "ray==2.60.0" in config["project"]["optional-dependencies"]["publish"]
    code = (
        "import sys, localpers, localpers.cli, localpers.publish.pipeline, localpers.publish.executor\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_unreachable_ray_address_is_a_one_line_error(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    corpus = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "b"
    code = "from localpers.cli import app; app()"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "publish",
            str(corpus),
            "--out",
            str(out),
            "--k",
            "2",
            "--ray-address",
            "127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "could not start or reach the Ray cluster at 127.0.0.1:9" in last
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 50


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gpus_per_task": 1.0}, "--gpus-per-task 1.0 but the Ray cluster has 0 GPU"),
        ({"threads": 64}, "64 CPU"),
    ],
)
def test_a_task_the_ray_cluster_cannot_run_is_refused_before_the_first_stage(
    ray_session, tmp_path: Path, changes: dict[str, float], message: str
) -> None:
    from localpers.publish.options import PublishOptions
    from localpers.publish.pipeline import publish

    corpus = write_corpus(tmp_path / "corpus.jsonl", n_users=8)
    options = PublishOptions(corpus=corpus, out=tmp_path / "out", k=2, executor="ray", **changes)
    with pytest.raises(LocalpersError, match=message):
        publish(options)
    assert not (options.work_dir / "clusters").exists()  # found before, not after, the clusters stage


def _fake_ray(started: list[dict[str, object]]) -> object:
    import types

    def init(**kwargs: object) -> None:
        started.append({name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})

    return types.SimpleNamespace(
        is_initialized=lambda: bool(started),
        init=init,
        shutdown=lambda: None,
        cluster_resources=lambda: {"CPU": 2.0},
        nodes=lambda: [{"Alive": True}],
    )


@pytest.mark.usefixtures("fake_ray_settings")
def test_a_local_ray_gets_a_token_of_its_own_and_none_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray wrote its token to ~/.ray/auth_token readable by every account, and its processes listen on every
    interface: whoever read the file ran code as the publisher (eighty-seventh session's publish audit)."""
    from localpers.publish import ray_executor

    started: list[dict[str, object]] = []
    monkeypatch.setattr(ray_executor, "_import_ray", lambda: _fake_ray(started))
    executor = ray_executor.RayExecutor(workers=2)
    token = started[-1]["RAY_AUTH_TOKEN"]
    assert started[-1]["RAY_AUTH_MODE"] == "token" and isinstance(token, str) and len(token) == 64
    executor.close()
    assert "RAY_AUTH_TOKEN" not in os.environ and "RAY_AUTH_MODE" not in os.environ

    started.clear()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the publisher's own")
    ray_executor.RayExecutor(workers=2).close()
    assert started[-1] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "the publisher's own"}

    started.clear()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(LocalpersError, match="RAY_AUTH_MODE=disabled: a local Ray without token"):
        ray_executor.RayExecutor(workers=2)
    assert not started


@pytest.mark.slow
def test_a_local_ray_leaves_no_token_file_for_other_accounts(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    code = (
        "from localpers.publish.ray_executor import RayExecutor\n"
        "executor = RayExecutor(workers=1)\n"
        "executor.close()\n"
    )
    environment = {name: value for name, value in os.environ.items() if not name.startswith("RAY_AUTH")} | {
        "HOME": str(tmp_path),
        "LOCALPERS_HOME": str(tmp_path / "lp"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    subprocess.run(
        [sys.executable, "-c", code], env=environment, check=True, timeout=300, capture_output=True
    )
    assert not (tmp_path / ".ray" / "auth_token").exists()
