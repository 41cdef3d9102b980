"""`localpers publish CORPUS --out DIR`: train and write a bundle (needs the `[publish]` extra).

Thin Typer front end over `localpers.publish.pipeline.publish`; every flag maps onto a
`PublishOptions` field. Progress bars and log lines go to stderr, `--json` prints the stage summaries
on stdout. Re-running the same command resumes: finished stages are reused from `OUT/.work`.
By default the independent tasks (adapters, author shards) run on a local Ray; `--ray-address` sends
them to an existing cluster, `--executor sequential` runs them one after another in this process.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from localpers.cli.common import echo, one_line_errors, print_json
from localpers.cli.expiry import expiry_json, expiry_report
from localpers.cli.numbers import float_option
from localpers.engine.lora_targets import DEFAULT_TARGETS
from localpers.engine.threads import MAX_THREADS
from localpers.errors import PUBLISH_EXTRA_HINT, InputError, LocalpersError
from localpers.methods.bounds import MAX_D, MAX_TOP_K
from localpers.publish.options import STAGES, PublishOptions


def publish_command(
    corpus: Annotated[Path, typer.Argument(help="Training corpus: JSONL, one user per line.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Bundle directory to write.")],
    k: Annotated[
        int | None, typer.Option("--k", min=1, help="Number of clusters (default: best silhouette in 2..6).")
    ] = None,
    minibatch_above: Annotated[
        int, typer.Option(min=1, help="More users than this: MiniBatchKMeans and a sampled silhouette.")
    ] = 2000,
    global_epochs: Annotated[
        float, float_option("--global-epochs", low=0.0, low_open=True, help="Epochs of the global adapter.")
    ] = 1.0,
    cluster_epochs: Annotated[
        float,
        float_option("--cluster-epochs", low=0.0, low_open=True, help="Epochs of each cluster adapter."),
    ] = 1.0,
    max_steps: Annotated[
        int | None, typer.Option(min=1, help="Cap on the SFT steps of every adapter.")
    ] = None,
    cluster_init: Annotated[
        str, typer.Option(help="Cluster adapters start from 'global' or 'fresh'.")
    ] = "global",
    card_base: Annotated[
        str,
        typer.Option(
            help="The adapter CARD corrects: 'cluster', 'global', or 'auto' (global when --history-examples > 0)."
        ),
    ] = "auto",
    rank: Annotated[int, typer.Option(min=1, help="LoRA rank.")] = 16,
    lora_alpha: Annotated[
        float, float_option("--lora-alpha", low=0.0, low_open=True, help="LoRA alpha.")
    ] = 32.0,
    dropout: Annotated[float, float_option("--dropout", low=0.0, high=0.9, help="LoRA dropout.")] = 0.05,
    targets: Annotated[str, typer.Option(help="Comma-separated LoRA targets (GGUF names).")] = ",".join(
        DEFAULT_TARGETS
    ),
    lr: Annotated[float, float_option("--lr", low=0.0, low_open=True, help="SFT learning rate.")] = 2e-4,
    batch_size: Annotated[int, typer.Option(min=1, help="SFT batch size.")] = 8,
    precision: Annotated[
        str,
        typer.Option(
            help="auto (fp32 on a CPU without bf16 instructions, else the faster of the two, timed once and kept"
            " for a resumed run: give bf16 or fp32 for a run that must repeat exactly), bf16 or fp32."
        ),
    ] = "auto",
    history_examples: Annotated[
        int,
        typer.Option(
            min=0,
            max=20,
            help="Train with the author's K earlier outputs in the prompt (history-conditioned); 0 = plain.",
        ),
    ] = 0,
    described_examples: Annotated[
        int,
        typer.Option(
            min=0,
            max=20,
            help="Of those, show the closest N with their content (task prompt + output) as well.",
        ),
    ] = 0,
    recent_examples: Annotated[
        int,
        typer.Option(
            min=0,
            max=20,
            help="Of those, take N from the author's most recent earlier outputs instead of the closest ones.",
        ),
    ] = 0,
    example_pool: Annotated[
        str,
        typer.Option(
            help="Where training prompts' examples come from: the author's 'earlier' items (what a device has)"
            " or all 'others' (nearest in time as the recent ones).",
        ),
    ] = "earlier",
    checkpoint_every: Annotated[int, typer.Option(min=1, help="SFT checkpoint interval in steps.")] = 25,
    pairs_per_user: Annotated[int | None, typer.Option(min=1, help="Cap on preference pairs per user.")] = 30,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Token limit of the greedy y-.")] = 32,
    head_d: Annotated[int, typer.Option(min=1, max=MAX_D, help="Head dimension D.")] = 128,
    head_steps: Annotated[int, typer.Option(min=1, help="Full-batch steps of head training.")] = 300,
    head_lr: Annotated[float, float_option("--head-lr", low=0.0, help="Head learning rate.")] = 5e-3,
    head_weight_decay: Annotated[
        float, float_option("--head-weight-decay", low=0.0, help="Head weight decay.")
    ] = 1e-2,
    head_top_k: Annotated[int, typer.Option(min=1, max=MAX_TOP_K, help="top-k the device corrects.")] = 20,
    head_target_correction: Annotated[
        float,
        float_option(
            "--head-target-correction",
            low=0.0,
            help="Set head alpha so the mean |per-token correction| is this many logits (0 = alpha 1).",
        ),
    ] = 1.0,
    head_length_normalised: Annotated[
        bool,
        typer.Option(
            "--head-length-normalised",
            help="Train the head on the mean per-token reward instead of the sum (the device follows).",
        ),
    ] = False,
    head_author_negatives: Annotated[
        int,
        typer.Option(
            min=0,
            help="Per pair, this many extra pairs whose y- is another same-cluster author's own text.",
        ),
    ] = 0,
    head_u: Annotated[
        str,
        typer.Option(
            help="Head U: 'factored' (E Q, 400x smaller) or 'full' (a row per token seen in pairs)."
        ),
    ] = "factored",
    data_source: Annotated[
        str | None,
        typer.Option(
            help="What the corpus is, for the bundle's data card (default: its file name, marked not described)."
        ),
    ] = None,
    data_licence: Annotated[
        str | None,
        typer.Option(help="The corpus's licence, for the bundle's data card (default: 'not stated')."),
    ] = None,
    val_fraction: Annotated[
        float,
        float_option(
            "--val-fraction", low=0.0, high=0.5, help="Held-out items per user for validation loss."
        ),
    ] = 0.1,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Random seed.")] = 0,
    threads: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_THREADS,
            help="CPU threads for torch (SFT, export, the head) and numpy/scikit-learn.",
        ),
    ] = 2,
    engine_threads: Annotated[
        int,
        typer.Option(
            min=1, max=MAX_THREADS, help="CPU threads for llama.cpp (the export check, pairs, features)."
        ),
    ] = 2,
    executor: Annotated[
        str,
        typer.Option(
            help="Where tasks run: 'ray' (a local Ray, or --ray-address) or 'sequential' (this process)."
        ),
    ] = "ray",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="Submit the tasks to this existing Ray cluster (e.g. HEAD_IP:6379, 'auto')."
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="CPUs of the local Ray (default: every core).")
    ] = None,
    shard_users: Annotated[int, typer.Option(min=1, help="Authors per pairs/features/embedding task.")] = 8,
    task_retries: Annotated[int, typer.Option(min=0, help="Times Ray re-runs a task whose worker died.")] = 3,
    gpus_per_task: Annotated[
        float | None,
        float_option(
            "--gpus-per-task",
            low=0.0,
            help="GPUs per SFT/export task (default: 1 when the Ray cluster has GPUs).",
        ),
    ] = None,
    until: Annotated[str | None, typer.Option(help=f"Stop after this stage ({', '.join(STAGES)}).")] = None,
    from_stage: Annotated[
        str | None,
        typer.Option(
            help="Recompute this stage and all later ones (with --until, those after it are discarded, to be made anew by the next run)."
        ),
    ] = None,
    work: Annotated[Path | None, typer.Option(help="Stage cache directory (default OUT/.work).")] = None,
    model: Annotated[
        str | None, typer.Option("--model", envvar="LOCALPERS_MODEL", help="Backbone GGUF path.")
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option(
            "--repo",
            help="Also sign the finished bundle into this repository (`localpers repo init`); needs --keys.",
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option("--keys", help="The repository's private keys directory (`localpers repo keygen`)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the stage summaries as JSON.")] = False,
) -> None:
    """Train cluster + global LoRA adapters and the CARD head on CORPUS and write a bundle to --out."""
    needed = ("torch", "transformers", "peft", "sklearn", "gguf", "matplotlib") + (
        ("ray",) if executor == "ray" else ()
    )
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise LocalpersError(
            f"publish needs the publish extra ({', '.join(missing)} missing): {PUBLISH_EXTRA_HINT}"
        )
    if (repo is None) != (keys is None):
        raise InputError("--repo and --keys go together: the repository to sign into and its keys")
    if repo is not None and keys is not None:
        from localpers.bundle.repository import check_keys

        check_keys(repo, keys)  # a wrong repository or keys found now, not after an hour of training
    from localpers.publish.pipeline import publish

    options = PublishOptions(
        corpus=corpus,
        out=out,
        work=work,
        model=model,
        seed=seed,
        k=k,
        minibatch_above=minibatch_above,
        val_fraction=val_fraction,
        rank=rank,
        lora_alpha=lora_alpha,
        dropout=dropout,
        targets=tuple(t.strip() for t in targets.split(",") if t.strip()),
        lr=lr,
        batch_size=batch_size,
        global_epochs=global_epochs,
        cluster_epochs=cluster_epochs,
        max_steps=max_steps,
        cluster_init=cluster_init,
        card_base=card_base,
        precision=precision,
        history_examples=history_examples,
        described_examples=described_examples,
        recent_examples=recent_examples,
        example_pool=example_pool,
        checkpoint_every=checkpoint_every,
        threads=threads,
        engine_threads=engine_threads,
        pairs_per_user=pairs_per_user,
        max_new_tokens=max_new_tokens,
        head_d=head_d,
        head_steps=head_steps,
        head_lr=head_lr,
        head_weight_decay=head_weight_decay,
        head_top_k=head_top_k,
        head_target_correction=head_target_correction or None,
        length_normalised=head_length_normalised,
        head_author_negatives=head_author_negatives,
        head_u=head_u,
        executor=executor,
        ray_address=ray_address,
        workers=workers,
        shard_users=shard_users,
        task_retries=task_retries,
        gpus_per_task=gpus_per_task,
        data_source=data_source,
        data_licence=data_licence,
    )
    if repo is not None:
        _check_repository_use(repo, options, until)
    result = publish(options, until=until, from_stage=from_stage)
    if repo is not None and keys is not None and "bundle" in result["stages"]:
        from localpers.bundle.repository import add_bundle

        version = add_bundle(repo, out, keys)
        result["repository"] = {"path": str(repo), "targets_version": version, "expires": expiry_json(repo)}
    if as_json:
        print_json(result, indent=2, default=str)
        if "repository" in result:
            expiry_report(repo, dates=False)  # type: ignore[arg-type]
        return
    echo(f"bundle stages done: {', '.join(result['stages'])}")
    for stage, seconds in result["stage_seconds"].items():
        echo(f"  {stage:<9} {seconds:8.1f} s")
    if "bundle" in result["stages"]:
        bundle = result["stages"]["bundle"]
        echo(f"wrote {out} ({len(bundle['files'])} files, {bundle['bytes'] / 1e6:.1f} MB)")
    if "repository" in result:
        echo(f"signed into {repo} (targets version {result['repository']['targets_version']})")
    if repo is not None and "repository" in result:
        expiry_report(repo)


def _check_repository_use(repo: Path, options: PublishOptions, until: str | None) -> None:
    """Refuse, before any work, a publish that would sign nothing (`--until` before the bundle: it exited 0 and
    said nothing) or put its bundle or stage cache in the repository folder, which is uploaded whole: the cache
    holds the authors' ids and headlines."""
    if until is not None and until != "bundle":
        raise InputError(
            f"--repo signs the bundle, and --until {until} stops before it is made: drop --until, or --repo and"
            " --keys (sign later with `localpers repo add`)"
        )
    for option, folder in (("--out", options.out), ("--work", options.work_dir)):
        repository, inside = repo.expanduser().resolve(), folder.expanduser().resolve()
        if inside == repository or repository in inside.parents:
            raise InputError(
                f"{option} {folder} is inside the repository {repo}, which is uploaded whole (the stage cache holds"
                " the authors' ids and headlines): give a folder outside it; `--repo` copies the bundle in"
            )


def register(app: typer.Typer) -> None:
    """Add `publish` to the main app with one-line error handling."""
    app.command("publish")(one_line_errors(publish_command))
