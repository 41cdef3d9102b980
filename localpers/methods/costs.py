"""Measure CoPe's and EXACT's costs for one user: fit time, bytes stored, decoding ms/token vs plain decoding.

    python -m localpers.methods.costs --bundle DIR --data ../shared/data/news-headlines/test.jsonl \\
        --user u075 --items 20 [--queries 3] [--out costs.json]

The user's last `--items` history items go into a throwaway user store (a temporary folder, removed
afterwards); the real user folders are not touched. Times are reported as wall seconds and as CPU
seconds of this process (all threads): on a shared machine the CPU seconds are the steadier figure.
This is a measurement script; the benchmark (`localpers bench`) is where quality is compared.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from localpers.users.history import HistoryItem


def _timed(action: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = action()
    return value, {
        "wall_s": round(time.perf_counter() - wall, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
    }


def _load_user(data: Path, user_id: str) -> tuple[list[HistoryItem], list[str]]:
    for line in data.read_text(encoding="utf-8").split("\n"):  # not splitlines: U+2028 may sit in a string
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("user_id") == user_id:
            items = [HistoryItem.create("headline", h["input"], h["output"]) for h in record["history"]]
            return items, [q["input"] for q in record.get("queries", [])]
    raise SystemExit(f"{data}: no user {user_id!r}")


def measure(bundle: str, data: Path, user_id: str, n_items: int, n_queries: int) -> dict[str, Any]:
    from localpers.engine.generation import generate
    from localpers.methods.card.personalizer import Personalizer
    from localpers.methods.cope import fit_cope, stored_bytes
    from localpers.methods.cope_decode import CopeDecoder, rewrite_cope
    from localpers.methods.exact import index_exact, index_path, load_index
    from localpers.methods.exact_rewrite import rewrite_exact
    from localpers.tasks import get_task
    from localpers.users.store import UserStore

    items, queries = _load_user(data, user_id)
    items = items[-n_items:]
    queries = queries[:n_queries] or [item.input for item in items[:n_queries]]
    task = get_task("headline")
    report: dict[str, Any] = {"user": user_id, "items": len(items), "queries": len(queries)}
    personalizer, report["load_personalizer"] = _timed(lambda: Personalizer.open(bundle=bundle))
    with tempfile.TemporaryDirectory(prefix="localpers-costs-") as root:
        user = UserStore(root=Path(root)).create(user_id.lower())
        user.save_history(items)
        exact, timing = _timed(lambda: index_exact(personalizer, user))
        report["exact_index"] = {**timing, **exact.to_json(), "bytes": index_path(user).stat().st_size}
        state, timing = _timed(lambda: fit_cope(personalizer, user))
        report["cope_fit"] = {**timing, **state.to_json(), "bytes": stored_bytes(user)}

        decoder, report["cope_load_decoder"] = _timed(lambda: CopeDecoder.for_user(personalizer, user, state))
        index = load_index(user)
        rows: dict[str, list[tuple[int, float]]] = {
            "user_plain": [],
            "cope": [],
            "cluster": [],
            "card": [],
            "exact": [],
        }
        for query in queries:
            prompt = task.prompt_for(query)
            plain = generate(decoder.user, prompt, max_tokens=task.default_max_tokens, stop=task.stop_strings)
            rows["user_plain"].append((len(plain.tokens), plain.decode_seconds))
            for name, result in (
                (
                    "cope",
                    rewrite_cope(
                        decoder,
                        state,
                        query,
                        history=user.history_index(task),
                        prompt_format=personalizer.prompt_format,
                    ),
                ),
                ("cluster", personalizer.rewrite(query, method="cluster", cluster=state.cluster)),
                ("card", personalizer.rewrite(query, method="card", cluster=state.cluster)),  # default vector
                ("exact", rewrite_exact(personalizer, index, query)[0]),
            ):
                rows[name].append((result.tokens, result.ms_per_token * result.tokens / 1000))
        decoder.close()
    personalizer.close()
    report["ms_per_token"] = {
        name: round(1000 * sum(s for _, s in values) / max(1, sum(n for n, _ in values)), 2)
        for name, values in rows.items()
    }
    report["tokens_generated"] = {name: int(np.sum([n for n, _ in values])) for name, values in rows.items()}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = measure(args.bundle, args.data, args.user, args.items, args.queries)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
