"""Wire the publisher's stages together: `publish(options)` runs them and returns every stage summary.

Order: clusters -> sft -> export -> pairs -> features -> head -> bundle (see each stage's module).
This module resolves the corpus and backbone, sets up logging and the executor (`--executor`: this
process, or Ray), and leaves caching to `runner`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from threadpoolctl import threadpool_limits

from localpers.engine.backbone import resolve_backbone
from localpers.engine.torch_model import PEFT_MODULES
from localpers.errors import InputError
from localpers.folder_lock import locked
from localpers.methods.card.head_spec import BASES
from localpers.publish import (
    bundle_stage,
    clusters,
    export,
    features,
    head_training,
    pairs,
    sft_stage,
)
from localpers.publish.corpus import load_corpus
from localpers.publish.executor import EXECUTORS, Executor, SequentialExecutor
from localpers.publish.options import STAGES, PublishOptions
from localpers.publish.runner import LOG_NAME, PublishContext, check_work_directory, run_stages


def make_executor(
    kind: str,
    *,
    address: str | None = None,
    workers: int | None = None,
    retries: int = 3,
) -> Executor:
    """The executor `kind` names ('sequential' or 'ray'); Ray is imported only for 'ray'."""
    if kind not in EXECUTORS:
        raise InputError(f"--executor must be one of {', '.join(EXECUTORS)}, not {kind!r}")
    if address is not None and workers is not None:
        raise InputError("--workers sizes a local Ray; with --ray-address the cluster's own CPUs count")
    if kind == "sequential":
        if address is not None:
            raise InputError("--ray-address needs --executor ray")
        return SequentialExecutor()
    from localpers.publish.ray_executor import RayExecutor  # imports ray itself only when made

    return RayExecutor(address=address, workers=workers, retries=retries)


def publish(
    options: PublishOptions,
    *,
    until: str | None = None,
    from_stage: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run (or resume) the publisher; returns `{"stages": summaries, "seconds": ..., "out": ...}`.

    Every option is checked before anything is read, started or written (exit code 2 for a bad value)."""
    check_options(options, until=until, from_stage=from_stage)
    _refuse_out_inside_work(options.out, options.work_dir)
    bundle_stage.check_output_directory(options.out)
    check_work_directory(options.work_dir)
    corpus = load_corpus(options.corpus, min_users=max(2, options.k or 2))
    backbone = resolve_backbone(options.model)
    executor = make_executor(
        options.executor,
        address=options.ray_address,
        workers=options.workers,
        retries=options.task_retries,
    )
    try:
        limits = threadpool_limits(limits=options.threads)  # as in every task process (runner.task_context)
        try:
            options.work_dir.mkdir(parents=True, exist_ok=True)
            with locked(options.work_dir, wait=False, busy=_busy(options.work_dir)):
                return _publish(options, corpus, backbone, executor, until, from_stage, console)
        finally:
            limits.restore_original_limits()
    finally:
        executor.close()


def _busy(work: Path) -> str:
    """The refusal of a second publish on one --work (two wiped and refilled each other's stages)."""
    return (
        f"another publish is using --work {work} (its stage cache, OUT/.work by default): wait for it to finish,"
        " or give this one another --work"
    )


def _refuse_out_inside_work(out: Path, work: Path) -> None:
    """OUT inside the stage cache would be one of its folders or in one: a rerun whose inputs changed removed it
    before the new bundle was checked, and OUT kept nothing (the cache inside OUT, the default, is fine)."""
    out, work = out.expanduser().resolve(), work.expanduser().resolve()
    if out == work or work in out.parents:
        raise InputError(
            f"--out {out} is inside --work {work}, whose folders a rerun replaces: choose an --out outside it"
            " (the default --work is OUT/.work)"
        )


def check_options(options: PublishOptions, *, until: str | None, from_stage: str | None) -> None:
    """Refuse option values no stage can use, before any work: a typo found after the corpus is read, a Ray
    started or a finished stage's cache discarded (a new `--targets` changes the sft key) costs minutes."""
    if options.cluster_init not in ("global", "fresh"):
        raise InputError(f"--cluster-init must be 'global' or 'fresh', not {options.cluster_init!r}")
    if options.card_base not in ("auto", *BASES):
        raise InputError(f"--card-base must be auto, {' or '.join(BASES)}, not {options.card_base!r}")
    if options.precision not in ("auto", "bf16", "fp32"):
        raise InputError(f"--precision must be auto, bf16 or fp32, not {options.precision!r}")
    if options.head_u not in ("factored", "full"):
        raise InputError(f"--head-u must be 'factored' or 'full', not {options.head_u!r}")
    if options.k is not None and options.k < 1:
        raise InputError("--k must be at least 1")
    if options.shard_users < 1:
        raise InputError("--shard-users must be at least 1")
    if options.executor == "sequential":  # options only a Ray executor reads are refused, not ignored
        for flag, value in (("--workers", options.workers), ("--gpus-per-task", options.gpus_per_task)):
            if value is not None:
                raise InputError(
                    f"{flag} needs --executor ray (the sequential executor runs every task in this process,"
                    " on a local GPU through torch when there is one)"
                )
    unknown = [target for target in options.targets if target not in PEFT_MODULES]
    if unknown or not options.targets:
        problem = f"names unknown target(s) {', '.join(map(repr, unknown))}" if unknown else "is empty"
        raise InputError(f"--targets {problem}; choose from {', '.join(PEFT_MODULES)}, comma-separated")
    for flag, name in (("--until", until), ("--from-stage", from_stage)):
        if name is not None and name not in STAGES:
            raise InputError(f"{flag} {name!r} is not a stage; stages are: {', '.join(STAGES)}")
    if until is not None and from_stage is not None and STAGES.index(from_stage) > STAGES.index(until):
        raise InputError(
            f"--from-stage {from_stage} comes after --until {until}: nothing would be recomputed; stages run in"
            f" the order {', '.join(STAGES)}"
        )


def _publish(
    options: PublishOptions,
    corpus: Any,
    backbone: Any,
    executor: Any,
    until: str | None,
    from_stage: str | None,
    console: Console | None,
) -> dict[str, Any]:
    context = PublishContext(
        options=options,
        corpus=corpus,
        backbone_path=Path(backbone.path),
        backbone_sha256=backbone.sha256,
        console=console or Console(stderr=True),
        log_file=options.work_dir / LOG_NAME,
        executor=executor,
    )
    context.log(f"publish {corpus.path} ({len(corpus.users)} users, {corpus.n_items} items) -> {options.out}")
    info = executor.info
    context.log(
        f"executor: {info.kind}"
        + (f" at {info.address}, {info.workers:g} CPUs, {info.gpus:g} GPUs" if info.kind == "ray" else "")
    )
    check_stage_resources(context)
    summaries: dict[str, dict[str, Any]] = {}

    def bundle(ctx: PublishContext, directory: Path) -> dict[str, Any]:
        return bundle_stage.run(ctx, directory, summaries)

    functions = {
        "clusters": clusters.run,
        "sft": sft_stage.run,
        "export": export.run,
        "pairs": pairs.run,
        "features": features.run,
        "head": head_training.run_as_task,
        "bundle": bundle,
    }

    result = run_stages(
        context,
        functions,
        until=until,
        from_stage=from_stage,
        on_summary=summaries.__setitem__,
        still_in_place={"bundle": lambda summary: bundle_stage.installed(options.out, summary)},
    )
    return {
        "out": str(options.out),
        "work": str(options.work_dir),
        "stages": result,
        "stage_seconds": {name: round(s, 1) for name, s in context.stage_seconds.items()},
        "executor": {"kind": info.kind, "address": info.address, "cpus": info.workers, "gpus": info.gpus},
    }


def check_stage_resources(context: PublishContext) -> None:
    """Every stage's task against the executor before the first stage runs: a Ray cluster without the GPUs
    `--gpus-per-task` asks for, or without a node big enough for `--threads`, was found only when the stage
    that needed it started, after the stages before it had run."""
    for stage_resources in (
        clusters.task_resources,
        sft_stage.task_resources,
        pairs.shard_resources,
        head_training.task_resources,
    ):
        context.executor.check_resources(stage_resources(context))
