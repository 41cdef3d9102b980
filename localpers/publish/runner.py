"""Run the publisher's stages in order, each cached under `WORK/<stage>/` and resumable.

A stage's cache key hashes the options it depends on plus the keys of every earlier stage. A stage
is skipped when its `done.json` carries the current key; a directory whose `key.txt` differs is wiped
(the inputs changed); a directory with the right key but no `done.json` was interrupted and is handed
back to the stage, which resumes what it can (SFT checkpoints, per-user pair and feature files).
A stage's independent work goes through `context.executor` (`localpers.publish.executor`); a task
rebuilds its own `PublishContext` from a picklable `ContextSpec` (`task_context`), in whatever process
or machine runs it; one that reads the corpus again refuses it unless its bytes hash as those the publish
parsed (the hash every stage key chains from). This module does not know what the stages compute; `localpers.publish.pipeline`
wires them up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from threadpoolctl import threadpool_limits

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.paths import check_own_directory
from localpers.publish.corpus import Corpus, load_corpus
from localpers.publish.executor import Executor, SequentialExecutor
from localpers.publish.options import STAGES, PublishOptions, stage_fields
from localpers.untrusted import one_line

DONE_MARKER = "done.json"
KEY_FILE = "key.txt"
LOG_NAME = "publish.log"  # in the work directory; every publish writes it first, so it marks one of ours


def check_work_directory(work: Path) -> None:
    """Refuse a stage cache a publish did not write: a stage whose inputs changed has its folder removed.

    A new or empty directory is fine, and so is one holding `publish.log` (an earlier publish's cache, which
    a rerun resumes). Anything else (say `--work ~` with a folder named `export`) is refused before work.
    """
    check_own_directory(
        work,
        option="--work",
        writer="a publish",
        replaces="its stage folders are replaced when their inputs change",
        is_ours=lambda entries: any(entry.name == LOG_NAME for entry in entries),
    )


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON via a temp file, fsynced before `os.replace`: readers never see half a file, and a power cut
    leaves the old file or the new one (without the fsync, a renamed file could be empty after one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"{path}: unreadable stage file ({exc}); re-run with --from-stage") from exc


def read_finished_json(context: PublishContext, path: Path, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """A per-user or per-adapter result a stage resumes from, or None where it is still to be made: missing, or
    damaged (empty, cut short, not a JSON object with `fields`), which is logged and removed so it is made again
    (it is one user's or adapter's work: failing the whole stage over it cost every other result)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {one_line(str(exc), 120)}"
    else:
        if isinstance(value, dict) and all(name in value for name in fields):
            return value
        problem = f"not a JSON object with {', '.join(fields)}"
    context.log(f"{path}: damaged ({problem}); making it again")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return None


def read_stage_file(path: Path, load: Callable[[Path], Any], stage: str) -> Any:
    """`load(path)` of a stage's torch or numpy file, or a one-line error naming it and the stage that writes it.

    A damaged file (cut short by a crash, a full disk) raised whatever its reader raises: torch's EOFError, which
    Click turned into a bare "Aborted.", or a zip error's traceback, naming no file, on every rerun."""
    try:
        return load(path)
    except Exception as exc:  # any reader's error on damaged bytes: the file is what the user can act on
        raise LocalpersError(
            f"{path}: unreadable stage file ({type(exc).__name__}: {one_line(str(exc), 120)}); remove it, or re-run"
            f" with --from-stage {stage}"
        ) from None


def read_torch(path: Path, stage: str) -> Any:
    """A stage's torch file (LoRA weights), or a one-line error naming it (`read_stage_file`)."""
    import torch

    return read_stage_file(path, lambda file: torch.load(file, weights_only=False), stage)


def read_npz(path: Path, stage: str, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The arrays `names` (None: every one) of a stage's .npz file, read now (numpy reads them lazily, so damage
    surfaced later, in a traceback)."""
    import numpy as np

    def load(file: Path) -> dict[str, Any]:
        with np.load(file) as data:
            return {name: data[name] for name in (data.files if names is None else names)}

    return read_stage_file(path, load, stage)


@dataclass
class PublishContext:
    """What every stage sees: options, the corpus, the backbone, the work dir, logging and progress."""

    options: PublishOptions
    corpus: Corpus
    backbone_path: Path
    backbone_sha256: str
    console: Console
    keys: dict[str, str] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    log_file: Path | None = None
    executor: Executor = field(default_factory=SequentialExecutor)

    def spec(self) -> ContextSpec:
        """What a task needs to rebuild this context elsewhere (no console, corpus or executor).

        A task run in this same process (the sequential executor) gets this very context back.
        """
        token = uuid.uuid4().hex
        _local_contexts.clear()
        _local_contexts[token] = self
        return ContextSpec(
            self.options,
            self.backbone_path,
            self.backbone_sha256,
            dict(self.keys),
            token,
            corpus_sha256=self.corpus.sha256,
        )

    @property
    def work(self) -> Path:
        return self.options.work_dir

    def stage_dir(self, stage: str) -> Path:
        return self.work / stage

    def summary(self, stage: str) -> dict[str, Any]:
        """The summary a finished stage recorded in its done marker."""
        marker = self.stage_dir(stage) / DONE_MARKER
        if not marker.exists():
            raise LocalpersError(f"stage {stage!r} has not run yet in {self.work}; run it first")
        return read_json(marker)["summary"]

    def log(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        self.console.print(f"[dim]{stamp}[/dim] {message}", highlight=False)
        if self.log_file is not None:
            with self.log_file.open("a", encoding="utf-8") as handle:
                handle.write(f"{datetime.now(UTC).isoformat(timespec='seconds')} {message}\n")

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A rich progress bar; yields `advance(n)`."""
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=not self.console.is_terminal,
        )
        with bar:
            task = bar.add_task(description, total=total)
            if self.console.is_terminal:
                yield lambda n=1: bar.advance(task, n)
                return
            # No live bar in a log file: a line every tenth of the way instead.
            state = {"done": 0, "next": max(1, total // 10)}

            def advance_and_log(n: int = 1) -> None:
                state["done"] += n
                if state["done"] >= state["next"] and total > 1:
                    self.log(f"  {description}: {state['done']}/{total}")
                    state["next"] = state["done"] + max(1, total // 10)

            yield advance_and_log


@dataclass(frozen=True)
class ContextSpec:
    """The picklable part of a `PublishContext`, shipped with every task."""

    options: PublishOptions
    backbone_path: Path
    backbone_sha256: str
    keys: dict[str, str]
    token: str = ""
    corpus_sha256: str = (
        ""  # of the bytes the publish parsed: a task that reads the corpus again must find them
    )


_local_contexts: dict[str, PublishContext] = {}
_corpora: dict[tuple[str, int, int], Corpus] = {}


def task_context(spec: ContextSpec) -> PublishContext:
    """A `PublishContext` for a task: the corpus is read once per process (keyed by path, size, mtime), and refused
    unless its bytes are those the publish parsed (`spec.corpus_sha256`)."""
    if spec.token in _local_contexts:
        return _local_contexts[spec.token]
    # numpy/BLAS with the run's thread count in every process: sums come out bit-identical everywhere.
    threadpool_limits(limits=spec.options.threads)
    path = Path(spec.options.corpus)
    try:
        stat = path.stat()
    except OSError as exc:
        raise LocalpersError(f"corpus {path} is not readable where this task runs ({exc.strerror})") from None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _corpora:
        _corpora.clear()
        _corpora[key] = load_corpus(path)
    corpus = _corpora[key]
    if spec.corpus_sha256 and corpus.sha256 != spec.corpus_sha256:
        # the stages are keyed by the bytes the publish read: a task trained or scored on others would mix two corpora
        raise LocalpersError(
            f"corpus {path}: its bytes differ from those the publish read (SHA-256 {corpus.sha256[:12]}, not"
            f" {spec.corpus_sha256[:12]}): the corpus changed during the publish; run it again"
        )
    return PublishContext(
        options=spec.options,
        corpus=corpus,
        backbone_path=spec.backbone_path,
        backbone_sha256=spec.backbone_sha256,
        console=Console(stderr=True),
        keys=dict(spec.keys),
        log_file=spec.options.work_dir / LOG_NAME,
    )


def stage_key(options: PublishOptions, stage: str, upstream: dict[str, str]) -> str:
    payload = {"stage": stage, "fields": stage_fields(options, stage), "upstream": upstream}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


StageFunction = Callable[[PublishContext, Path], dict[str, Any]]


def run_stages(
    context: PublishContext,
    functions: dict[str, StageFunction],
    *,
    until: str | None = None,
    from_stage: str | None = None,
    on_summary: Callable[[str, dict[str, Any]], None] | None = None,
    still_in_place: dict[str, Callable[[dict[str, Any]], bool]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the stages in `STAGES` order up to `until`; `from_stage` forces it and every later one to recompute
    (also those after `until`: kept, they would be reused by the next run though made from the old ones).

    `still_in_place[stage](summary)` says whether what a cached stage put outside its folder (the bundle stage's
    install in OUT) is still there; where not, the stage runs again."""
    for name in (until, from_stage):
        if name is not None and name not in STAGES:
            raise LocalpersError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}")
    last = STAGES.index(until) if until else len(STAGES) - 1
    forced = STAGES.index(from_stage) if from_stage else len(STAGES)
    summaries: dict[str, dict[str, Any]] = {}
    # Every stage's key chains from the inputs: a corpus edited in place or another backbone makes them all new
    # (the clusters key held only options, so an edited corpus found every stage cached and its old bundle kept).
    upstream: dict[str, str] = {
        "corpus": context.corpus.sha256,  # of the bytes parsed, not of the file as it is by now
        "backbone": context.backbone_sha256,
    }
    for stage in STAGES[forced:]:
        if context.stage_dir(stage).exists():
            shutil.rmtree(context.stage_dir(stage))
    for stage in STAGES[: last + 1]:
        key = stage_key(context.options, stage, dict(upstream))
        context.keys[stage] = key
        directory = context.stage_dir(stage)
        marker = directory / DONE_MARKER
        check = (still_in_place or {}).get(stage)
        cached = marker.exists() and read_json(marker).get("key") == key
        if cached and check is not None and not check(read_json(marker).get("summary", {})):
            context.log(f"stage {stage}: what it made is no longer where it put it, running it again")
            marker.unlink()
            cached = False
        if cached:
            done = read_json(marker)
            context.stage_seconds[stage] = float(done.get("seconds", 0.0))
            context.log(f"stage {stage}: cached ({done.get('seconds', 0):.1f} s when it ran)")
            summaries[stage] = done["summary"]
            upstream[stage] = key
            if on_summary is not None:
                on_summary(stage, done["summary"])
            continue
        key_file = directory / KEY_FILE
        if directory.exists() and (not key_file.exists() or key_file.read_text().strip() != key):
            context.log(f"stage {stage}: inputs changed, discarding its old cache")
            shutil.rmtree(directory)
        elif directory.exists():
            context.log(f"stage {stage}: resuming an interrupted run")
        directory.mkdir(parents=True, exist_ok=True)
        key_file.write_text(key + "\n")
        context.log(f"stage {stage}: started")
        started = time.perf_counter()
        summary = functions[stage](context, directory)
        seconds = time.perf_counter() - started
        context.stage_seconds[stage] = seconds
        write_json_atomic(marker, {"key": key, "seconds": round(seconds, 2), "summary": summary})
        context.log(f"stage {stage}: done in {seconds:.1f} s")
        summaries[stage] = summary
        upstream[stage] = key
        if on_summary is not None:
            on_summary(stage, summary)
    return summaries
