"""`cope` and `exact` in the benchmark (listed in `localpers.bench.registry`).

Both need per-user state on disk (CoPe's LoRA file, which llama.cpp loads from a path;
EXACT's index and cached negatives), so each keeps a user store of its own under `MethodStateRoot.resolve()`: set
`MethodStateRoot.path` to a folder of the benchmark's output, or a temporary folder is used and
removed at exit. Fit time is what the runner measures around `prepare` (training or indexing,
including EXACT's y- generation); stored bytes are the method's own files per user, the history
not counted. A user without history falls back to the global adapter, as `localpers rewrite` does.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from localpers.bench.methods import Method, MethodSpec, ParamValue, UserProfile
from localpers.bench.prompt_methods import history_index
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope import CopeState, fit_cope, stored_bytes
from localpers.methods.cope_decode import DEFAULT_ALPHA, DEFAULT_TAU, CopeDecoder, rewrite_cope
from localpers.methods.cope_train import SftConfig
from localpers.methods.exact import DEFAULT_K, ExactIndex, index_exact, index_path, load_index
from localpers.methods.exact_rewrite import rewrite_exact
from localpers.methods.reports import RewriteResult
from localpers.users.history_index import HistoryIndex
from localpers.users.store import User, UserStore


class MethodStateRoot:
    """Where the benchmark's CoPe/EXACT users live; None = a temporary folder removed at exit."""

    path: ClassVar[Path | None] = None
    _temporary: ClassVar[Path | None] = None

    @classmethod
    def resolve(cls) -> Path:
        if cls.path is not None:
            return Path(cls.path)
        if cls._temporary is None:
            cls._temporary = Path(tempfile.mkdtemp(prefix="localpers-bench-methods-"))
            atexit.register(shutil.rmtree, cls._temporary, ignore_errors=True)
        return cls._temporary


def _state_user(method: str, profile: UserProfile) -> User:
    """The method's own copy of the user, with exactly the profile's (possibly truncated) history."""
    store = UserStore(root=MethodStateRoot.resolve() / method / f"history-{len(profile.items)}")
    user = store.get(profile.name) if profile.name in store.list() else store.create(profile.name)
    if [item.id for item in user.history()] != [item.id for item in profile.items]:
        user.save_history(list(profile.items))
    return user


@dataclass
class _CopePrepared:
    state: CopeState
    decoder: CopeDecoder
    history: HistoryIndex  # used only by a fit trained on conditioned prompts (rewrite_cope decides)


class CopeBenchMethod(Method):
    name = "cope"
    device_method = "cope"
    description = (
        "per-user LoRA trained on the device + contrastive decoding against its base model"
        " (CoPe; the bundle's head.base)"
    )
    needs = "cluster"
    uses_history = True
    params = {"alpha": float, "tau": float, "rank": int}

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}
        self._open: CopeDecoder | None = None

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        return {"alpha": DEFAULT_ALPHA, "tau": DEFAULT_TAU, "rank": SftConfig().rank}

    def prepare(self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec) -> Any:
        if self._open is not None:  # one user at a time: free the previous user's two contexts
            self._open.close()
            self._open = None
        if not profile.items:
            return None
        user = _state_user("cope", profile)
        rank = int(spec.get("rank", SftConfig().rank) or SftConfig().rank)
        state = fit_cope(
            personalizer, user, config=SftConfig(rank=rank, alpha=2.0 * rank), cluster=profile.cluster
        )
        self._bytes[profile.name] = stored_bytes(user)
        self._open = CopeDecoder.for_user(personalizer, user, state)
        return _CopePrepared(state, self._open, history_index(profile))

    def generate(
        self, personalizer: Personalizer, profile: UserProfile, prepared: Any, text: str, spec: MethodSpec
    ) -> RewriteResult:
        if prepared is None:
            return self.global_rewrite(personalizer, text)
        alpha = spec.get("alpha", DEFAULT_ALPHA)
        tau = spec.get("tau", DEFAULT_TAU)
        return rewrite_cope(
            prepared.decoder,
            prepared.state,
            text,
            alpha=DEFAULT_ALPHA if alpha is None else float(alpha),
            tau=DEFAULT_TAU if tau is None else float(tau),
            history=prepared.history,
            prompt_format=personalizer.prompt_format,
        )

    def stored_bytes(self, profile: UserProfile) -> int:
        return self._bytes.get(profile.name, 0)


class ExactBenchMethod(Method):
    name = "exact"
    device_method = "exact"
    description = (
        "attributes of the nearest history input, selected greedily per history pair, in the prompt (EXACT)"
    )
    needs = "cluster"
    uses_history = True
    params = {"k": int, "pairs": int}
    default_pairs = 20  # the search scores ~124 prompts per pair: all 100 pairs of a user take ~5x longer

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        return {"k": DEFAULT_K, "pairs": self.default_pairs}

    def prepare(
        self, personalizer: Personalizer, profile: UserProfile, spec: MethodSpec
    ) -> ExactIndex | None:
        if not profile.items:
            return None
        user = _state_user("exact", profile)
        k = int(spec.get("k", DEFAULT_K) or DEFAULT_K)
        pairs = int(spec.get("pairs", self.default_pairs) or self.default_pairs)
        index_exact(personalizer, user, k=k, max_pairs=pairs, cluster=profile.cluster)
        self._bytes[profile.name] = index_path(user).stat().st_size
        return load_index(user)

    def generate(
        self, personalizer: Personalizer, profile: UserProfile, prepared: Any, text: str, spec: MethodSpec
    ) -> RewriteResult:
        if prepared is None:
            return self.global_rewrite(personalizer, text)
        result, _ = rewrite_exact(personalizer, prepared, text)
        return result

    def stored_bytes(self, profile: UserProfile) -> int:
        return self._bytes.get(profile.name, 0)
