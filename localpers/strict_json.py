"""JSON text that strict parsers accept: a NaN or infinite float is written as null, never as the bare `NaN` or
`Infinity` that `json.dumps` writes by default (and browsers, `jq` and most languages refuse).

For everything localpers writes as JSON for others to read: `--json` output (`localpers.cli.common.print_json`)
and bundle manifests (`localpers.bundle.format.write_manifest`). It reads nothing and checks nothing else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (containers copied)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


def strict_json_text(
    payload: Any,
    *,
    indent: int | None = None,
    ensure_ascii: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """`payload` as strict JSON (see the module docstring); non-ASCII text kept as it is unless `ensure_ascii`."""
    return json.dumps(
        finite_or_null(payload), indent=indent, ensure_ascii=ensure_ascii, allow_nan=False, default=default
    )
