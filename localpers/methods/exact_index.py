"""EXACT's per-user index: one attribute set per indexed input and task, the inputs' embeddings, and its file.

The index lives in the user's folder as one safetensors file (`exact-index.safetensors`: the embeddings
as a tensor, the entries and meta as JSON metadata), written atomically; `load` refuses a missing,
damaged or other-version file with a one-line error. `nearest` is the retrieval's cosine look-up (within one
task) and `frequencies` the profile's attribute counts. Building the index (greedy selection over the user's
pairs) and prompting with it are `localpers.methods.exact`; this module runs no model.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.atomic import atomic_write_bytes
from localpers.errors import InputError, LocalpersError
from localpers.methods.attributes import ATTRIBUTES
from localpers.methods.stored_files import EXACT_INDEX_FILE, refit_advice
from localpers.users.history import HistoryItem
from localpers.users.store import User

INDEX_FILE = EXACT_INDEX_FILE
INDEX_VERSION = 1


def refit_hint(user_name: str | None = None) -> str:
    """What to run to build the EXACT index again, e.g. "run `localpers fit --method exact --user ann`"."""
    return refit_advice("exact", user_name)


@dataclass
class IndexEntry:
    item_id: str
    task: str
    input: str
    attributes: list[str]
    margin: float
    base_margin: float

    @classmethod
    def of(
        cls, item: HistoryItem, attributes: Sequence[str], margin: float, base_margin: float
    ) -> IndexEntry:
        """The entry of a history item and what its search found (margins stored to 4 decimals)."""
        return cls(item.id, item.task, item.input, list(attributes), round(margin, 4), round(base_margin, 4))


@dataclass
class ExactIndex:
    """A user's EXACT memory: one attribute set per indexed input and task, and the inputs' embeddings."""

    entries: list[IndexEntry]
    embeddings: np.ndarray  # (n, dim) float32, L2-normalised, row i embeds entries[i].input
    meta: dict[str, Any]

    def save(self, path: Path) -> None:
        from safetensors.numpy import save

        payload = {
            "version": INDEX_VERSION,
            "meta": self.meta,
            "entries": [asdict(e) for e in self.entries],
        }
        data = save(
            {"embeddings": np.ascontiguousarray(self.embeddings, dtype=np.float32)},
            metadata={"exact": json.dumps(payload, ensure_ascii=False)},
        )
        atomic_write_bytes(path, data)

    @classmethod
    def load(cls, path: Path, user_name: str = "") -> ExactIndex:
        from safetensors import safe_open

        fix = refit_hint(user_name)
        if not path.is_file():
            who = f"user {user_name!r}" if user_name else str(path.parent)
            raise LocalpersError(f"{who} has no EXACT index: {fix}")
        try:
            with safe_open(str(path), framework="numpy") as handle:
                embeddings = handle.get_tensor("embeddings")
                payload = json.loads((handle.metadata() or {})["exact"])
            entries = [IndexEntry(**e) for e in payload["entries"]]
            meta = dict(payload["meta"])
            version = payload["version"]
        except OSError as exc:
            raise LocalpersError(f"{path}: cannot read ({exc.strerror}); {fix}") from None
        except Exception as exc:  # safetensors and json raise several types for a damaged file
            raise InputError(f"{path} is damaged ({type(exc).__name__}); {fix}") from None
        if version != INDEX_VERSION:
            raise LocalpersError(f"{path} has version {version}; {fix}")
        if embeddings.ndim != 2 or len(embeddings) != len(entries):
            raise InputError(
                f"{path} is damaged ({len(entries)} entries, {embeddings.shape} embeddings); {fix}"
            )
        problem = _damage(entries, meta, embeddings)
        if problem:
            raise InputError(f"{path} is damaged ({problem}); {fix}")
        return cls(entries, embeddings.astype(np.float32), meta)

    def keeping(self, item_ids: Set[str], successors: Mapping[int, IndexEntry] | None = None) -> ExactIndex:
        """This index without the entries of items not in `item_ids` (the history after a removal), except that
        the entry in row r of a removed item becomes `successors[r]` (another item of the same task and input), in place."""
        successors = successors or {}
        rows = [
            row for row, entry in enumerate(self.entries) if entry.item_id in item_ids or row in successors
        ]
        entries = [successors.get(row, self.entries[row]) for row in rows]
        embeddings = self.embeddings[rows] if rows else self.embeddings[:0]
        return ExactIndex(entries, embeddings, dict(self.meta))

    def nearest(self, query: np.ndarray, task: str | None = None) -> tuple[IndexEntry, float] | None:
        """The entry whose input embedding is closest (cosine) to `query`, among the entries of `task` when given;
        None when there is none."""
        rows = [row for row, entry in enumerate(self.entries) if task is None or entry.task == task]
        if not rows:
            return None
        similarities = self.embeddings[rows] @ np.asarray(query, dtype=np.float32)
        best = int(np.argmax(similarities))
        return self.entries[rows[best]], float(similarities[best])

    def frequencies(self) -> list[tuple[str, int]]:
        """How many indexed inputs use each attribute, most used first (ties: library order)."""
        counts = Counter(name for entry in self.entries for name in entry.attributes)
        order = {name: i for i, name in enumerate(self.meta.get("library", ATTRIBUTES))}
        return sorted(counts.items(), key=lambda kv: (-kv[1], order.get(kv[0], len(order))))


def index_path(user: User) -> Path:
    return user.dir / INDEX_FILE


def _damage(entries: Sequence[IndexEntry], meta: dict[str, Any], embeddings: np.ndarray) -> str | None:
    """What in a loaded index no fit writes, or None: the entries' fields go into prompts and the profile (a text
    outside the attribute library reached the prompt as the user's "style"), into set look-ups (a list as an item
    id blocked `history remove`) and arithmetic (a string cluster, another embedding width)."""
    from localpers.engine.encoder import ENCODER_DIM

    library = meta.get("library", ATTRIBUTES)
    if not isinstance(library, list | tuple) or not all(
        isinstance(name, str) and name in ATTRIBUTES for name in library
    ):
        return "field 'meta.library' names no attribute set of this localpers"
    cluster = meta.get("cluster")
    if cluster is not None and (not isinstance(cluster, int) or isinstance(cluster, bool) or cluster < 0):
        return "field 'meta.cluster' is not a cluster number"
    if embeddings.shape[1] != ENCODER_DIM or not np.all(np.isfinite(embeddings)):
        return f"the embeddings are not {ENCODER_DIM} finite numbers a row"
    known = set(library)
    for row, entry in enumerate(entries):
        texts = (entry.item_id, entry.task, entry.input)
        names = entry.attributes
        if not all(isinstance(text, str) for text in texts):
            return f"entry {row}: item_id, task and input must be text"
        if (
            not isinstance(names, list)
            or not all(isinstance(name, str) for name in names)
            or len(set(names)) != len(names)
            or not set(names) <= known
        ):
            return f"entry {row}: 'attributes' must be distinct names of the attribute library"
        for margin in (entry.margin, entry.base_margin):
            if not isinstance(margin, int | float) or isinstance(margin, bool) or not np.isfinite(margin):
                return f"entry {row}: a margin is not a finite number"
    return None


def load_index(user: User) -> ExactIndex:
    return ExactIndex.load(index_path(user), user.name)
