"""Stage `bundle`: assemble the bundle directory (docs/BUNDLE.md) with its manifest written last.

Files are staged under `WORK/bundle/staging/`, hashed there by `localpers.bundle.format.write_manifest`, then
moved into OUT: the old `manifest.json` is removed first and the new one moved in last, so a bundle
interrupted half-way has no manifest and no device will take it. Before the move, the staged bundle is read as a
device will read it (`localpers.methods.card.bundle_content`): a bundle devices would refuse (a head that training
left with NaN, say) is not installed, and OUT keeps what it had. Nothing here trains or evaluates.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localpers.bundle.format import FORMAT, MANIFEST_NAME, verify_bundle, write_manifest
from localpers.engine.backbone import DEFAULT_BACKBONE_NAME
from localpers.engine.encoder import ENCODER_DIM, ENCODER_ID, ENCODER_PACKAGE
from localpers.errors import LocalpersError
from localpers.folder_lock import locked
from localpers.methods.card.bundle_content import check_bundle_content
from localpers.paths import check_own_directory
from localpers.publish import plots
from localpers.publish.clusters import CENTROIDS_FILE
from localpers.publish.head_training import HEAD_FILE
from localpers.publish.prompts import prompt_format
from localpers.publish.runner import LOG_NAME, PublishContext
from localpers.untrusted import JSONProblem, parse_json

BUNDLE_ENTRIES = ("adapters", "plots", CENTROIDS_FILE, HEAD_FILE)
WORK_ENTRY = ".work"  # the default stage cache (`PublishOptions.work_dir`)
# Temporary folders of `install` inside OUT: the staged bundle copied from another filesystem, the old one aside.
INSTALLING_PREFIX = ".installing-"
REPLACED_PREFIX = ".replaced-"
ALL_MOVED = (
    ".all-moved"  # in a `.replaced-*` folder: every old entry is in it (what OUT holds beside it is new)
)


def check_output_directory(out: Path) -> None:
    """Refuse an OUT that a publish did not write: installing a bundle replaces its `adapters/` and `plots/`.

    A new or empty directory is fine, and so is one holding a bundle (a localpers `manifest.json`) or an
    interrupted publish's stage cache (`.work` with its log), which a rerun resumes. Checked before any stage
    runs.
    """
    check_own_directory(
        out,
        option="--out",
        writer="a publish",
        replaces=f"a bundle replaces its {', '.join(BUNDLE_ENTRIES)}",
        is_ours=lambda entries: any(_written_by_publish(entry) for entry in entries),
    )


def _written_by_publish(entry: Path) -> bool:
    """Whether `entry` of an OUT directory shows a publish wrote there: a localpers bundle manifest, a stage cache
    with its log, or an install's temporary folder. A web app's own `manifest.json` is none of these."""
    if entry.name == MANIFEST_NAME:
        with contextlib.suppress(OSError, JSONProblem, AttributeError):
            return parse_json(entry.read_bytes()[: 1 << 20]).get("format") == FORMAT
        return False
    if entry.name == WORK_ENTRY:
        return (entry / LOG_NAME).is_file()
    return entry.name.startswith((INSTALLING_PREFIX, REPLACED_PREFIX))


def backbone_name(context: PublishContext) -> str:
    if context.backbone_path.name.startswith(DEFAULT_BACKBONE_NAME):
        return DEFAULT_BACKBONE_NAME
    return context.backbone_path.stem


def build_manifest(context: PublishContext, summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    options = context.options
    clusters, sft, export, head = (summaries[s] for s in ("clusters", "sft", "export", "head"))
    features = summaries["features"]
    names = list(export["files"])
    return {
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "backbone": {
            "name": backbone_name(context),
            "sha256": context.backbone_sha256,
            "n_embd": features["n_embd"],
            "n_layer": len(features["tap_layers"]) and max(features["tap_layers"]) + 1,
        },
        "encoder": {"id": ENCODER_ID, "package": ENCODER_PACKAGE, "dim": ENCODER_DIM},
        "task": options.task,
        **({"prompt": chosen.to_manifest()} if (chosen := prompt_format(context)) is not None else {}),
        "clusters": {"k": clusters["k"], "centroids": CENTROIDS_FILE, "sizes": clusters["sizes"]},
        "adapters": {name: f"adapters/{name}.gguf" for name in names},
        "lora": {
            "rank": options.rank,
            "alpha": options.lora_alpha,
            "dropout": options.dropout,
            "targets": list(options.targets),
            "steps": {name: record["steps"] for name, record in sft["adapters"].items()},
            "lr": options.lr,
            "batch_size": options.batch_size,
            "cluster_init": options.cluster_init,
            "precision": sft["precision"]["chosen"],
        },
        "head": {"file": HEAD_FILE, **head["config"]},
        "data_card": {
            "source": options.data_source or f"{Path(options.corpus).name} (not described: --data-source)",
            "licence": options.data_licence or "not stated (--data-licence)",
            "users": clusters["users"],
            "items": clusters["items"],
            "validation_items": clusters["val_items"],
        },
        "training": {
            "silhouette": clusters["silhouette"],
            "val_loss": {
                name: {key: r[key] for key in ("val_loss_backbone", "val_loss_init", "val_loss", "val_items")}
                for name, r in sft["adapters"].items()
            },
            "sft_tokens_per_second": {name: r["tokens_per_second"] for name, r in sft["adapters"].items()},
            "precision_measured": sft["precision"].get("measured", {}),
            "export_check": export["adapters"],
            "pairs": summaries["pairs"]["pairs"],
            "head_pair_accuracy": head["heldout_accuracy"],
            "head_heldout_pairs": head["heldout_pairs"],
            "stage_seconds": {name: round(s, 1) for name, s in context.stage_seconds.items()},
        },
    }


def run(context: PublishContext, directory: Path, summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    staging = directory / "staging"
    if staging.exists():
        shutil.rmtree(staging)
    (staging / "adapters").mkdir(parents=True)
    (staging / "plots").mkdir()
    export_dir = context.stage_dir("export")
    for name, file in summaries["export"]["files"].items():
        shutil.copyfile(export_dir / file, staging / "adapters" / f"{name}.gguf")
    shutil.copyfile(context.stage_dir("clusters") / CENTROIDS_FILE, staging / CENTROIDS_FILE)
    shutil.copyfile(context.stage_dir("head") / HEAD_FILE, staging / HEAD_FILE)
    plots.plot_sft_losses(
        staging / "plots" / "sft_loss.png", summaries["sft"]["train_loss"], summaries["sft"]["adapters"]
    )
    plots.plot_head(
        staging / "plots" / "head_accuracy.png",
        summaries["head"]["curve"],
        summaries["head"]["heldout_accuracy"],
    )
    manifest = build_manifest(context, summaries)
    write_manifest(staging, manifest)
    check_as_devices_will(staging, context.backbone_path, context.options.out)
    install(staging, context.options.out)
    out = context.options.out
    files = bundle_files(out, context.options.work_dir)
    total = sum((out / f).stat().st_size for f in files)
    return {"files": files, "bytes": total, "manifest_sha256": _manifest_sha256(context.options.out)}


def bundle_files(out: Path, work: Path) -> list[str]:
    """OUT's files (paths relative to it), less the stage cache where it lies inside OUT, whatever its name: a
    folder named `.work` above OUT, or another name given to --work, says nothing about which files are OUT's."""
    work = work.resolve()
    return sorted(
        path.relative_to(out).as_posix()
        for path in out.rglob("*")
        if path.is_file() and not path.resolve().is_relative_to(work)
    )


def installed(out: Path, summary: dict[str, Any]) -> bool:
    """Whether `out` still holds the bundle this stage installed, whole: its manifest unchanged and every file
    it lists as listed. A cached stage with another --out, or an OUT removed or edited since (a file damaged
    or deleted), is run again: it said "wrote OUT" and installed nothing, or left a bundle devices refuse."""
    recorded = summary.get("manifest_sha256")
    if not (isinstance(recorded, str) and _manifest_sha256(out) == recorded):
        return False
    try:
        verify_bundle(out)
    except LocalpersError:
        return False
    return True


def _manifest_sha256(out: Path) -> str | None:
    try:
        return hashlib.sha256((out / MANIFEST_NAME).read_bytes()).hexdigest()
    except OSError:
        return None


def check_as_devices_will(staging: Path, backbone: Path, out: Path) -> None:
    """Refuse to install a staged bundle that `pull` and `--bundle` would refuse on a device."""
    try:
        check_bundle_content(verify_bundle(staging), backbone)
    except LocalpersError as exc:
        raise LocalpersError(
            f"this publish built a bundle devices would refuse ({exc}); it was not installed in {out}:"
            " rerun from the stage that wrote the file (`--from-stage`, for example `--from-stage head`)"
        ) from exc


def install(staging: Path, out: Path) -> None:
    """Move the staged bundle into `out`: manifest removed first, bundle files replaced, manifest last.

    The staged files are first copied beside `out` when they are on another filesystem (`--work` elsewhere),
    since a rename cannot cross one; the old bundle's files are moved aside, not deleted, until the new
    manifest is in place, and put back if the move fails half-way: OUT keeps one whole bundle or the other.
    """
    out.mkdir(parents=True, exist_ok=True)
    with locked(out, wait=True, busy=""):
        _install_locked(staging, out)


def _restore_killed_install(out: Path) -> None:
    """Put back the bundle an install killed half-way (SIGKILL, a power cut) had moved aside, when OUT lacks a
    manifest: removing it, the next install left OUT with no bundle at all if it failed in turn."""
    if os.path.lexists(out / MANIFEST_NAME):
        return
    asides = [
        path
        for path in out.glob(f"{REPLACED_PREFIX}*")
        if path.is_dir() and not path.is_symlink() and (path / MANIFEST_NAME).is_file()
    ]
    if not asides:
        return
    aside = max(asides, key=lambda path: path.stat().st_mtime_ns)
    all_moved = (aside / ALL_MOVED).exists()
    for entry in BUNDLE_ENTRIES:
        if os.path.lexists(aside / entry):
            _remove(out / entry)
            os.replace(aside / entry, out / entry)
        elif all_moved:  # the old bundle had no such entry: what OUT has there is the killed install's
            _remove(out / entry)
    os.replace(aside / MANIFEST_NAME, out / MANIFEST_NAME)


def _install_locked(staging: Path, out: Path) -> None:
    _restore_killed_install(out)
    for leftover in out.glob(".*-*"):  # of an install killed before it could clean up (none is running)
        if leftover.name.startswith((INSTALLING_PREFIX, REPLACED_PREFIX)):
            _remove(leftover)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    source = staging
    if not _same_filesystem(staging, out):
        source = out / f"{INSTALLING_PREFIX}{tag}"
        try:
            shutil.copytree(staging, source)
        except BaseException:
            shutil.rmtree(source, ignore_errors=True)
            raise
    aside = out / f"{REPLACED_PREFIX}{tag}"
    aside.mkdir()
    moved: list[str] = []  # old entries now aside
    placed: list[str] = []  # new entries now in OUT
    try:
        for entry in (MANIFEST_NAME, *BUNDLE_ENTRIES):
            if os.path.lexists(out / entry):
                os.replace(out / entry, aside / entry)
                moved.append(entry)
        (aside / ALL_MOVED).touch()
        for entry in BUNDLE_ENTRIES:
            os.replace(source / entry, out / entry)
            placed.append(entry)
        os.replace(source / MANIFEST_NAME, out / MANIFEST_NAME)
    except BaseException:
        for entry in placed:  # the new files that made it in go, the old ones come back
            _remove(out / entry)
        for entry in moved:
            with contextlib.suppress(OSError):
                os.replace(aside / entry, out / entry)
        with contextlib.suppress(OSError):
            (aside / ALL_MOVED).unlink()
        with contextlib.suppress(OSError):
            aside.rmdir()  # only when every old file is back
        raise
    finally:
        if source is not staging:
            shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)


def _same_filesystem(first: Path, second: Path) -> bool:
    return os.stat(first).st_dev == os.stat(second).st_dev


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
