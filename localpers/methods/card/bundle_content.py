"""What is inside a bundle, checked before anyone uses it: `pull` before it installs, `bundle verify` on request.

`localpers.bundle.format.verify_bundle` checks that a bundle's files are the ones its manifest lists (sizes,
sha256); a bundle that nobody signed (`pull --unsigned`, `--bundle DIR`) can list edited files with their new
hashes, and a signed one can carry a publisher's mistake. `check_bundle_content` reads each file the way the
device will and refuses, in one line naming the file or manifest field, what a fit or rewrite would refuse
later: a manifest `prompt` or `head` entry out of range, a cluster without an adapter, an adapter that does not
fit the backbone or holds non-finite weights, head tensors of the wrong shape or not finite, centroids that are
not `(k, 384)` finite numbers, tapped layers the backbone lacks. It reads headers and arrays only: it loads no
model and runs nothing from the bundle.
"""

from __future__ import annotations

from pathlib import Path

from localpers.bundle.format import MANIFEST_NAME, Bundle
from localpers.engine.adapters import check_lora_adapter
from localpers.engine.gguf_layout import GGUFLayout, gguf_layout
from localpers.errors import InputError, LocalpersError
from localpers.methods.card.cluster_assignment import read_centroids
from localpers.methods.card.head_spec import HeadConfig, check_head_file
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
    backbone). Raises `InputError` (bad content from outside, exit code 2) with one line naming the file or
    field."""
    layout = (
        gguf_layout(backbone) if backbone is not None else None
    )  # a bad backbone is not the bundle's fault
    try:
        _check(bundle, layout)
    except LocalpersError as exc:
        message = str(exc)
        if str(bundle.directory) not in message:  # a manifest field's error: say which manifest
            message = f"{bundle.directory / MANIFEST_NAME}: {message}"
        raise InputError(message) from exc


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
