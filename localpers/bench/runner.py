"""Run the benchmark: per (method, user) fit what the method needs, generate every query, score, cache.

Layout under the output directory:

    users/history-<N|all>/users/<user>/   the benchmark's own user store per history truncation
                                          (history, vector, state, negatives); never the real store
    cache/<method>/<user>.json            one finished (method, user): outputs, scores, timings
    outputs.jsonl, results.json, report.md, *.png   written at the end from the cache

A (method, user) cache file is reused only when its fingerprint (bundle, backbone, the CPU's kernels, the code
that computes outputs (`fits.code_sha256`), method and its parameters, the history item ids and the queries)
matches, so an interrupted run resumes where it
stopped and a changed bundle or data file recomputes (the llama.cpp threads are not in it: a record keeps
the threads it was timed with, and a run that mixes them says so in a note). Users are taken one at a time,
every method in turn, so the methods' timings share the machine's drift. Fits are shared between methods
through the benchmark's user store (`fits.FitStore`). This module does not aggregate or plot (see `results`,
`report`, `plots`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_text
from localpers.bench.data import BenchUser, read_bench_file
from localpers.bench.fits import BENCH_VERSION, FitStore, code_sha256, sha256_text
from localpers.bench.method_names import (
    DEFAULT_PRESET,
    check_method_names,
    effective_params,
    expand_methods,
)
from localpers.bench.methods import Method, MethodSpec
from localpers.bench.metrics import rouge
from localpers.bench.registry import get_method
from localpers.bench.styles import Style, get_style, restyle_users
from localpers.bench.targets import MIXED_TIMINGS
from localpers.errors import LocalpersError
from localpers.folder_lock import locked
from localpers.methods.card.personalizer import Personalizer
from localpers.paths import check_own_directory
from localpers.users.history import MAX_HISTORY_ITEMS, check_history_size, serialize_history

Progress = Callable[[str, int, int, str], None]  # (method, users done, users total, what is happening)
_UNSAFE_PATH = re.compile(r"[^A-Za-z0-9_.=@,-]+")


@dataclass
class BenchConfig:
    """What to run; mirrors the `localpers bench` options."""

    data: Path
    out: Path
    methods: list[str] = field(default_factory=lambda: [DEFAULT_PRESET])
    max_users: int | None = None
    max_queries: int | None = None
    history_limit: int | None = None
    seed: int = 0
    bundle: Path | None = None
    model: str | None = None
    n_resamples: int = 10_000
    command: str | None = None
    threads: int | None = None  # llama.cpp threads (None = all cores; 1 is far faster on a busy CPU)
    style: str | None = None  # a style probe: every gold output rewritten in this style (bench.styles)
    dev_split: bool = False  # train authors: most recent 30% of each history as queries (bench.data)


@dataclass
class BenchRun:
    """Everything a finished run produced, for aggregation and reports."""

    config: BenchConfig
    users: list[BenchUser]
    specs: list[MethodSpec]
    params: dict[str, dict[str, Any]]  # method name -> effective parameters
    records: dict[str, list[dict[str, Any]]]  # method name -> one record per user, in user order
    context: dict[str, Any]  # bundle, backbone, data file facts


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class ResultCache:
    """One JSON file per finished (method, user); written atomically, trusted only on a matching fingerprint."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, method: str, user: str) -> Path:
        return self.root / _UNSAFE_PATH.sub("_", method) / f"{user}.json"

    def load(self, method: str, user: str, fingerprint: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.path(method, user).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # absent or half-written by an older interrupted run: recompute
        if not isinstance(record, dict) or record.get("fingerprint") != fingerprint:
            return None
        return record

    def save(self, record: dict[str, Any]) -> None:
        path = self.path(record["method"], record["user"])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, ensure_ascii=False, indent=1) + "\n")


def check_output_directory(out: Path) -> None:
    """Refuse an --out a benchmark did not write: a run replaces its report.md, results.json and plots.

    A new or empty directory is fine, and so is an earlier run's (it has `cache/`) or probes' (`probes.json`,
    or a style's run folder with `cache/`), which a rerun resumes. Checked before the model loads.
    """

    def is_ours(entries: list[Path]) -> bool:
        names = {entry.name for entry in entries}
        return "cache" in names or "probes.json" in names or any((e / "cache").is_dir() for e in entries)

    check_own_directory(
        out,
        option="--out",
        writer="a benchmark",
        replaces="a run replaces its report.md, results.json, outputs.jsonl and plots",
        is_ours=is_ours,
    )


def run_bench(
    config: BenchConfig,
    *,
    personalizer: Personalizer | None = None,
    progress: Progress | None = None,
    notify: Callable[[str], None] | None = None,
    hold: contextlib.ExitStack | None = None,
) -> BenchRun:
    """Evaluate every method on every user (from the cache where possible) and return the raw records.

    `notify` is told, before the model loads, each note on how the data file was read (also kept in
    results.json's config as `data_notes`). `--out` is locked from its creation (a second run into it is refused)
    until the run returns, or until `hold` closes (`run_and_write`, which writes the outputs meanwhile).
    """
    from localpers.bench.extra_methods import MethodStateRoot

    check_method_names(config.methods)
    data = read_bench_file(
        config.data, max_users=config.max_users, max_queries=config.max_queries, dev_split=config.dev_split
    )
    users = data.users
    _check_history_sizes(config, users)
    notes = data.notes
    for note in notes:
        if notify:
            notify(note)
    style = get_style(config.style) if config.style else None
    if style is not None:
        users = restyle_users(users, style)
    check_output_directory(config.out)
    owned = personalizer is None
    if personalizer is None:
        personalizer = Personalizer.open(model=config.model, bundle=config.bundle, n_threads=config.threads)
    own_hold = contextlib.ExitStack()
    try:
        specs = expand_methods(config.methods, personalizer, config.history_limit)
        try:
            config.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LocalpersError(
                f"--out {config.out}: cannot create the output directory ({exc.strerror}); give another path"
            ) from None
        busy = (
            f"another localpers bench is running into --out {config.out} (runs into one folder replace each"
            " other's outputs): wait for it to finish, or give this one another --out"
        )
        (hold or own_hold).enter_context(locked(config.out, wait=False, busy=busy))
        MethodStateRoot.path = config.out / "method-state"  # CoPe's LoRA files, EXACT's indexes
        fits = FitStore(config.out / "users", personalizer)
        cache = ResultCache(config.out / "cache")
        context = {
            "bundle": str(personalizer.bundle.directory),
            "bundle_sha256": personalizer.bundle_sha256,
            "backbone": personalizer.backbone.path.name,
            "backbone_sha256": personalizer.backbone.sha256,
            "head": personalizer.head_config.to_manifest(),
            "threads": personalizer.engine.n_threads,
            "data": str(config.data),
            "data_sha256": _file_sha256(Path(config.data)),
            "code_sha256": code_sha256(),  # the sources that compute outputs (`fits.OUTPUT_CODE`)
            "style": config.style,
            "data_notes": notes,
        }
        params = {s.name: effective_params(s, personalizer, config.history_limit) for s in specs}
        records: dict[str, list[dict[str, Any]]] = {spec.name: [] for spec in specs}
        if progress:
            for spec in specs:
                progress(spec.name, 0, len(users), "")
        # User by user, every method in turn: a machine whose speed drifts during the run then moves every
        # method's timings alike, so the cost ratios compare like with like (run one method after another,
        # the first method's ms/token once came out 17% above the others' on an idle machine).
        for done, user in enumerate(users):
            for spec in specs:
                records[spec.name].append(
                    _run_user(
                        spec,
                        params[spec.name],
                        user,
                        (done, len(users)),
                        personalizer,
                        fits,
                        cache,
                        progress,
                        style,
                    )
                )
        mixed = mixed_threads_note(records, personalizer.engine.n_threads)
        if mixed:
            context["run_notes"] = [mixed]
        return BenchRun(config, users, specs, params, records, context)
    finally:
        own_hold.close()
        if owned:
            personalizer.close()


def mixed_threads_note(records: dict[str, list[dict[str, Any]]], threads: int) -> str | None:
    """A note when some cached (method, user) records were timed with other llama.cpp threads than `threads`.

    A run resumed with another `--threads` reuses the finished (method, user) records, whose outputs and scores
    do not depend on the threads, so its timings mix both.
    """
    counts = Counter(
        record.get("threads") for method_records in records.values() for record in method_records
    )
    if set(counts) <= {threads}:
        return None
    parts = ", ".join(
        f"{count} with {used} threads" if used is not None else f"{count} from a run that did not record them"
        for used, count in sorted(counts.items(), key=lambda entry: (entry[0] is None, entry[0] or 0))
    )
    return (
        f"{MIXED_TIMINGS} ({parts} of the (method, user) results; this run has {threads}): "
        "it reused an earlier run's finished results, so its costs mix both; for costs, run again into a new --out"
    )


def _check_history_sizes(config: BenchConfig, users: list[BenchUser]) -> None:
    """Refuse, before the model loads, a history longer than a user may have, unless --history-limit cuts it."""
    if config.history_limit is not None and config.history_limit <= MAX_HISTORY_ITEMS:
        return
    for user in users:
        check_history_size(
            len(user.history),
            what=f"{config.data} line {user.line} (user {user.user_id}):",
            hint=f"or add --history-limit {MAX_HISTORY_ITEMS} to fit on each user's most recent ones",
        )


def _run_user(
    spec: MethodSpec,
    params: dict[str, Any],
    user: BenchUser,
    position: tuple[int, int],
    personalizer: Personalizer,
    fits: FitStore,
    cache: ResultCache,
    progress: Progress | None,
    style: Style | None = None,
) -> dict[str, Any]:
    """One method on one user: its cached record when the fingerprint matches, else evaluated and cached."""
    method = get_method(spec.base)
    limit = params.get("history")
    done, total = position
    items = user.history_up_to(limit) if method.uses_history else ()
    fingerprint = sha256_text(
        [
            BENCH_VERSION,
            personalizer.bundle_sha256,
            personalizer.backbone.sha256,
            # outputs change with the CPU's kernels: a run resumed on another CPU (or LOCALPERS_CPU_BUFFERS)
            # mixed both configurations' outputs without a note; and with the code that computes them
            personalizer.engine.kernels,
            code_sha256(),
            spec.name,
            params,
            [item.id for item in items],
            [[q.id, q.input, q.reference] for q in user.queries],
            *([style.name] if style else []),
        ]
    )
    record = cache.load(spec.name, user.store_name, fingerprint)
    if record is None:

        def on_stage(detail: str) -> None:
            if progress:
                progress(spec.name, done, total, f"{user.user_id}: {detail}")

        record = _evaluate_user(spec, method, user, limit, personalizer, fits, on_stage, style)
        record["fingerprint"] = fingerprint
        # The threads are not in the fingerprint (outputs do not depend on them); kept for `mixed_threads_note`.
        record["threads"] = personalizer.engine.n_threads
        cache.save(record)
    if progress:
        progress(spec.name, done + 1, total, "")
    return record


def _evaluate_user(
    spec: MethodSpec,
    method: Method,
    user: BenchUser,
    limit: int | None,
    personalizer: Personalizer,
    fits: FitStore,
    on_stage: Callable[[str], None],
    style: Style | None = None,
) -> dict[str, Any]:
    on_stage("fit")
    regularisation = spec.get("reg")
    prior = spec.get("prior")
    profile = fits.profile(
        user,
        limit,
        method,
        on_stage,
        regularisation=None if regularisation is None else float(regularisation),
        prior=None if prior is None else float(prior),
    )
    started = time.perf_counter()
    prepared = method.prepare(personalizer, profile, spec)
    fit_seconds = profile.fit_seconds + (time.perf_counter() - started)
    outputs = []
    for index, query in enumerate(user.queries):
        on_stage(f"query {index + 1}/{len(user.queries)}")
        gold = {"reference": query.reference} if method.scores_gold else {}
        try:
            result = method.generate(personalizer, profile, prepared, query.input, spec, **gold)
        except LocalpersError as exc:
            raise LocalpersError(f"user {user.user_id} query {query.id} ({spec.name}): {exc}") from None
        scores = rouge(result.text, query.reference)
        outputs.append(
            {
                "query_id": query.id,
                "text": result.text,
                "rouge1": round(scores.rouge1, 6),
                "rougeL": round(scores.rougeL, 6),
                "tokens": result.tokens,
                "ms_per_token": result.ms_per_token,
                "prompt_ms": result.prompt_ms,
                "gold_logprob": result.gold_logprob,
                "gold_tokens": result.gold_tokens,
                **({"style_hit": style.detect(result.text)} if style else {}),
            }
        )
    report = profile.fit_report
    return {
        "method": spec.name,
        "user": user.store_name,
        "user_id": user.user_id,
        "history_items": len(profile.items),
        "history_bytes": len(serialize_history(profile.items).encode()) if profile.items else 0,
        "cluster": profile.cluster,
        "fit_seconds": round(fit_seconds, 4),
        "stored_bytes": method.stored_bytes(profile),
        "fit": {
            key: report.get(key)
            for key in (
                "mode",
                "n_pairs",
                "train_accuracy",
                "heldout_accuracy",
                "heldout_accuracy_default",
                "n_heldout",
                "shared_negatives",
            )
        }
        if report
        else None,
        "choice": profile.choice,
        "queries": outputs,
    }
