"""`scripts/compare_publish_work.py` on two hand-made work directories, and the bundle stage's file list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localpers.publish.bundle_stage import bundle_files

SCRIPT = Path(__file__).parent.parent / "scripts" / "compare_publish_work.py"


def write_files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_work_directories_under_a_folder_named_staging_are_compared(tmp_path: Path) -> None:
    """The staged bundle was skipped by `"staging" in path.parts` on the absolute path: under a folder named
    staging every file was, and the report was empty (audit89 L3)."""
    works = [tmp_path / "staging" / name / ".work" for name in ("seq", "ray")]
    for work, pairs in zip(works, ("same", "same"), strict=True):
        write_files(work, {"pairs/u1.json": pairs, "bundle/staging/manifest.json": str(work)})
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, works)], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == {
        "pairs": {"files": 1, "identical": 1, "missing": 0, "max_abs_diff": 0.0}
    }


def test_the_bundle_summary_lists_outs_files_less_the_actual_work_folder(tmp_path: Path) -> None:
    """`".work" not in p.parts` on absolute paths listed no file for an OUT under a folder named .work, and
    counted a --work inside OUT under another name as bundle files (audit89 L3)."""
    out = tmp_path / "x.work" / ".work" / "bundle"
    bundle = {"manifest.json": "{}", "adapters/global.gguf": "gguf"}
    write_files(out, {**bundle, ".work/sft/checkpoint.pt": "pt"})
    assert bundle_files(out, out / ".work") == ["adapters/global.gguf", "manifest.json"]
    other = tmp_path / "out2"
    write_files(other, {**bundle, "scratch/sft/checkpoint.pt": "pt"})
    assert bundle_files(other, other / "scratch") == ["adapters/global.gguf", "manifest.json"]
    assert bundle_files(other, tmp_path / "elsewhere") == [
        "adapters/global.gguf",
        "manifest.json",
        "scratch/sft/checkpoint.pt",
    ]
