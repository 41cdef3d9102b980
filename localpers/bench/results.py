"""Turn a finished run's per-(method, user) records into results.json and outputs.jsonl.

results.json keeps exactly the shape the issue fixes, plus extra fields:

    {"methods": {"<name>": {"rouge1", "rougeL", "n", "ms_per_token", "fit_s_per_user", "bytes_per_user",
                            "max_bytes_per_user", ...}},
     "deltas_vs_global": {"<name>": {"rouge1": [low, mean, high], "rougeL": [...], "rouge1_ratio": [...]}},
     "deltas_vs": {"rag": {...}, "cluster": {...}}, "config": {...},
     "authors_vs_global": {"<name>": {"authors", "improved", "unchanged", "worse", "rouge1_ratio", "rouge1"}},
     "users": {"<user id>": {"history_items", "queries", "rouge1": {"<name>": the user's mean},
                             "fingerprints": {"<name>": its cache record's}, ...}},
     "targets": {"method": "card-auto", "summary", "checks": [{"target", "measured", "met"}]},
     "by_sibling": {"baseline", "edges", "bins": [{"name", "queries", "authors"}], "methods": {"<name>": {"bins": [...],
                    "top_share_for_target"}}, "target", "history_limit", "left_out": {"<name>": why}}}

Deltas pair the two methods' scores on the same (user, query); intervals are paired bootstrap 95%
percentile intervals over queries, and in `authors_vs_global` over authors (`localpers.bench.authors`).
`targets` (when the run has the default method) judges the product's targets (`localpers.bench.targets`);
`by_sibling` splits each method's gain by how close the author's history came to the answer
(`localpers.bench.siblings`).
outputs.jsonl holds every generation (it contains no reference text, but generated headlines for a private
test set: keep it out of the repository).
This module neither generates nor plots.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from localpers.atomic import atomic_write_text
from localpers.bench.authors import AuthorComparison, compare_authors
from localpers.bench.metrics import mean_interval, paired_bootstrap, paired_ratio_bootstrap
from localpers.bench.registry import BASELINE, get_method
from localpers.bench.runner import BenchRun
from localpers.bench.siblings import gain_by_sibling
from localpers.bench.targets import DEFAULT_METHOD, ROUGE_RATIO, check_targets, targets_summary

OTHER_BASELINES = ("rag", "cluster")
# results.json keeps 6 digits: report.md shows 4, and a value rounded to 5 first could print one off in the 4th
# (0.144751 -> 0.14475 -> "0.1447") where scripts/compare_runs.py, reading the scores, prints 0.1448
DIGITS = 6


def query_scores(records: list[dict[str, Any]], metric: str) -> tuple[list[tuple[str, str]], np.ndarray]:
    """((user, query id) keys, scores) over all users' queries, in run order."""
    keys = [(r["user"], q["query_id"]) for r in records for q in r["queries"]]
    return keys, np.array([q[metric] for r in records for q in r["queries"]], dtype=np.float64)


def method_summary(records: list[dict[str, Any]], *, n_resamples: int, seed: int) -> dict[str, Any]:
    """The per-method row of results.json."""
    _, r1 = query_scores(records, "rouge1")
    _, rl = query_scores(records, "rougeL")
    queries = [q for r in records for q in r["queries"]]
    tokens = sum(q["tokens"] for q in queries)
    decode_ms = sum(q["ms_per_token"] * q["tokens"] for q in queries)
    return {
        "rouge1": round(float(r1.mean()), DIGITS),
        "rougeL": round(float(rl.mean()), DIGITS),
        "n": len(queries),
        "ms_per_token": round(decode_ms / tokens, 3) if tokens else 0.0,
        "fit_s_per_user": round(float(np.mean([r["fit_seconds"] for r in records])), 3),
        # y- reused from another fit of the same user: the fit time then leaves their generation out
        "fit_shared_negatives": any((r.get("fit") or {}).get("shared_negatives") for r in records),
        "bytes_per_user": int(round(float(np.mean([r["stored_bytes"] for r in records])))),
        "max_bytes_per_user": int(max(r["stored_bytes"] for r in records)),  # what the state target judges
        "history_bytes_per_user": int(round(float(np.mean([r["history_bytes"] for r in records])))),
        "users": len(records),
        "rouge1_ci": mean_interval(r1, n_resamples=n_resamples, seed=seed).as_list(DIGITS),
        "rougeL_ci": mean_interval(rl, n_resamples=n_resamples, seed=seed).as_list(DIGITS),
        "prompt_ms": round(float(np.mean([q["prompt_ms"] for q in queries])), 2),
        # a whole rewrite as the user waits for it: the prompt's evaluation, then every generated token
        "rewrite_ms": round(
            float(np.mean([q["prompt_ms"] + q["tokens"] * q["ms_per_token"] for q in queries])), 2
        ),
        "tokens_per_output": round(tokens / len(queries), 2),
        **_gold_summary(queries, n_resamples=n_resamples, seed=seed),
    }


def _gold_summary(queries: list[dict[str, Any]], *, n_resamples: int, seed: int) -> dict[str, Any]:
    """Gold likelihood: mean per-token log-probability of the reference (per query, then averaged), its
    interval, and the perplexity over all reference tokens; empty for methods that do not score it."""
    scored = [q for q in queries if q.get("gold_logprob") is not None]
    if not scored or len(scored) != len(queries):
        return {}
    per_query = np.array([q["gold_logprob"] for q in scored], dtype=np.float64)
    tokens = np.array([q["gold_tokens"] for q in scored], dtype=np.float64)
    return {
        "gold_logprob": round(float(per_query.mean()), DIGITS),
        "gold_logprob_ci": mean_interval(per_query, n_resamples=n_resamples, seed=seed).as_list(DIGITS),
        "gold_perplexity": round(float(np.exp(-(per_query * tokens).sum() / tokens.sum())), 3),
    }


def deltas(
    candidate: list[dict[str, Any]], baseline: list[dict[str, Any]], *, n_resamples: int, seed: int
) -> dict[str, list[float]]:
    """Paired bootstrap intervals of candidate - baseline (R-1, R-L) and of the R-1 ratio."""
    out: dict[str, list[float]] = {}
    gold_a = [q.get("gold_logprob") for r in candidate for q in r["queries"]]
    gold_b = [q.get("gold_logprob") for r in baseline for q in r["queries"]]
    if gold_a and None not in gold_a and None not in gold_b and len(gold_a) == len(gold_b):
        out["gold_logprob"] = paired_bootstrap(
            np.array(gold_a), np.array(gold_b), n_resamples=n_resamples, seed=seed
        ).as_list(DIGITS)
    for metric in ("rouge1", "rougeL"):
        keys_a, a = query_scores(candidate, metric)
        keys_b, b = query_scores(baseline, metric)
        if keys_a != keys_b:
            raise ValueError("methods were scored on different (user, query) pairs; cannot pair them")
        out[metric] = paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed).as_list(DIGITS)
        if metric == "rouge1":
            out["rouge1_ratio"] = paired_ratio_bootstrap(a, b, n_resamples=n_resamples, seed=seed).as_list(
                DIGITS
            )
    return out


def authors_vs(
    candidate: list[dict[str, Any]], baseline: list[dict[str, Any]], *, n_resamples: int, seed: int
) -> AuthorComparison:
    """ROUGE-1 of `candidate` against `baseline` author by author, with intervals over resampled authors."""
    keys_a, a = query_scores(candidate, "rouge1")
    keys_b, b = query_scores(baseline, "rouge1")
    if keys_a != keys_b:
        raise ValueError("methods were scored on different (user, query) pairs; cannot pair them")
    labels = [_author(record) for record in candidate for _ in record["queries"]]
    return compare_authors(a, b, labels, n_resamples=n_resamples, seed=seed)


def _author(record: dict[str, Any]) -> str:
    return str(record.get("user_id", record["user"]))


def build_results(run: BenchRun) -> dict[str, Any]:
    """The results.json object of a run."""
    n, seed = run.config.n_resamples, run.config.seed
    methods = {}
    for spec in run.specs:
        summary = method_summary(run.records[spec.name], n_resamples=n, seed=seed)
        methods[spec.name] = {
            **summary,
            "base": spec.base,
            "params": run.params[spec.name],
            "overrides": dict(spec.params),
        }
    baseline = run.records[BASELINE]
    results: dict[str, Any] = {
        "methods": methods,
        "deltas_vs_global": {
            spec.name: deltas(run.records[spec.name], baseline, n_resamples=n, seed=seed)
            for spec in run.specs
            if spec.name != BASELINE
        },
        "deltas_vs": {
            other: {
                spec.name: deltas(run.records[spec.name], run.records[other], n_resamples=n, seed=seed)
                for spec in run.specs
                if spec.name not in (BASELINE, other)
            }
            for other in OTHER_BASELINES
            if other in run.records
        },
        "authors_vs_global": {
            spec.name: authors_vs(run.records[spec.name], baseline, n_resamples=n, seed=seed).as_dict(DIGITS)
            for spec in run.specs
            if spec.name != BASELINE
        },
        "config": {
            "command": run.config.command,
            "methods": [spec.name for spec in run.specs],
            "max_users": run.config.max_users,
            "max_queries": run.config.max_queries,
            "history_limit": run.config.history_limit,
            "dev_split": run.config.dev_split,
            "seed": seed,
            "bootstrap_resamples": n,
            "n_users": len(run.users),
            "n_queries": sum(len(u.queries) for u in run.users),
            **run.context,
        },
        "users": _user_table(run),
        "by_sibling": gain_by_sibling(
            run.users,
            run.records,
            BASELINE,
            history_limit=run.config.history_limit,
            target=ROUGE_RATIO,
            n_resamples=n,
            seed=seed,
            other_windows=_other_windows(run),
        ),
    }
    checks = check_targets(results)
    if checks:
        results["targets"] = {
            "method": DEFAULT_METHOD,
            "summary": targets_summary(checks),
            "checks": [check.as_dict() for check in checks],
        }
    return results


def _user_table(run: BenchRun) -> dict[str, Any]:
    """Per user: history size, each method's mean ROUGE-1 over the user's queries and the CARD fit
    diagnostics (no text)."""
    fitted = next(
        (name for name in ("card", *run.records) if name in run.records and run.records[name][0].get("fit")),
        None,
    )
    table: dict[str, Any] = {}
    for index, user in enumerate(run.users):
        row: dict[str, Any] = {
            # what the run's --history-limit let the methods use (the whole file's history was shown before)
            "history_items": len(user.history_up_to(run.config.history_limit)),
            "queries": len(user.queries),
            "rouge1": {
                spec.name: round(float(np.mean(scores)), DIGITS)
                for spec in run.specs
                if (scores := [q["rouge1"] for q in run.records[spec.name][index]["queries"]])
            },
            # which cache record each figure came from: a later run into the same --out (another --history-limit)
            # rewrites cache files, and scripts reading the cache must not mix its records with these figures
            "fingerprints": {
                spec.name: run.records[spec.name][index].get("fingerprint") for spec in run.specs
            },
        }
        if fitted is not None:
            record = run.records[fitted][index]
            row.update({"cluster": record["cluster"], "fit_method": fitted, **(record["fit"] or {})})
        table[user.user_id] = row
    return table


def _other_windows(run: BenchRun) -> dict[str, int | None]:
    """The methods fitted on another window of each author's history than the run's (`card@history=1`), by limit."""
    windows = {}
    for spec in run.specs:
        if get_method(spec.base).uses_history:
            limit = run.params[spec.name].get("history")
            if limit != run.config.history_limit:
                windows[spec.name] = limit
    return windows


def write_outputs(run: BenchRun, path: Path) -> int:
    """Every generation of the run as JSONL (user, query id, method, text, scores); returns the count."""
    lines = []
    for spec in run.specs:
        for record in run.records[spec.name]:
            for query in record["queries"]:
                lines.append(
                    json.dumps(
                        {
                            "user": record["user_id"],
                            "query_id": query["query_id"],
                            "method": spec.name,
                            **query,
                        },
                        ensure_ascii=False,
                    )
                )
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(lines)


def write_results(results: dict[str, Any], path: Path) -> None:
    """results.json; a figure that is not a finite number (a ratio to a mean of 0) is written as null, so that
    strict JSON readers take the file."""
    atomic_write_text(path, json.dumps(finite_only(results), indent=2, ensure_ascii=False) + "\n")


def finite_only(value: Any) -> Any:
    """`value` with every NaN or infinite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_only(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_only(item) for item in value]
    return value
