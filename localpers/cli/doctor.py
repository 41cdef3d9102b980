"""The `localpers doctor` command: what this machine's set-up is, and what in it would stop demo, fit or rewrite.

It reports the backbone, the bundle in use (its content checked, whether a pulled one is pinned), llama.cpp's
build, threads and weight buffers, the data directories, the installed extras with where `publish` would train,
and the users (those whose fit is for another bundle, those whose files a rewrite refuses, a damaged active
pointer); each problem of the set-up is a line and exit code 1. A user's files are that user's, not the set-up's,
except the active pointer's and the active user's: `fit` and `rewrite` without `--user` read them, so a damage
there is a problem too.
It reads the users' files and loads the backbone once; it writes nothing and opens no network connection.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from localpers import __version__
from localpers.cli.common import JsonOption, ModelOption, echo, one_line_errors, print_json
from localpers.errors import LocalpersError

if TYPE_CHECKING:
    from localpers.engine.backbone import Backbone
    from localpers.engine.cpu_buffers import BufferChoice


def doctor(model: ModelOption = None, as_json: JsonOption = False) -> None:
    """Show the backbone, the bundle in use, llama.cpp, threads, directories, extras and users; name problems.

    Exit 1, naming each problem, when something would stop demo, fit or rewrite (a bad bundle, a damaged active user).
    """

    from localpers import paths

    llama_version, llama_info, llama_problem = _llama_cpp_or_problem()
    backbone, backbone_problem = _backbone_or_problem(model)
    try:
        from localpers.engine.encoder import encoder_dir

        encoder = str(encoder_dir())
    except LocalpersError as exc:
        encoder = f"missing: {exc}"
    threads_problem = _threads_problem()
    loaded = (
        _load_backbone(backbone, threads_problem) if backbone is not None and llama_problem is None else None
    )
    extras = {
        name: importlib.util.find_spec(name) is not None
        for name in ("torch", "transformers", "peft", "sklearn", "gguf", "ray", "matplotlib", "pytest")
    }
    report = {
        "version": __version__,
        "backbone": {"path": str(backbone.path), "sha256": backbone.sha256, "source": backbone.source}
        if backbone is not None
        else {"path": None, "sha256": None, "source": None, "error": backbone_problem},
        "llama_cpp_python": llama_version,
        "llama_system_info": llama_info,
        "threads": loaded.threads if isinstance(loaded, _Loaded) else None,
        "encoder": encoder,
        "cpu_buffers": {
            "setting": loaded.choice.setting,
            "offered": list(loaded.choice.offered),
            "allowed": list(loaded.choice.allowed),
            "reason": loaded.choice.reason,
            "weights_mib": loaded.weights,
        }
        if isinstance(loaded, _Loaded)
        else None,
        "layer_taps": "c"
        if importlib.util.find_spec("localpers._taps")
        else "python (slower: C callback not built)",
        "dirs": {
            "data": str(paths.data_dir()),
            "cache": str(paths.cache_dir()),
            "config": str(paths.config_dir(create=False)),
        },
        "extras": {
            "publish": all(extras[n] for n in ("torch", "transformers", "peft", "sklearn", "gguf", "ray")),
            **extras,
        },
    }
    # the publisher's torch loads llama.cpp first (`engine.torch_model`), so it is asked only where that loads
    report["training"] = _training_device() if report["extras"]["publish"] and llama_problem is None else None
    report["bundle"] = _bundle_status(backbone)
    report["users"], refused = _users_status(report["bundle"].get("clusters"), report["bundle"].get("head_d"))
    if isinstance(loaded, str):
        backbone_problem = f"the backbone did not load: {loaded}"
    report["problems"] = (
        ([llama_problem] if llama_problem else [])
        + ([threads_problem] if threads_problem else [])
        + _problems(report, backbone_problem)
        + _active_user_problems(report["users"], refused)
    )
    report["ok"] = not report["problems"]
    if as_json:
        print_json(report)
    else:
        _print_report(report)
    if report["problems"]:  # a broken set-up exits 1, so a script need not read the prose
        raise typer.Exit(1)


@dataclass(frozen=True)
class _Loaded:
    """What only loading the backbone tells: llama.cpp's buffer types for its weights, and its threads."""

    choice: BufferChoice
    weights: dict[str, float]
    threads: int | None  # None: the threads setting is refused (a problem of its own)


def _llama_cpp_or_problem() -> tuple[str | None, str | None, str | None]:
    """llama-cpp-python's version and llama.cpp's system line, or why llama-cpp-python cannot be loaded."""
    try:
        from localpers.engine import llama_cpp_version, llama_system_info

        return llama_cpp_version(), llama_system_info(), None
    except LocalpersError as exc:
        return None, None, str(exc)


def _backbone_or_problem(model: str | None) -> tuple[Backbone | None, str | None]:
    """The backbone commands would use, or why there is none (a report line instead of doctor's end)."""
    from localpers.bundle.backbone_choice import backbone_for_bundle

    try:
        return backbone_for_bundle(model), None
    except LocalpersError as exc:
        return None, str(exc)


def _threads_problem() -> str | None:
    """Why LOCALPERS_THREADS stops every command, or None (the backbone is fine: it is the setting)."""
    from localpers.engine.threads import default_threads

    try:
        default_threads()
    except LocalpersError as exc:
        return str(exc)
    return None


def _load_backbone(backbone: Backbone, threads_problem: str | None = None) -> _Loaded | str:
    """Load the backbone as every command does (on one thread when the threads setting is refused, so the rest
    of the report still comes); the reason as a string when llama.cpp cannot."""
    try:
        from localpers.engine import Engine

        # Loading the backbone is the only way to learn which buffer types llama.cpp gave its weights.
        threads = 1 if threads_problem else None
        with Engine(backbone.path, n_ctx=64, tap_layers=None, n_threads=threads) as engine:
            return _Loaded(engine.buffer_choice, engine.weight_buffers, None if threads else engine.n_threads)
    except LocalpersError as exc:
        return str(exc)


def _problems(report: dict[str, Any], backbone_problem: str | None) -> list[str]:
    """What stops `demo`, `fit` or `rewrite` from working here, one line each."""
    from localpers import paths

    problems = [] if backbone_problem is None else [backbone_problem]
    if not report["bundle"]["ok"]:
        problems.append(f"bundle: {report['bundle']['content']}")
    if str(report["encoder"]).startswith("missing: "):
        problems.append(f"encoder: {report['encoder'].removeprefix('missing: ')}")
    if report["users"]["folder_problem"]:
        problems.append(f"users: {report['users']['folder_problem']}")
    data = paths.data_dir()
    if not os.access(data, os.W_OK):
        problems.append(f"data dir {data} cannot be written; users' histories and fits are kept there")
    return problems


def _active_user_problems(users: dict[str, Any], refused: dict[str, str]) -> list[str]:
    """A damaged active pointer, or an active user whose files a rewrite refuses (`refused`: why, by name), as
    problem lines: `fit` and `rewrite` without `--user` stop on either. Other users' damage stays a report line."""
    if users["active_problem"]:
        return [f"active user: {users['active_problem']}"]
    active = users["active"]
    if active is not None and active in refused:
        return [f"active user {active!r}: {refused[active]}"]
    return []


def _print_report(report: dict[str, Any]) -> None:
    encoder = report["encoder"]
    echo(f"localpers {report['version']}")
    backbone = report["backbone"]
    if backbone["path"] is None:
        echo("backbone      none (see the problem below)")
    else:
        echo(f"backbone      {backbone['path']} ({backbone['source']})")
        echo(f"  sha256      {backbone['sha256']}")
    bundle = report["bundle"]
    echo(f"bundle        {bundle['directory']} ({bundle['origin']})")
    echo(f"  content     {bundle['content']}")
    if bundle.get("pinned") is False:
        echo(
            "  pinned      no: an earlier localpers pulled it and kept no record of its manifest, so an edit to"
            " manifest.json goes unnoticed; pull it once more (`localpers pull URL`) to record it"
        )
    if report["llama_cpp_python"] is None:
        echo("llama.cpp     llama-cpp-python cannot be loaded (see problems)")
    else:
        echo(f"llama.cpp     llama-cpp-python {report['llama_cpp_python']}")
        echo(f"  system      {report['llama_system_info']}")
    unknown = "? (LOCALPERS_THREADS is refused)" if report["cpu_buffers"] else "? (the backbone did not load)"
    echo(f"threads       {unknown if report['threads'] is None else report['threads']}")
    echo(f"encoder       {encoder}")
    buffers = report["cpu_buffers"]
    if buffers is None:
        echo("cpu buffers   ? (the backbone did not load)")
    else:
        placed = ", ".join(f"{name} {mib:.1f} MiB" for name, mib in buffers["weights_mib"].items()) or "?"
        echo(f"cpu buffers   {buffers['reason']}")
        echo(f"  weights in  {placed}   (LOCALPERS_CPU_BUFFERS=auto|repack|plain|all)")
    echo(f"layer taps    {report['layer_taps']}")
    for name, where in report["dirs"].items():
        echo(f"{name + ' dir':<14}{where}")
    installed = ", ".join(f"{name}={'yes' if ok else 'no'}" for name, ok in report["extras"].items())
    echo(f"extras        {installed}")
    training = report["training"]
    if training is not None and training["device"] == "cuda":
        echo(f"training      cuda: {training['name']} (publish's SFT and export run on it)")
    elif training is not None:
        precision = "bf16 or fp32, whichever is faster" if training["bf16"] else "fp32 (no bf16 instructions)"
        echo(f"training      cpu: no GPU that torch sees; --precision auto trains {precision}")
    users = report["users"]
    echo(f"users         {users['count']}" + (f" (active: {users['active']})" if users["active"] else ""))
    if users["active_problem"]:
        echo(f"  active      none: {users['active_problem']}")
    if users["fitted_with_another_bundle"]:
        echo(
            f"  refit due   {', '.join(users['fitted_with_another_bundle'])}: fitted with another bundle than the"
            " one in use or in another fit format, so rewrites show their history without CARD's correction until"
            " `localpers fit --user NAME`"
        )
    if users["unreadable"]:
        echo(
            f"  damaged     {', '.join(users['unreadable'])}: a rewrite refuses their files"
            " (`localpers user show NAME` says which and what to do)"
        )
    for problem in report["problems"]:
        echo(f"problem       {problem}")


def _bundle_status(backbone: Backbone | None) -> dict[str, Any]:
    """The bundle commands would use, and whether its files and content pass what `pull` checks (its files
    only, when there is no backbone to check its content against)."""
    from localpers.bundle.format import advising, default_bundle_dir, open_bundle, repair_advice
    from localpers.methods.card.bundle_content import check_bundle_content
    from localpers.methods.card.user_state import head_dim_of

    status: dict[str, Any] = {"directory": "?", "origin": "?"}
    try:
        status["origin"] = _origin()
        status["directory"] = str(default_bundle_dir())
        bundle = open_bundle(None, backbone_sha256=None if backbone is None else backbone.sha256)
        if backbone is None:  # the users' fits are still checked against its k and head width
            return {
                **status,
                "ok": True,
                "content": "files verified; content not checked (no backbone)",
                "clusters": bundle.k,
                "head_d": head_dim_of(bundle.manifest),
            }
        with advising(repair_advice(bundle.directory)):
            check_bundle_content(bundle, backbone.path)
    except LocalpersError as exc:
        return {**status, "ok": False, "content": f"refused: {exc}"}
    fits = "ok: files verified; head, centroids and adapters fit this backbone"
    return {
        **status,
        "ok": True,
        "content": fits,
        "pinned": _pinned(bundle.directory),
        "clusters": bundle.k,
        "head_d": head_dim_of(bundle.manifest),
    }


def _users_status(
    clusters: int | None = None, head_d: int | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """How many users this device has, whose files a rewrite would refuse (their state, vector, token bias, the
    fit's choice, a cluster past the bundle's `clusters`, or history), and whose CARD fit was made with another
    bundle than the one in use (after an upgrade or a pull: rewrites fall back for them); with it, why each
    refused user is refused, by name. Reads their files as a rewrite does; writes nothing."""
    from localpers.bundle.format import bundle_in_use_sha256
    from localpers.methods.card.user_state import check_stored_fit
    from localpers.methods.stored_files import fit_is_outdated, fit_made_for
    from localpers.users.folder import User
    from localpers.users.store import UserStore

    store = UserStore()
    try:
        store.check_folder()
        folder_problem = None
    except LocalpersError as exc:  # a file where the users' folder goes: every user command fails
        folder_problem = str(exc)
    in_use = bundle_in_use_sha256()
    stale, unreadable = [], []
    refused: dict[str, str] = {}
    try:
        names = store.list()
    except OSError as exc:  # a users folder this account cannot read: the rest of the report still helps
        names, folder_problem = [], f"{store.users_dir}: cannot read ({exc.strerror or exc})"
    for name in names:
        try:
            user = User(
                name, store.users_dir / name
            )  # not store.get: it tidies the folder, doctor writes nothing
            check_stored_fit(user, in_use, clusters, head_d)  # the checks `localpers rewrite` makes
            state = user.state()
        except (LocalpersError, OSError) as exc:  # OSError: a folder this account cannot read
            unreadable.append(name)
            refused[name] = (
                str(exc) if isinstance(exc, LocalpersError) else f"cannot read ({exc.strerror or exc})"
            )
            continue
        # without a bundle in use to compare with, only the fit's format can be judged
        unusable = fit_is_outdated(state) if in_use is None else not fit_made_for(state, in_use)
        if isinstance(state.get("fit"), dict) and unusable:
            stale.append(name)
    active_problem = None
    try:
        active = store.active_name()
    except LocalpersError as exc:
        active, active_problem = None, str(exc)
    except OSError as exc:  # the active user's folder this account cannot read (Path.is_dir raises then)
        active, active_problem = (
            None,
            f"cannot read {exc.filename or store.users_dir} ({exc.strerror or exc})",
        )
    status = {
        "count": len(names),
        "active": active,
        "active_problem": active_problem,
        "folder_problem": folder_problem,
        "fitted_with_another_bundle": stale,
        "unreadable": unreadable,
    }
    return status, refused


def _pinned(directory: Path) -> bool | None:
    """Whether the pulled bundle at `directory` has the record of its signed manifest that later commands check
    its manifest against; None for a bundle that was not pulled (the embedded one, `--bundle DIR`)."""
    from localpers.bundle.locations import installed_bundle_dir
    from localpers.bundle.record import record_path

    installed = installed_bundle_dir()
    if installed is None or installed.resolve() != directory.resolve():
        return None
    return record_path(installed).is_file()


def _origin() -> str:
    """Where the bundle in use comes from; a pulled one whose version is gone is named so, not the demo."""
    from localpers.bundle.locations import installed_bundle_dir

    try:
        return "pulled" if installed_bundle_dir(strict=True) is not None else "embedded demo"
    except LocalpersError:
        return "pulled (missing)"


def _training_device() -> dict[str, object]:
    """Where `localpers publish` would train its adapters (`torch_model.training_device`), for the report."""
    from localpers.engine.torch_model import cpu_has_bf16, training_device

    if training_device() == "cuda":
        import torch

        return {"device": "cuda", "name": torch.cuda.get_device_name()}
    return {"device": "cpu", "bf16": cpu_has_bf16()}


def register(app: typer.Typer) -> None:
    """Add `doctor` to the main app with one-line error handling."""
    app.command("doctor")(one_line_errors(doctor))
