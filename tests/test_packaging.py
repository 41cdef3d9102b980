"""What a new user or a packager meets (the seventy-third session's packaging audit).

Before: `fit --method cope` without the publish extra ended in a 48-line traceback (torch was imported before the
extra was checked); every install hint said `pip install 'localpers[publish]'`, which no registry serves;
`python -m localpers` did not exist; there was no licence file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localpers import __version__
from localpers.errors import PUBLISH_EXTRA_HINT

ROOT = Path(__file__).resolve().parents[1]


def test_cope_training_without_torch_names_what_to_install() -> None:
    # in a child process: torch made unimportable would leave transformers and peft half-imported for later tests
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # `import torch` raises ImportError, as where it is absent\n"
        "from pathlib import Path\n"
        "from localpers.errors import LocalpersError\n"
        "from localpers.methods import cope_train\n"
        "try:\n"
        "    cope_train.train_user_lora(Path('backbone.gguf'), [object()], None)\n"
        "except LocalpersError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "needs the publish extra" in result.stdout and result.stdout.strip().endswith(PUBLISH_EXTRA_HINT)
    assert "localpers[publish]" not in PUBLISH_EXTRA_HINT and "torch==2.13.0" in PUBLISH_EXTRA_HINT


def test_python_dash_m_localpers_is_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "localpers", "--version"], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (0, f"localpers {__version__}\n"), result.stderr


def test_the_licence_pyproject_declares_is_there() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    )


DEVICE_RUN = """
import sys
for name in ("torch", "transformers", "peft", "sklearn", "ray"):  # the publish extra, as if not installed
    sys.modules[name] = None
sys.argv = ["localpers", *sys.argv[1:]]
from localpers.cli.entry import main
main()
"""


@pytest.mark.parametrize(
    "args",
    [
        ["rewrite", "-m", "global", "The city council approved a new budget for parks.", "--max-tokens", "4"],
        ["user", "list"],
        ["bundle", "verify"],
    ],
)
def test_device_commands_run_without_the_publishers_libraries(args: list[str], tmp_path: Path) -> None:
    import os

    env = {**os.environ, "LOCALPERS_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-c", DEVICE_RUN, *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
