"""`localpers repo ...`: the publisher's signed bundle repository (keys, signing, timestamp refresh).

`keygen` creates ed25519 keys, `init` an empty repository, `add` publishes a bundle as signed targets,
`add-backbone` the backbone GGUF,
`refresh` re-signs the timestamp (or everything, the root with `--root`) with new expiry dates, `rotate` replaces the keys (TUF
root rotation), `fingerprint` prints what devices pin with `localpers pull URL --trust FINGERPRINT`.
The work is in `localpers.bundle.repository`; nothing here opens a network connection.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli.common import JsonOption, ModelOption, echo, print_json
from localpers.cli.expiry import expiry_json, expiry_report
from localpers.errors import InputError, LocalpersError

repo_app = typer.Typer(
    help="Publish bundles as a signed (TUF) repository of static files: keys, sign, re-sign.",
    no_args_is_help=True,
)

RepoArgument = Annotated[Path, typer.Argument(help="The repository directory (static files to host).")]
KeysOption = Annotated[
    Path,
    typer.Option("--keys", help="Directory of the publisher's private keys (never inside the repository)."),
]
MAX_DAYS = 36_500  # a century: any longer and an expiry date would soon run past what the format can write


def _days_option(what: str) -> Any:
    return Annotated[int | None, typer.Option("--days", min=1, max=MAX_DAYS, help=f"Days until {what}.")]


InitDaysOption = _days_option("the root expires (365 by default; targets 90, snapshot 30, timestamp 7)")
AddDaysOption = _days_option("the new targets expire (90 by default; the snapshot 30, the timestamp 7)")
RefreshDaysOption = _days_option(
    "the re-signed timestamp, snapshot and targets expire (7, 30 and 90 by default; a renewed root 365)"
)


def _expiry(days: int | None, *roles: str) -> dict[str, int] | None:
    return {role: days for role in roles} if days else None


def keygen(keys: Annotated[Path, typer.Argument(help="New directory for the four private keys.")]) -> None:
    """Create ed25519 keys for root, targets, snapshot and timestamp (PEM files, mode 0600)."""
    from localpers.bundle.keys import generate_keys
    from localpers.bundle.repository import refuse_keys_inside_a_repository

    refuse_keys_inside_a_repository(keys)
    keyids = generate_keys(keys)
    echo(f"created keys in {keys}; keep them off the web server, back up root.key offline")
    echo(
        f"root key {keyids['root']}: the fingerprint devices pin once `localpers repo init` makes a repository with"
        " these keys (a repository rotated to them keeps its first fingerprint)"
    )


def init(
    repo: RepoArgument,
    keys: KeysOption,
    days: InitDaysOption = None,
) -> None:
    """Create an empty signed repository (root, targets, snapshot, timestamp)."""
    from localpers.bundle.keys import remember_repository, signed_repositories
    from localpers.bundle.repository import init_repository

    earlier = [path for path in signed_repositories(keys) if path != str(repo.resolve())]
    if earlier:
        echo(
            f"warning: the keys in {keys} already sign the repository {earlier[-1]}: a device that trusts it refuses"
            " a new repository made with the same keys as a rollback (its versions start at 1 again); to move a"
            " repository, copy its folder, and for a new one make new keys with `localpers repo keygen`",
            err=True,
        )
    fingerprint = init_repository(repo, keys, _expiry(days, "root"))
    # a read-only keys folder: the repository is made all the same
    with contextlib.suppress(OSError, LocalpersError):
        remember_repository(keys, repo)
    echo(f"created repository {repo}; devices trust it with: localpers pull URL --trust {fingerprint}")
    expiry_report(repo)


def add(
    repo: RepoArgument,
    bundle: Annotated[Path, typer.Argument(help="The bundle directory to publish (verified first).")],
    keys: KeysOption,
    days: AddDaysOption = None,
    model: ModelOption = None,
) -> None:
    """Publish a bundle: check it as devices will, then copy and sign its files.

    Its files become signed targets; new targets, the snapshot and the timestamp are signed."""
    from localpers.bundle.format import PUBLISH_ADVICE, advising, check_given_bundle_dir, verify_bundle
    from localpers.bundle.repository import add_bundle, check_keys
    from localpers.engine.backbone import backbone_with_sha256
    from localpers.methods.card.bundle_content import check_bundle_content

    check_keys(repo, keys)  # a wrong or misplaced --keys is told before the bundle is read
    check_given_bundle_dir(bundle)
    with advising(PUBLISH_ADVICE):
        verified = verify_bundle(bundle)
    backbone = backbone_with_sha256(verified.backbone_sha256, model)
    with advising(PUBLISH_ADVICE):
        check_bundle_content(verified, backbone)  # signing a bundle every device refuses helps no one
    if backbone is None:
        echo(
            f"note: the backbone {bundle} names is not here (give it with --model), so the adapters were not"
            " checked against it; devices check them when they pull",
            err=True,
        )
    version = add_bundle(repo, bundle, keys, _expiry(days, "targets"))
    echo(f"published {bundle} in {repo} (targets version {version}); upload the repository files")
    expiry_report(repo)


def add_backbone(
    repo: RepoArgument,
    keys: KeysOption,
    model: ModelOption = None,
) -> None:
    """Publish the backbone GGUF as a signed target (`backbone/<sha256>.gguf`) for devices without PyPI."""
    from localpers.bundle.format import sha256_of_file
    from localpers.bundle.repository import add_file_target, check_keys
    from localpers.bundle.repository_metadata import BACKBONE_PREFIX
    from localpers.engine.backbone import resolve_backbone

    check_keys(repo, keys)  # before the backbone is hashed
    backbone = resolve_backbone(model)
    # hashed here, not the stamp's hash (size and mtime): a file changed in place under the same mtime was signed
    # under a name carrying the old hash, which devices then checked its bytes against, and refused
    sha256 = sha256_of_file(backbone.path)
    add_file_target(repo, f"{BACKBONE_PREFIX}{sha256}.gguf", backbone.path, keys, expected_sha256=sha256)
    echo(f"published backbone {backbone.path.name} (sha256 {sha256}) in {repo}")
    expiry_report(repo)


def refresh(
    repo: RepoArgument,
    keys: KeysOption,
    days: RefreshDaysOption = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Re-sign targets and snapshot too, not only the timestamp.")
    ] = False,
    root: Annotated[
        bool,
        typer.Option(
            "--root",
            help="Renew the root too (a new root version, same keys; needs root.key): do it before the root"
            " expires (365 days by default), or devices refuse the repository.",
        ),
    ] = False,
    root_days: Annotated[
        int | None,
        typer.Option(
            "--root-days", min=1, max=MAX_DAYS, help="Days until the renewed root expires (365 by default)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Re-sign the timestamp with a new expiry date (run it before the timestamp expires, default 7 days)."""
    from localpers.bundle.resigning import refresh as refresh_repository

    if root_days is not None and not root:
        raise InputError("--root-days sets the renewed root's expiry: give it with --root")
    versions = refresh_repository(
        repo,
        keys,
        {**(_expiry(days, "timestamp", "snapshot", "targets") or {}), **(_expiry(root_days, "root") or {})},
        everything=everything,
        root=root,
    )
    if as_json:
        print_json({**versions, "expires": expiry_json(repo)})
        expiry_report(repo, dates=False)  # the root's warning still reaches a cron job's mail, on stderr
        return
    signed = "targets, snapshot and timestamp" if everything else "the timestamp"
    signed = f"the root, {signed}" if root else signed
    versions_text = ", ".join(f"{role} {version}" for role, version in versions.items())
    echo(f"re-signed {signed} of {repo} with new expiry dates; versions now: {versions_text}")
    expiry_report(repo)


def rotate(
    repo: RepoArgument,
    keys: KeysOption,
    new_keys: Annotated[
        Path, typer.Option("--new-keys", help="Directory of the replacement keys (`keygen`).")
    ],
) -> None:
    """Replace every role's key: a new root signed by the old and the new root key (TUF key rotation)."""
    from localpers.bundle.repository import root_keyid
    from localpers.bundle.resigning import rotate_keys

    version = rotate_keys(repo, keys, new_keys)
    echo(
        f"root version {version} now trusts only the keys in {new_keys}; devices follow on their next pull. New"
        f" devices still pin the repository's first fingerprint, {root_keyid(repo)} (`localpers repo"
        " fingerprint`), and follow the rotation from there"
    )
    expiry_report(repo)


def fingerprint(repo: RepoArgument) -> None:
    """Print the fingerprint devices pin (`localpers pull URL --trust FINGERPRINT`)."""
    from localpers.bundle.repository import root_keyid

    echo(root_keyid(repo))


def register(app: typer.Typer) -> None:
    """Add the `repo` group to the main app, with one-line error handling."""
    from localpers.cli.common import one_line_errors

    for name, command in (
        ("keygen", keygen),
        ("init", init),
        ("add", add),
        ("add-backbone", add_backbone),
        ("refresh", refresh),
        ("rotate", rotate),
        ("fingerprint", fingerprint),
    ):
        repo_app.command(name)(one_line_errors(command))
    app.add_typer(repo_app, name="repo")
