"""Copy a bundle with adapter files (and optionally its centroids or head) replaced, for benchmarking.

For experiments only: the copy is unsigned, its manifest's hashes and sizes are updated for the replaced files,
and its training figures still describe the original. Centroids must be given with cluster adapters trained on a
different clustering, so that the device assigns users to the clusters the adapters were trained on. `--head`
takes a publisher run's finished `head` stage directory: its head file, and its configuration (alpha, base, ...)
for the manifest's `head` entry.

    python scripts/swap_adapter.py models/demo-bundle /tmp/bundle-b global /tmp/heldout/.work/export/cluster-0.gguf
    python scripts/swap_adapter.py models/demo-bundle /tmp/bundle-c --swap global=A/global.gguf \
        --swap cluster-0=C/cluster-0.gguf --swap cluster-1=C/cluster-1.gguf --swap cluster-2=C/cluster-2.gguf \
        --centroids C/.work/clusters/centroids.safetensors
    python scripts/swap_adapter.py models/demo-bundle /tmp/bundle-h --head /tmp/rehead/.work/head
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path


def _replace(target: Path, manifest: dict, relative: str, source: Path) -> None:
    shutil.copy(source, target / relative)
    data = (target / relative).read_bytes()
    manifest["files"][relative] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    print(f"{target / relative} <- {source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="bundle directory to copy")
    parser.add_argument("target", type=Path, help="new bundle directory (replaced if it exists)")
    parser.add_argument("adapter", nargs="?", help="adapter name in the manifest, e.g. global or cluster-1")
    parser.add_argument("gguf", nargs="?", type=Path, help="the LoRA GGUF to put in its place")
    parser.add_argument(
        "--swap", action="append", default=[], metavar="NAME=GGUF", help="more adapters to replace"
    )
    parser.add_argument("--centroids", type=Path, help="a centroids.safetensors to replace the bundle's")
    parser.add_argument(
        "--head", type=Path, help="a publisher run's finished head stage directory (WORK/head)"
    )
    args = parser.parse_args()
    swaps = [(args.adapter, args.gguf)] if args.adapter else []
    if args.adapter and args.gguf is None:
        raise SystemExit("give the GGUF after the adapter's name")
    for item in args.swap:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--swap {item!r}: expected NAME=GGUF")
        swaps.append((name, Path(path)))
    if not swaps and args.centroids is None and args.head is None:
        raise SystemExit("nothing to replace: give an adapter and its GGUF, --swap, --centroids or --head")
    head_config = None
    if args.head is not None:
        done = args.head / "done.json"
        if not done.is_file():
            raise SystemExit(f"{done}: no such file (run the publisher's head stage to the end first)")
        head_config = json.loads(done.read_text())["summary"]["config"]
    if args.target.resolve() == args.bundle.resolve():
        raise SystemExit("the target must differ from the bundle (it is replaced)")
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    for name, path in swaps:
        if name not in manifest["adapters"]:
            raise SystemExit(
                f"{args.bundle}/manifest.json: no adapter {name!r} (has {list(manifest['adapters'])})"
            )
        if not path.is_file():
            raise SystemExit(f"{path}: no such file")
    shutil.rmtree(args.target, ignore_errors=True)
    shutil.copytree(args.bundle, args.target, ignore=shutil.ignore_patterns(".work"))
    for name, path in swaps:
        _replace(args.target, manifest, manifest["adapters"][name], path)
    if args.centroids is not None:
        _replace(args.target, manifest, manifest["clusters"]["centroids"], args.centroids)
    if head_config is not None:
        file = manifest["head"]["file"]
        manifest["head"] = {"file": file, **head_config}
        _replace(args.target, manifest, file, args.head / file)
    (args.target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {args.target}")


if __name__ == "__main__":
    main()
