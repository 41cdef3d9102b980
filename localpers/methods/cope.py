"""CoPe on the device: a per-user LoRA fitted from the history, and its stored state.

Fit (`fit_cope`): assign the user's cluster, train a LoRA on the history with the adapter CARD
corrects (the bundle's `head.base`: the user's cluster adapter or the global one) merged into the
backbone (`localpers.methods.cope_train`), and store it in the user's folder. With a
history-conditioned bundle the LoRA is trained and decoded on the prompt CARD's base adapter sees
(`prompt_for_user`: the user's recent and closest earlier outputs in front of the task; a training
item shows only the items written before it), and `cope.json` says so (`conditioned`); a fit stored
before that field existed decodes with the plain prompt it was trained on. The adapter goes to a new
content-addressed file `cope-<sha16>.gguf`, then `cope.json` (the commit point) is replaced to name
it, then stale adapters are removed, so an interrupted fit leaves the previous one usable.

`load_state` reads and checks what a fit stored. Decoding with it (the contrast between the user model and its
base, CoPe's formula) is `localpers.methods.cope_decode`; nothing here decodes or opens a network connection. The
optional DPO step of the paper is not implemented.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localpers.errors import InputError, LocalpersError
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope_train import SftConfig, train_user_lora, training_examples
from localpers.methods.lora_files import read_lora_gguf
from localpers.methods.stored_files import COPE_STATE_FILE, fit_mark, refit_advice
from localpers.strict_json import strict_json_text
from localpers.users.folder import read_json_object
from localpers.users.history import HistoryItem, history_digest
from localpers.users.store import User, atomic_write_text, history_for

STATE_FILE = COPE_STATE_FILE
ADAPTER_PREFIX = "cope-"
STATE_VERSION = 1


def _refit(user_name: str | None = None) -> str:
    return refit_advice("cope", user_name)


Progress = Callable[[str, int, int], None]


@dataclass
class CopeState:
    """What `cope.json` records about a user's CoPe fit."""

    bundle_sha256: str
    cluster: int | None
    base_adapter: str
    adapter_file: str
    adapter_sha256: str
    rank: int
    alpha: float
    n_items: int
    steps: int
    train_tokens: int
    final_loss: float | None
    precision: str
    seconds: dict[str, float] = field(default_factory=dict)
    version: int = STATE_VERSION
    conditioned: bool = False  # trained on the bundle's history-conditioned prompt (absent in older fits)
    # `history_digest` of the whole stored history it was trained from, and by which version (older fits: None)
    history_sha256: str | None = None
    fitted_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_state(user: User) -> CopeState:
    """The user's CoPe fit, checked against its adapter file; a one-line error when missing or damaged."""
    path = user.dir / STATE_FILE
    raw = read_json_object(path, _refit(user.name))  # a one-line error when unreadable or not a JSON object
    if raw is None:
        raise LocalpersError(f"user {user.name!r} has no CoPe adapter: {_refit(user.name)}")
    try:
        state = CopeState(**raw)
    except TypeError:
        raise InputError(f"{path} is damaged (unexpected fields); {_refit(user.name)}") from None
    wrong = _wrongly_typed(state)
    if wrong:
        raise InputError(f"{path} is damaged (field {wrong!r}); {_refit(user.name)}")
    if state.version != STATE_VERSION:
        raise LocalpersError(f"{path} has version {state.version}; {_refit(user.name)}")
    adapter = adapter_path(user, state)
    if not adapter.is_file():
        raise LocalpersError(f"{adapter} is missing although {STATE_FILE} names it; {_refit(user.name)}")
    if _sha256(adapter) != state.adapter_sha256:
        raise InputError(f"{adapter} does not match its sha256 in {STATE_FILE}; {_refit(user.name)}")
    return state


def _wrongly_typed(state: CopeState) -> str | None:
    """The first field of a `cope.json` that does not hold what a fit writes there, or None."""
    whole = ("rank", "n_items", "steps", "train_tokens", "version")
    for name in whole:
        value = getattr(state, name)
        if not isinstance(value, int) or isinstance(value, bool):
            return name
    for name in ("bundle_sha256", "base_adapter", "adapter_file", "adapter_sha256", "precision"):
        if not isinstance(getattr(state, name), str):
            return name
    if not isinstance(state.alpha, int | float) or isinstance(state.alpha, bool):
        return "alpha"
    if state.cluster is not None and (not isinstance(state.cluster, int) or isinstance(state.cluster, bool)):
        return "cluster"
    if not isinstance(state.seconds, dict) or not all(
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        for value in state.seconds.values()
    ):
        return "seconds"  # summed in the fit's summary: a text or null there ended `fit` in a traceback
    if not isinstance(state.conditioned, bool):
        return "conditioned"  # "no" or [1] was taken as true
    if state.rank < 1 or state.n_items < 0 or state.steps < 0:
        return "rank" if state.rank < 1 else ("n_items" if state.n_items < 0 else "steps")
    for name in ("history_sha256", "fitted_by"):
        if getattr(state, name) is not None and not isinstance(getattr(state, name), str):
            return name
    return None


def adapter_path(user: User, state: CopeState) -> Path:
    name = Path(state.adapter_file).name
    if name != state.adapter_file or not name.startswith(ADAPTER_PREFIX) or not name.endswith(".gguf"):
        raise InputError(f"{user.dir / STATE_FILE} is damaged (bad adapter_file); {_refit(user.name)}")
    return user.dir / name


def stored_bytes(user: User) -> int:
    """Bytes CoPe keeps for the user: its state file and its adapter."""
    files = [user.dir / STATE_FILE, *user.dir.glob(f"{ADAPTER_PREFIX}*.gguf")]
    return sum(p.stat().st_size for p in files if p.is_file())


def fit_cope(
    personalizer: Personalizer,
    user: User,
    *,
    config: SftConfig | None = None,
    base: str | None = None,
    history_limit: int | None = None,
    cluster: int | None = None,
    progress: Progress | None = None,
) -> CopeState:
    """Train the user's LoRA on their history and store it (atomically) in their folder.

    `base` ("cluster" or "global") overrides the bundle's choice of base adapter (`Personalizer.card_adapter`);
    `cluster` skips the cluster assignment when the caller already knows it.
    """
    config = config or SftConfig()
    if base not in (None, "cluster", "global"):
        raise LocalpersError(f"CoPe base must be 'cluster' or 'global', not {base!r}")
    history_sha256 = history_digest(user.history())  # what this fit is made from, read before it trains
    items = history_for(user, history_limit, "CoPe")
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    if cluster is None:
        cluster, _ = personalizer.assign_cluster([item.output for item in items])
    if base is None:
        base_adapter = personalizer.card_adapter(cluster)
    else:
        base_adapter = personalizer.adapter_for("cluster", cluster) if base == "cluster" else "global"
    seconds["cluster"] = time.perf_counter() - started

    prompt_format = personalizer.prompt_format
    examples = training_examples(personalizer.engine, items, config.max_seq_len, prompt_format)
    base_lora = read_lora_gguf(personalizer.bundle.adapter_path(base_adapter))
    result = train_user_lora(
        personalizer.backbone.path, examples, base_lora, config, _watching(user, progress)
    )
    seconds.update(result.seconds)

    started = time.perf_counter()
    from localpers.engine.adapters import write_lora_gguf

    with user.locked():  # refuses a user deleted while it trained: the folder is never made anew
        _refuse_removed_meanwhile(user, items)
        fresh = write_lora_gguf(
            user.dir / f".{ADAPTER_PREFIX}new.gguf",
            result.tensors,
            alpha=config.alpha,
            architecture=base_lora.architecture,
            name=f"cope-{user.name}",
            private=True,
        )
        sha = _sha256(fresh)
        final = user.dir / f"{ADAPTER_PREFIX}{sha[:16]}.gguf"
        os.replace(fresh, final)
        state = CopeState(
            bundle_sha256=personalizer.bundle_sha256,
            cluster=cluster,
            base_adapter=base_adapter,
            adapter_file=final.name,
            adapter_sha256=sha,
            rank=config.rank,
            alpha=config.alpha,
            n_items=len(items),
            steps=result.steps,
            train_tokens=result.tokens,
            final_loss=result.losses[-1] if result.losses else None,
            precision=result.precision,
            conditioned=prompt_format is not None,
            history_sha256=history_sha256,
            fitted_by=fit_mark(),
        )
        seconds["export"] = time.perf_counter() - started
        state.seconds = {k: round(v, 3) for k, v in seconds.items()}
        # NaN or inf (a loss after a bf16 overflow) written as null: state files are read without them
        atomic_write_text(user.dir / STATE_FILE, strict_json_text(state.to_json(), indent=2) + "\n")
        for stale in user.dir.glob(f"{ADAPTER_PREFIX}*.gguf"):
            if stale.name != final.name:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
    return state


def _watching(user: User, progress: Progress | None) -> Progress:
    """`progress`, and at each report a check that the user still exists: one deleted (or deleted and made anew)
    while its LoRA trains stops the training at once instead of at its end, as the final write would."""

    def report(stage: str, done: int, total: int) -> None:
        if not user.dir.is_dir():
            raise LocalpersError(f"user {user.name!r} no longer exists (deleted while this command ran)")
        if user.made_anew():
            raise LocalpersError(
                f"user {user.name!r} was deleted and made anew while this command ran; this fit of the old one"
                f" stopped and stores nothing in the new one ({refit_advice('cope', user.name)} to fit it)"
            )
        if progress:
            progress(stage, done, total)

    return report


def _refuse_removed_meanwhile(user: User, trained_on: Sequence[HistoryItem]) -> None:
    """Refuse to store a LoRA that learned from an item removed while it trained (`history remove` in another
    shell): the removal came first, so nothing made after it may carry the item. Items added meanwhile are fine
    (the stored history digest tells `user show` the fit is behind)."""
    current = user.history_ids()
    removed = sum(item.id not in current for item in trained_on)
    if removed:
        raise LocalpersError(
            f"{removed} of the items this CoPe fit learned from {'was' if removed == 1 else 'were'} removed from"
            f" user {user.name!r}'s history while it trained, so its LoRA is not stored (any earlier CoPe fit is"
            f" kept); {refit_advice('cope', user.name)} to learn from the history as it is now"
        )
