"""Record the greedy token ids every device method produces for the first N test queries, or compare two records.

Used to check that a change to the decoding path leaves greedy output token-for-token identical:

    python scripts/record_greedy.py record --data ../shared/data/news-headlines/test.jsonl --queries 50 \\
        --home /work/exp/greedy-home --threads 1 --out /work/exp/greedy-before.jsonl
    ... change the decoder ...
    python scripts/record_greedy.py record ... --out /work/exp/greedy-after.jsonl
    python scripts/record_greedy.py compare /work/exp/greedy-before.jsonl /work/exp/greedy-after.jsonl

`record` uses one user for every query (default: the shipped demo user), fitted once for CARD, CoPe and
EXACT inside `--home` (a LOCALPERS_HOME of its own, never the real user folders); a second run reuses those
fits, so only the decoding is compared. Each method decodes greedily with the task's default token limit, as
`localpers rewrite` does. Outputs are generated text of a private test set: keep them out of the repository.
The token ids are captured by wrapping the `generate` function the personalization modules call.
`compare` prints, per method, how many queries gave identical token ids and where the first difference is
(over the pairs both records hold; the "after" side may be split over several files).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEVICE_METHODS = ("card", "cluster", "global", "card-global", "global-history", "cope", "exact")


def first_queries(data: Path, count: int) -> list[tuple[str, str]]:
    """(user_id, input) of the first `count` queries of a shared-data file, in file order."""
    queries: list[tuple[str, str]] = []
    for line in data.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        for query in record.get("queries", []):
            queries.append((record["user_id"], query["input"]))
            if len(queries) == count:
                return queries
    return queries


class TokenRecorder:
    """Wraps a module's `generate` so every call's token ids are kept (the last call's are read back)."""

    def __init__(self) -> None:
        self.last: list[int] | None = None

    def wrap(self, module: Any) -> None:
        original: Callable[..., Any] = module.generate

        def recording(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.last = [int(t) for t in result.tokens]
            return result

        module.generate = recording

    def take(self) -> list[int]:
        if self.last is None:
            raise SystemExit("no generation was recorded: the wrapped modules no longer call `generate`")
        tokens, self.last = self.last, None
        return tokens


def record(args: argparse.Namespace) -> None:
    os.environ["LOCALPERS_HOME"] = str(Path(args.home).resolve())
    from threadpoolctl import threadpool_limits

    import localpers.methods.card.decoding_runs as card_decoding_module
    import localpers.methods.cope_decode as cope_decoding_module
    from localpers.device.demo import ensure_demo_user
    from localpers.methods.card.personalizer import Personalizer
    from localpers.methods.card.user_state import stored_token_bias, user_profile
    from localpers.methods.cope import fit_cope, load_state
    from localpers.methods.cope_decode import CopeDecoder, rewrite_cope
    from localpers.methods.exact import index_exact, index_path, load_index
    from localpers.methods.exact_rewrite import rewrite_exact
    from localpers.methods.stored_files import COPE_STATE_FILE
    from localpers.tasks import get_task
    from localpers.users.store import UserStore

    recorder = TokenRecorder()
    recorder.wrap(card_decoding_module)
    recorder.wrap(cope_decoding_module)
    methods = args.methods or list(DEVICE_METHODS)
    queries = first_queries(Path(args.data), args.queries)
    first = args.skip
    personalizer = Personalizer.open(model=args.model, bundle=args.bundle, n_threads=args.threads)
    store = UserStore()
    fits: dict[str, float] = {}
    started = time.perf_counter()
    user, _ = ensure_demo_user(personalizer, store)
    fits["card"] = round(time.perf_counter() - started, 1)
    cluster, vector, _ = user_profile(user)
    history = user.history_index(get_task("headline"))
    bias = stored_token_bias(
        user
    )  # CARD's correction includes the user's token bias, as `localpers rewrite` applies it
    decoder = state = index = None
    if "cope" in methods:
        if not (user.dir / COPE_STATE_FILE).is_file():
            started = time.perf_counter()
            with threadpool_limits(limits=args.threads):
                fit_cope(personalizer, user)
            fits["cope"] = round(time.perf_counter() - started, 1)
        state = load_state(user)
        decoder = CopeDecoder.for_user(personalizer, user, state)
    if "exact" in methods:
        if not index_path(user).is_file():
            started = time.perf_counter()
            index_exact(personalizer, user, max_pairs=args.exact_max_pairs)
            fits["exact"] = round(time.perf_counter() - started, 1)
        index = load_index(user)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        meta = {
            "queries": len(queries),
            "user": user.name,
            "methods": methods,
            "threads": args.threads,
            "fit_seconds": fits,
            "load_average": os.getloadavg(),
        }
        handle.write(json.dumps({"meta": meta}) + "\n")
        for number, (author, text) in enumerate(queries):
            if number < first:
                continue
            for method in methods:
                if method == "cope":
                    assert decoder is not None and state is not None
                    result = rewrite_cope(
                        decoder, state, text, history=history, prompt_format=personalizer.prompt_format
                    )
                elif method == "exact":
                    assert index is not None
                    result, _ = rewrite_exact(personalizer, index, text)
                else:
                    result = personalizer.rewrite(
                        text, method=method, cluster=cluster, vector=vector, history=history, bias=bias
                    )
                row = {
                    "query": number,
                    "author": author,
                    "method": method,
                    "tokens": recorder.take(),
                    "text": result.text,
                }
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            handle.flush()
            print(f"query {number + 1}/{len(queries)}", file=sys.stderr, flush=True)
    if decoder is not None:
        decoder.close()
    personalizer.close()


def load_record(path: Path) -> dict[tuple[int, str], dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {(row["query"], row["method"]): row for row in rows if "meta" not in row}


def compare(args: argparse.Namespace) -> None:
    before = load_record(Path(args.before))
    after: dict[tuple[int, str], dict[str, Any]] = {}
    for path in args.after:
        after.update(load_record(Path(path)))
    shared = sorted(set(before) & set(after))
    if len(shared) < max(len(before), len(after)):
        print(f"note: comparing the {len(shared)} (query, method) pairs both records have", file=sys.stderr)
    summary: dict[str, dict[str, Any]] = {}
    for query, method in shared:
        old, new = before[(query, method)], after[(query, method)]
        entry = summary.setdefault(method, {"identical": 0, "different": 0, "differences": []})
        if old["tokens"] == new["tokens"]:
            entry["identical"] += 1
            continue
        entry["different"] += 1
        first = next(
            (i for i, (a, b) in enumerate(zip(old["tokens"], new["tokens"], strict=False)) if a != b),
            min(len(old["tokens"]), len(new["tokens"])),
        )
        entry["differences"].append(
            {"query": query, "first_different_token": first, "before": old["text"], "after": new["text"]}
        )
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
        return
    for method, entry in summary.items():
        print(f"{method:<15} identical {entry['identical']:>3}  different {entry['different']:>3}")
        for diff in entry["differences"]:
            print(
                f"    query {diff['query']} (token {diff['first_different_token']}): {diff['before']!r} -> {diff['after']!r}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="decode the queries greedily with every method")
    rec.add_argument("--data", required=True, help="a shared-data JSONL file (users with queries)")
    rec.add_argument("--queries", type=int, default=50)
    rec.add_argument(
        "--skip", type=int, default=0, help="start at this query (to split a record over processes)"
    )
    rec.add_argument("--out", required=True, help="JSONL output (keep it outside the repository)")
    rec.add_argument(
        "--home", required=True, help="LOCALPERS_HOME for the fitted user (reused by later runs)"
    )
    rec.add_argument("--threads", type=int, default=1)
    rec.add_argument("--bundle", default=str(REPO / "models" / "demo-bundle"))
    rec.add_argument("--model", default=None, help="backbone GGUF (default: the embedded one)")
    rec.add_argument("--methods", nargs="*", choices=DEVICE_METHODS)
    rec.add_argument(
        "--exact-max-pairs", type=int, default=None, help="build the EXACT index from the N most recent pairs"
    )
    cmp_parser = commands.add_parser("compare", help="count identical token sequences per method")
    cmp_parser.add_argument("before")
    cmp_parser.add_argument("after", nargs="+", help="one record, or several (e.g. methods recorded apart)")
    cmp_parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    record(args) if args.command == "record" else compare(args)


if __name__ == "__main__":
    main()
