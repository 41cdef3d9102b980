"""Compare two publisher work directories stage by stage: which outputs are bit-identical, and how far apart.

For the executor-equivalence claims in docs/PUBLISHING.md (a sequential and a Ray run of the same seeded
options). Timings, timestamps and logs are skipped; arrays are compared by value (`.npz`, `.pt`,
`.safetensors`), everything else byte for byte.

    python scripts/compare_publish_work.py /tmp/scaling/seq/bundle/.work /tmp/scaling/ray-w2/bundle/.work
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

SKIP = {"done.json", "key.txt", "publish.log", "record.json", "checkpoint.pt", "precision.json"}


def arrays(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".npz":
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return load_file(str(path))
    if path.suffix == ".pt":
        import torch

        return {name: t.float().numpy() for name, t in torch.load(path, weights_only=False).items()}
    return {}


def compare(a: Path, b: Path) -> dict[str, Any]:
    if a.suffix in (".npz", ".safetensors", ".pt"):
        left, right = arrays(a), arrays(b)
        if set(left) != set(right) or any(left[k].shape != right[k].shape for k in left):
            return {"identical": False, "reason": "different arrays or shapes"}
        diff = (
            max(
                (float(np.max(np.abs(left[k].astype(np.float64) - right[k]))) if left[k].size else 0.0)
                for k in left
            )
            if left
            else 0.0
        )
        same = all(np.array_equal(left[k], right[k]) for k in left)
        return {"identical": same, "max_abs_diff": diff}
    return {"identical": a.read_bytes() == b.read_bytes()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a publisher work directory (`<bundle>/.work`)")
    parser.add_argument("second", type=Path, help="the work directory to compare it with")
    args = parser.parse_args()
    first, second = args.first, args.second
    for folder in (first, second):
        if not folder.is_dir():
            parser.error(f"{folder}: not a directory; give two publisher work directories (`<bundle>/.work`)")
    report: dict[str, dict[str, int | float]] = {}
    for path in sorted(first.rglob("*")):
        relative = path.relative_to(first)  # a folder above the work directory named "staging" is no staging
        if (
            not path.is_file()
            or path.name in SKIP
            or "staging" in relative.parts
            or path.suffix == ".partial"
        ):
            continue
        other = second / relative
        stage = relative.parts[0]
        entry = report.setdefault(stage, {"files": 0, "identical": 0, "missing": 0, "max_abs_diff": 0.0})
        entry["files"] += 1
        if not other.exists():
            entry["missing"] += 1
            continue
        result = compare(path, other)
        entry["identical"] += int(result["identical"])
        entry["max_abs_diff"] = max(entry["max_abs_diff"], result.get("max_abs_diff", 0.0))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
