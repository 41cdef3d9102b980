"""What is inside a bundle, checked before anyone uses it: `pull` before it installs, `bundle verify` on request.

`localpers.bundle.format.verify_bundle` checks that a bundle's files are the ones its manifest lists (sizes,
sha256); a bundle that nobody signed (`pull --unsigned`, `--bundle DIR`) can list edited files with their new
hashes, and a signed one can carry a publisher's mistake. `check_bundle_content` reads each file the way the
device will and refuses, in one line naming the file or manifest field, what a fit or rewrite would refuse
later: a manifest `prompt` or `head` entry out of range, a cluster without an adapter, an adapter that does not
fit the backbone or holds non-finite weights, head tensors of the wrong shape or not finite, centroids that are
not `(k, 384)` finite numbers, tapped layers the backbone lacks. It reads headers and arrays only: it loads no
model and runs nothing from the bundle.

`check_bundle_before_use` is what commands call before they load a bundle: a directory given on the command line
every time, the pulled bundle once (a stamp in the bundle cache remembers which manifest, backbone and revision of
this check passed), the embedded demo bundle never (it is part of the installed package, like its code).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from localpers.atomic import atomic_write_bytes
from localpers.bundle.format import (
    MANIFEST_NAME,
    Bundle,
    BundleProblem,
    advising,
    repair_advice,
    sha256_of_file,
)
from localpers.bundle.locations import CURRENT_LINK, bundles_root, installed_bundle_dir
from localpers.engine.adapters import check_lora_adapter
from localpers.engine.gguf_layout import GGUFLayout, gguf_layout
from localpers.errors import InputError, LocalpersError
from localpers.methods.card.cluster_assignment import read_centroids
from localpers.methods.card.head_spec import HeadConfig, check_head_file
from localpers.regular_files import read_regular_file
from localpers.users.history_prompt import PromptFormat


def backbone_shape(layout: GGUFLayout) -> tuple[int, int]:
    """`(n_layer, n_embd)` of a backbone, from its header's metadata or, failing that, its tensors."""
    values = layout.values
    n_layer = values.get(f"{layout.architecture}.block_count")
    n_embd = values.get(f"{layout.architecture}.embedding_length")
    if not isinstance(n_layer, int) or isinstance(n_layer, bool) or n_layer < 1:
        blocks = {tensor.name.split(".")[1] for tensor in layout.tensors if tensor.name.startswith("blk.")}
        n_layer = len(blocks)
    if not isinstance(n_embd, int) or isinstance(n_embd, bool) or n_embd < 1:
        embedding = layout.tensor("token_embd.weight")
        n_embd = embedding.shape[0] if embedding is not None else 0
    return n_layer, n_embd


def check_bundle_content(bundle: Bundle, backbone: Path | None) -> None:
    """Refuse a bundle whose content a device could not use with `backbone` (None: the checks that need no
    backbone). Raises `BundleProblem` (bad content from outside, exit code 2) with one line naming the file or
    field; the caller, which knows where the bundle came from, adds what to do (`advising`)."""
    layout = (
        gguf_layout(backbone) if backbone is not None else None
    )  # a bad backbone is not the bundle's fault
    try:
        _check(bundle, layout)
    except LocalpersError as exc:
        message = str(exc)
        if str(bundle.directory) not in message:  # a manifest field's error: say which manifest
            message = f"{bundle.directory / MANIFEST_NAME}: {message}"
        raise BundleProblem(message) from exc


# Raise it whenever `check_bundle_content` starts refusing something an earlier localpers let through: bundles
# pulled (and stamped) before are then read again once.
CHECK_REVISION = 1
CHECKED_STAMP = "content-checked.json"  # in bundles_root(): the installed bundle that last passed
STAMP_LIMIT = 64 << 10  # a stamp is a few hundred bytes


def check_bundle_before_use(bundle: Bundle, backbone: Path, *, given: bool) -> None:
    """Refuse, before any model loads, a bundle a command is about to use whose content does not fit `backbone`.

    `given`: the directory came from the command line (`--bundle DIR`), which no one may have signed: checked
    every time. The installed (pulled) bundle is checked on its first use and again only when it, its backbone or
    this check's revision changes: a bundle pulled by a localpers whose `pull` checked less is read once with
    today's rules. The embedded demo bundle is not read (0.3 s a start spent on the package's own files).
    """
    if given:
        with advising(repair_advice(bundle.directory)):
            check_bundle_content(bundle, backbone)
        return
    installed = installed_bundle_dir()
    if installed is None or installed.resolve() != bundle.directory.resolve() or passed_before(bundle):
        return
    try:
        check_bundle_content(bundle, backbone)
    except InputError as exc:
        raise InputError(
            f"{exc}; it was installed before localpers checked this: `localpers pull` a bundle that passes, or"
            f" delete {bundles_root() / CURRENT_LINK} to use the embedded demo bundle"
        ) from exc
    remember_passed(bundle)


def _stamp(bundle: Bundle) -> dict[str, object]:
    return {
        "revision": CHECK_REVISION,
        "manifest_sha256": sha256_of_file(bundle.directory / MANIFEST_NAME),
        "backbone_sha256": bundle.backbone_sha256,
    }


def passed_before(bundle: Bundle) -> bool:
    """Whether this bundle's manifest (hence its files) passed this revision of the check with its backbone."""
    # a FIFO or folder there reads as not passed (the check runs), never waited on
    with contextlib.suppress(LocalpersError, OSError, ValueError):
        path = bundles_root() / CHECKED_STAMP
        stamp = read_regular_file(path, STAMP_LIMIT, what="check stamp", stored=True)
        return bool(json.loads(stamp) == _stamp(bundle))
    return False


def remember_passed(bundle: Bundle) -> None:
    """Record that `bundle` passed `check_bundle_content` with its backbone (`pull` after its check, so that
    the first use does not read it again). A cache that cannot be written only means the check runs again."""
    with contextlib.suppress(LocalpersError):
        atomic_write_bytes(bundles_root() / CHECKED_STAMP, json.dumps(_stamp(bundle)).encode())


def _check(bundle: Bundle, layout: GGUFLayout | None) -> None:
    manifest = bundle.manifest
    PromptFormat.from_manifest(manifest.get("prompt"), where=str(bundle.directory / MANIFEST_NAME))
    clusters = None
    if "clusters" in manifest:
        clusters = bundle.k
        bundle.check_cluster_adapters()
        read_centroids(bundle.centroids_path, k=clusters)
    if layout is not None:
        for name in bundle.adapter_names:
            check_lora_adapter(bundle.adapter_path(name), layout)
    if "head" not in manifest:
        return
    config = HeadConfig.from_manifest(manifest["head"])
    n_embd = None
    if layout is not None:
        n_layer, n_embd = backbone_shape(layout)
        config.check_backbone(n_layer)
    check_head_file(bundle.head_path, config, n_embd=n_embd, clusters=clusters)
