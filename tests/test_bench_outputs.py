"""A bench run's top-level outputs are one set: staged, then moved into place with results.json last, the
earlier run's figures this run does not make removed, each PNG written atomically; Ctrl-C says what --out
holds. The run itself is replaced by a fixed results object: no model is loaded."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_bench_targets import _results
from typer.testing import CliRunner

import localpers.bench
from localpers.bench import BenchConfig, run_and_write
from localpers.bench.plots import write_plots
from localpers.cli import app
from localpers.errors import StorageError

OLD = "from the earlier run\n"
EARLIER = ("results.json", "outputs.jsonl", "report.md", "bars.png", "authors.png", "siblings.png")


def _results_with_intervals() -> dict[str, Any]:
    results = _results()
    for row in results["methods"].values():
        row["rouge1_ci"] = [row["rouge1"] - 0.01, row["rouge1"], row["rouge1"] + 0.01]
    return results


@pytest.fixture
def fake_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """run_and_write without a model: run_bench and build_results give a fixed results object."""
    results = _results_with_intervals()
    monkeypatch.setattr(localpers.bench, "run_bench", lambda config, **_: SimpleNamespace(config=config))
    monkeypatch.setattr("localpers.bench.results.build_results", lambda run: results)
    monkeypatch.setattr(
        "localpers.bench.results.write_outputs", lambda run, path: path.write_text('{"text": "new"}\n')
    )
    return results


def _earlier_run(out: Path) -> None:
    (out / "cache").mkdir(parents=True)
    for name in EARLIER:
        (out / name).write_text(OLD)


def test_a_run_replaces_the_earlier_set_and_removes_figures_it_does_not_make(
    fake_run: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _earlier_run(out)
    written = run_and_write(BenchConfig(data=tmp_path / "d.jsonl", out=out))
    assert json.loads((out / "results.json").read_text())["methods"].keys() == fake_run["methods"].keys()
    assert (out / "report.md").read_text() != OLD and (out / "outputs.jsonl").read_text() != OLD
    assert (out / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written.plots == [out / "bars.png"]
    assert not (out / "authors.png").exists() and not (out / "siblings.png").exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "bars.png",
        "cache",
        "outputs.jsonl",
        "report.md",
        "results.json",
    ]


@pytest.mark.parametrize("interrupted_at", range(1, 5))  # 4 files move into --out
def test_ctrl_c_while_the_outputs_move_never_leaves_results_beside_another_runs_files(
    fake_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupted_at: int
) -> None:
    out = tmp_path / "out"
    _earlier_run(out)
    real_replace, moves = os.replace, []

    def replace(source: Any, target: Any) -> None:
        if Path(target).parent == out:  # a move into --out (the staged files' own writes are not counted)
            moves.append(target)
            if len(moves) == interrupted_at:
                raise KeyboardInterrupt
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        run_and_write(BenchConfig(data=tmp_path / "d.jsonl", out=out))
    names = {p.name for p in out.iterdir()} - {"cache"}
    old = {name for name in names if (out / name).read_bytes() == OLD.encode()}
    if "results.json" in names:
        assert old in (set(), names), f"results.json beside files of another run: {sorted(old)} old"
        if not old:
            assert not {"authors.png", "siblings.png"} & names
    assert not (out / ".staging").exists()


@pytest.mark.parametrize(
    ("with_results", "said"), [(True, "are all from one run"), (False, "holds no results.json")]
)
def test_the_interrupt_message_says_what_out_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_results: bool, said: str
) -> None:
    def interrupted(*_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(localpers.bench, "run_and_write", interrupted)
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)
    if with_results:
        (out / "results.json").write_text("{}\n")
    result = CliRunner().invoke(app, ["bench", "--data", str(data), "--out", str(out), "-m", "global"])
    assert result.exit_code == 130
    assert "the users finished so far are kept in" in result.output and said in result.output


def test_a_plot_that_cannot_be_written_leaves_no_empty_png_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match=r"cannot write .*bars\.png \(No space left on device\)"):
        write_plots(_results_with_intervals(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_author_id_that_reads_as_math_is_plotted_as_written(tmp_path: Path) -> None:
    """A user id "$\\foo{$" was parsed as a formula and crashed plotting after the whole run (audit85)."""
    from localpers.bench.plots import plot_authors

    users = {
        author: {"rouge1": {"global": 0.1, "card": gain}}
        for author, gain in (("$\\foo{$", 0.05), ("u2", -0.02))
    }
    written = plot_authors({"users": users, "methods": {"global": {}, "card": {}}}, tmp_path / "authors.png")
    assert written is not None and written.stat().st_size > 0


def test_plotting_keeps_matplotlibs_files_under_localpers_home(tmp_path: Path) -> None:
    """matplotlib wrote its font list and config folder under the home folder (`~/.cache/matplotlib`,
    `~/.config/matplotlib`), outside LOCALPERS_HOME, which promises to keep every file of localpers under it.
    Run in a process of its own: matplotlib reads where to keep them once, when it is first imported."""
    import subprocess
    import sys

    home, localpers_home = tmp_path / "home", tmp_path / "lp"
    home.mkdir()
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
    }
    environment.update(HOME=str(home), LOCALPERS_HOME=str(localpers_home))
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_bench_outputs import _results_with_intervals\n"
        "from localpers.bench.plots import write_plots\n"
        "assert write_plots(_results_with_intervals(), Path(sys.argv[1]))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "plots")], env=environment, check=True, timeout=300
    )
    assert (tmp_path / "plots" / "bars.png").is_file()
    assert list(home.rglob("*")) == []
    assert (localpers_home / "cache" / "matplotlib").is_dir()
