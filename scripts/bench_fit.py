"""Fit benchmark: fresh CARD fits (y- generation, pair features, per-user choice) of several authors' items.

Each author of --data (shared-data format, the first --authors lines) becomes a fresh user in a temporary
home holding their --items most recent history items, and is fitted once per repeat with nothing cached (no
y-, no pair features): the cost of `localpers fit` on a new user, without the model load. Prints each fit's
seconds and stages, the tokens every `llama_decode` evaluated (by batch size), and the median. To compare
two versions of the code, run it under each in turn (`PYTHONPATH=<other checkout> python
scripts/bench_fit.py ...`), alternating, on a quiet machine.

Usage: python scripts/bench_fit.py --data ../shared/data/news-headlines/test.jsonl [--authors 3] [--items 20]
       [--repeats 1] [--bundle DIR] [--flash-attn auto|on|off] [--json]

`--flash-attn` overrides llama.cpp's flash-attention setting for this run (the engine leaves it at auto;
PERFORMANCE.md, thirty-third session).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from localpers.bench.data import load_bench_users
from localpers.engine.llama import llama_cpp  # under the product's OpenMP wait policy
from localpers.methods.card.personalizer import Personalizer
from localpers.users.store import UserStore


class DecodeCounter:
    """Counts what every `llama_decode` evaluates (tokens and seconds, by batch size) while it is installed."""

    KINDS = ("batches of more than 8 tokens", "batches of 2-8 tokens", "single tokens")

    def __init__(self) -> None:
        self.calls = dict.fromkeys(self.KINDS, 0)
        self.tokens = dict.fromkeys(self.KINDS, 0)
        self.seconds = dict.fromkeys(self.KINDS, 0.0)
        # rows marked as outputs (logits, or features at every row)
        self.outputs = dict.fromkeys(self.KINDS, 0)
        self._original = llama_cpp.llama_decode

    def __enter__(self) -> DecodeCounter:
        def counted(ctx: object, batch: object) -> int:
            started = time.perf_counter()
            result = self._original(ctx, batch)
            n = int(batch.n_tokens)
            kind = self.KINDS[0] if n > 8 else self.KINDS[1] if n > 1 else self.KINDS[2]
            self.calls[kind] += 1
            self.tokens[kind] += n
            self.outputs[kind] += sum(1 for i in range(n) if batch.logits[i])
            self.seconds[kind] += time.perf_counter() - started
            return result

        llama_cpp.llama_decode = counted  # the engine calls it through the module, so this sees every call
        return self

    def __exit__(self, *exc: object) -> None:
        llama_cpp.llama_decode = self._original

    def to_json(self) -> dict[str, dict[str, float]]:
        return {
            kind: {
                "calls": self.calls[kind],
                "tokens": self.tokens[kind],
                "outputs": self.outputs[kind],
                "seconds": round(self.seconds[kind], 3),
            }
            for kind in self.KINDS
        }


FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama.cpp's llama_flash_attn_type values


def force_flash_attn(setting: str) -> None:
    """Make every context this process creates use `setting` (the engine reads llama.cpp's defaults first)."""
    original = llama_cpp.llama_context_default_params

    def with_setting() -> object:
        params = original()
        params.flash_attn_type = FLASH_ATTN[setting]
        return params

    llama_cpp.llama_context_default_params = with_setting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="shared-data JSONL (one author per line)")
    parser.add_argument("--authors", type=int, default=3)
    parser.add_argument("--items", type=int, default=20, help="most recent history items per author")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--bundle", default=None, help="bundle directory (default: pulled, else demo bundle)")
    parser.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.flash_attn is not None:
        force_flash_attn(args.flash_attn)

    histories = [user.history[-args.items :] for user in load_bench_users(args.data, max_users=args.authors)]
    fits = []
    with tempfile.TemporaryDirectory() as home:
        store = UserStore(Path(home))
        for repeat in range(args.repeats):
            # a fresh engine per repeat: no pair features or prompt state carried over from the last one
            personalizer = Personalizer.open(bundle=args.bundle)
            for author, history in enumerate(histories):
                user = store.create(f"a{author}r{repeat}")
                user.save_history(history)
                with DecodeCounter() as decodes:
                    started = time.perf_counter()
                    report = personalizer.fit_user(user)
                    seconds = time.perf_counter() - started
                choice = json.loads((user.dir / "state.json").read_text()).get("choice") or {}
                fits.append(
                    {
                        "author": author,
                        "items": len(history),
                        "seconds": round(seconds, 3),
                        "stages": report.seconds,
                        "choice": choice.get("label"),
                        "decodes": decodes.to_json(),
                    }
                )
            personalizer.close()
    result = {"median_seconds": round(statistics.median(f["seconds"] for f in fits), 3), "fits": fits}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for fit in fits:
            print(f"author {fit['author']}: {fit['seconds']:.2f} s  {fit['stages']}  choice {fit['choice']}")
            for kind, counted in fit["decodes"].items():
                print(
                    f"    {kind}: {counted['tokens']} tokens ({counted['outputs']} output rows) in {counted['calls']}"
                    f" calls, {counted['seconds']} s"
                )
        print(f"median {result['median_seconds']:.2f} s over {len(fits)} fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
