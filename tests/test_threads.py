"""llama.cpp's threads: how many (LOCALPERS_THREADS), and OpenMP's wait policy (spin briefly, then sleep).

The policy is checked in fresh interpreters against what libgomp itself read when it loaded (`omp_display_env`), since
setting the variable after llama.cpp is loaded would change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.engine.threads import DEFAULT_SPIN_COUNT, choose_wait_policy, default_threads
from localpers.errors import LocalpersError

runner = CliRunner()

PROBE = (
    "import ctypes, os, sys, localpers.engine.vocabulary\n"  # any module that calls llama.cpp loads it via engine.llama
    "print('environment:', os.environ.get('GOMP_SPINCOUNT'))\n"
    "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''\n"
    "if 'libgomp' not in maps:\n"
    "    print('no libgomp'); sys.exit(0)\n"
    "ctypes.CDLL('libgomp.so.1').omp_display_env(1)\n"
)


def _libgomp_settings(**variables: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(variables)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    if "no libgomp" in result.stdout:
        pytest.skip("no libgomp in this process: llama.cpp built without OpenMP, or not Linux")
    return result.stdout + result.stderr


def test_waiting_threads_spin_briefly_by_default_and_the_environment_is_left_as_it_was() -> None:
    settings = _libgomp_settings()
    assert f"GOMP_SPINCOUNT = '{DEFAULT_SPIN_COUNT}'" in settings, settings
    assert "environment: None" in settings  # torch's OpenMP and child processes see the user's environment


@pytest.mark.parametrize("trainer", ["localpers.engine.torch_model", "localpers.publish.head_training"])
def test_the_policy_holds_where_torch_is_imported_too(trainer: str) -> None:
    """torch ships its own libgomp.so.1 and whichever loads first serves both: since the engine package stopped
    loading llama.cpp on import, a module that imports torch must load llama.cpp first itself."""
    pytest.importorskip("torch")
    probe = f"import ctypes, os, sys, {trainer}, torch\n" + PROBE.split("\n", 1)[1]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    if "no libgomp" in result.stdout:
        pytest.skip("no libgomp in this process")
    assert f"GOMP_SPINCOUNT = '{DEFAULT_SPIN_COUNT}'" in result.stdout + result.stderr


def test_the_users_own_policy_wins() -> None:
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in _libgomp_settings(OMP_WAIT_POLICY="ACTIVE")
    assert "GOMP_SPINCOUNT = '0'" in _libgomp_settings(OMP_WAIT_POLICY="PASSIVE")
    assert "GOMP_SPINCOUNT = '10000'" in _libgomp_settings(GOMP_SPINCOUNT="10000")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, {"GOMP_SPINCOUNT": DEFAULT_SPIN_COUNT}),
        ({"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "active"}),
        ({"GOMP_SPINCOUNT": "1000"}, {"GOMP_SPINCOUNT": "1000"}),
        ({"OMP_WAIT_POLICY": ""}, {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": DEFAULT_SPIN_COUNT}),
    ],
)
def test_choose_wait_policy_keeps_a_choice_and_fills_none(
    before: dict[str, str], after: dict[str, str]
) -> None:
    environ = dict(before)
    choose_wait_policy(environ)
    assert environ == after


@pytest.mark.parametrize("value", ["3", " 3 "])
def test_localpers_threads_sets_the_default(value: str) -> None:
    assert default_threads({"LOCALPERS_THREADS": value}) == 3


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this system")
def test_without_localpers_threads_every_cpu_this_process_may_use() -> None:
    assert default_threads({}) == len(os.sched_getaffinity(0))
    assert default_threads({"LOCALPERS_THREADS": ""}) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5", "513", "٣"])
def test_a_bad_localpers_threads_is_a_one_line_error_naming_it(value: str) -> None:
    with pytest.raises(LocalpersError, match=r"^LOCALPERS_THREADS=.* a whole number from 1 to 512"):
        default_threads({"LOCALPERS_THREADS": value})


def test_doctor_and_the_engine_use_localpers_threads(backbone: Backbone) -> None:
    result = runner.invoke(
        app, ["doctor", "--json", "--model", str(backbone.path)], env={"LOCALPERS_THREADS": "1"}
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["threads"] == 1
    result = runner.invoke(app, ["doctor", "--model", str(backbone.path)], env={"LOCALPERS_THREADS": "lots"})
    assert result.exit_code == 1
    assert "LOCALPERS_THREADS='lots'" in result.output and "Traceback" not in result.output
    # the setting is the problem, not the backbone, which still loads for the rest of the report (device audit)
    refused = runner.invoke(
        app, ["doctor", "--json", "--model", str(backbone.path)], env={"LOCALPERS_THREADS": "lots"}
    )
    report = json.loads(refused.stdout)
    assert refused.exit_code == 1 and report["threads"] is None and report["cpu_buffers"] is not None
    assert [problem for problem in report["problems"] if "THREADS" in problem] == [
        problem for problem in report["problems"] if problem.startswith("LOCALPERS_THREADS='lots'")
    ]
    assert not any("did not load" in problem for problem in report["problems"]), report["problems"]


@pytest.mark.parametrize(
    ("variable", "value"), [("LOCALPERS_THREADS", "lots"), ("LOCALPERS_CPU_BUFFERS", "fast")]
)
def test_a_bad_environment_variable_is_a_usage_error_as_a_bad_model_path_is(
    backbone: Backbone, variable: str, value: str
) -> None:
    """Exit 1 for these, 2 for LOCALPERS_MODEL: a script could not tell a usage error from a failure."""
    result = runner.invoke(app, ["generate", "x", "--model", str(backbone.path)], env={variable: value})
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {variable}=") and result.stderr.count("\n") == 1
