"""Copy a bundle with one adapter file replaced (manifest hash and size updated), for benchmarking a trained adapter.

For experiments only: the copy is unsigned and its manifest's training figures still describe the original.

    python scripts/swap_adapter.py models/demo-bundle /tmp/bundle-b global /tmp/heldout/.work/export/cluster-0.gguf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="bundle directory to copy")
    parser.add_argument("target", type=Path, help="new bundle directory (replaced if it exists)")
    parser.add_argument("adapter", help="adapter name in the manifest, e.g. global or cluster-1")
    parser.add_argument("gguf", type=Path, help="the LoRA GGUF to put in its place")
    args = parser.parse_args()
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    if args.adapter not in manifest["adapters"]:
        raise SystemExit(
            f"{args.bundle}/manifest.json: no adapter {args.adapter!r} (has {list(manifest['adapters'])})"
        )
    shutil.rmtree(args.target, ignore_errors=True)
    shutil.copytree(args.bundle, args.target, ignore=shutil.ignore_patterns(".work"))
    relative = manifest["adapters"][args.adapter]
    shutil.copy(args.gguf, args.target / relative)
    data = (args.target / relative).read_bytes()
    manifest["files"][relative] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (args.target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {args.target} with {relative} from {args.gguf}")


if __name__ == "__main__":
    main()
