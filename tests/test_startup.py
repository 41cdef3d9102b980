"""What a command that runs no model loads: help, completion and the user commands start without llama.cpp.

`localpers --help`, a completion TAB and `localpers user list` took ~0.4 s where Typer's own floor is ~0.15 s
(docs/PERFORMANCE.md, seventy-fourth session): every command module loaded llama_cpp (with jinja2) and numpy
at start, because the engine package loaded llama.cpp on import and the method registry imported every method.
These run each command in a fresh interpreter and list what it loaded. The registry now names its methods
without loading them, so its lines must say what the classes say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localpers.engine.threads import LLAMA_CPP_PIN

HEAVY = ("numpy", "llama_cpp", "jinja2", "torch", "sklearn", "safetensors", "textual")

RUN_AND_LIST = """
import json, sys
from localpers.cli.main import app
try:
    app(sys.argv[1:], prog_name="localpers")
except SystemExit:
    pass
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""


def _loaded_by(args: list[str], home: Path, **environment: str) -> list[str]:
    env = {**os.environ, "LOCALPERS_HOME": str(home), **environment}
    env.pop("LOCALPERS_MODEL", None)
    result = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST.format(heavy=HEAVY), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["rewrite", "--help"],
        ["fit", "--help"],
        ["publish", "--help"],
        ["user", "list"],
        ["user", "create", "ann"],
        ["user", "show", "ann"],
        ["history", "list", "--user", "ann"],
        ["--version"],
    ],
)
def test_commands_that_run_no_model_load_neither_llama_cpp_nor_numpy(args: list[str], tmp_path: Path) -> None:
    if args[-1] == "ann" and args[0] != "user" or args[:2] == ["user", "show"]:
        _loaded_by(["user", "create", "ann"], tmp_path)
    assert _loaded_by(args, tmp_path) == []


def test_a_completion_tab_loads_neither(tmp_path: Path) -> None:
    _loaded_by(["user", "create", "ann"], tmp_path)
    loaded = _loaded_by(
        [],
        tmp_path,
        _LOCALPERS_COMPLETE="complete_bash",
        COMP_WORDS="localpers rewrite --user ",
        COMP_CWORD="3",
    )
    assert loaded == []


def test_a_command_that_needs_the_model_still_loads_llama_cpp_under_the_wait_policy() -> None:
    """The engine loads llama.cpp on first use, and through `engine.llama` only (test_threads checks the
    policy libgomp reads)."""
    probe = (
        "import sys\n"
        "from localpers.engine import Engine\n"
        "print('llama_cpp' in sys.modules, 'localpers.engine.llama' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == ["True", "True"]


def test_the_registry_says_what_each_method_class_says() -> None:
    from localpers.methods.registry import LISTED, get_method

    for name, entry in LISTED.items():
        method = get_method(name)
        assert method.name == name
        assert (entry.summary, entry.fits, entry.takes_strength, entry.takes_top_k) == (
            method.summary,
            method.fits,
            method.takes_strength,
            method.takes_top_k,
        ), name
        assert get_method(name) is method  # loaded once: a server keeps one instance per method


@pytest.mark.parametrize(
    "raised", ["ImportError", "OSError", "RuntimeError"]
)  # RuntimeError: a library llama_cpp
def test_a_llama_cpp_python_that_cannot_load_stops_only_the_model_commands_and_says_how_to_mend_it(  # cannot load
    tmp_path: Path, raised: str
) -> None:
    """Every command, `user list` and `doctor` included, ended in an ImportError traceback when llama-cpp-python
    could not be loaded (a missing library, a build for another CPU). Now the light commands work, a model command
    says in one line how to reinstall it, and doctor names it as a problem (exit 1)."""
    broken = tmp_path / "broken" / "llama_cpp"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(f'raise {raised}("libllama.so: cannot open shared object file")\n')
    env = {**os.environ, "LOCALPERS_HOME": str(tmp_path / "home"), "PYTHONPATH": str(broken.parent)}
    env.pop("LOCALPERS_MODEL", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "localpers.cli", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    assert run("user", "create", "ann").returncode == 0 and run("user", "list").returncode == 0
    rewrite = run("rewrite", "An article about the weather.", "--user", "ann")
    assert rewrite.returncode == 1 and "Traceback" not in rewrite.stderr
    assert rewrite.stderr.strip().splitlines() == [
        "error: llama-cpp-python cannot be loaded (libllama.so: cannot open shared object file); reinstall it"
        f" with `pip install --force-reinstall --no-cache-dir {LLAMA_CPP_PIN}` (it builds llama.cpp for this"
        " machine), then run `localpers doctor`"
    ]
    doctor = run("doctor", "--json")
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr[-2000:]
    report = json.loads(doctor.stdout)
    assert report["llama_cpp_python"] is None and report["problems"][0].startswith("llama-cpp-python cannot")


def test_the_reinstall_advice_names_the_pinned_version() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text("utf-8"))
    assert LLAMA_CPP_PIN in pyproject["project"]["dependencies"]
