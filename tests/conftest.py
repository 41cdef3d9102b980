"""Shared fixtures: an isolated LOCALPERS_HOME for every test, and the backbone resolved once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localpers.bundle.version_use import release_versions
from localpers.engine.backbone import Backbone, cached_sha256, default_backbone_path

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "news-headlines"


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """LOCALPERS_HOME for what runs before a test's own home: module- and session-scoped fixtures (a module's
    `Personalizer` made the real cache's bundles folder and the real config folder)."""
    home = tmp_path_factory.mktemp("session-home")
    before = os.environ.get("LOCALPERS_HOME")
    os.environ["LOCALPERS_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("LOCALPERS_HOME", None)
    else:
        os.environ["LOCALPERS_HOME"] = before


@pytest.fixture(autouse=True)
def stop_signals_as_they_were() -> Iterator[None]:
    """Put SIGINT, SIGTERM and SIGHUP back as they were after each test, and `interrupts`' settle flag: a test
    that runs the console script in-process sets the flag, and a command finishing after it may set the signals
    to be ignored, which every later child process inherits."""
    import signal

    from localpers import interrupts

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in signals}
    settle = interrupts._settle_when_done
    yield
    interrupts._settle_when_done = settle
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def localpers_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point LOCALPERS_HOME at a temp dir so no test reads or writes the real user folders."""
    home = tmp_path / "localpers-home"
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    monkeypatch.delenv("LOCALPERS_MODEL", raising=False)
    yield home
    release_versions()  # the bundle versions this test opened, whose home is thrown away


@pytest.fixture(scope="session")
def backbone() -> Backbone:
    """The embedded default backbone, assembled in the real cache so only once (nothing else of the real home is
    read or made: not the config folder `resolve_backbone` would read)."""
    isolated = os.environ.pop("LOCALPERS_HOME", None)
    try:
        path = default_backbone_path()
        return Backbone(path=path, sha256=cached_sha256(path), source="default")
    finally:
        if isolated is not None:
            os.environ["LOCALPERS_HOME"] = isolated


# Property-based tests (tests/test_fuzz.py): a fast profile for CI, a long one for local runs
# (HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py --hypothesis-show-statistics).
try:
    from hypothesis import HealthCheck, settings

    _FUZZ_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
    # derandomized: the same examples every run, so a rare input that breaks a parser shows up in a long run or
    # in the commit that made it, never by chance in an unrelated one's CI
    settings.register_profile(
        "ci",
        max_examples=40,
        deadline=None,
        suppress_health_check=_FUZZ_HEALTH,
        derandomize=True,
        database=None,
    )
    settings.register_profile("long", max_examples=1500, deadline=None, suppress_health_check=_FUZZ_HEALTH)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is in the test extra; without it only tests/test_fuzz.py is skipped
    pass


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray (2 CPUs) for the whole test session, shut down at its end; skips without ray. Started as the
    executor starts its own (a private token in the environment), so no `~/.ray/auth_token` lands in the HOME the
    tests run under."""
    ray = pytest.importorskip("ray")
    from localpers.publish.ray_executor import RayExecutor

    executor = None if ray.is_initialized() else RayExecutor(workers=2)
    yield ray
    if executor is not None:
        executor.close()
