"""What the TUI needs from the device side, behind a small Protocol, and its real implementation.

`WritingService` is the whole surface the app uses for the slow, engine-bound work: loading the model,
rewriting a text and fitting a user. User folders are read and written through `service.store` (a real
`UserStore`) by `localpers.tui.userdata`. Pilot tests pass a fake service; `EngineService` wraps a
`Personalizer`. Neither is thread-safe: the app calls `load`, `rewrite`, `fit` and `ensure_demo_user`
from worker threads, one at a time (see `LocalpersApp.engine_lock`). This module draws nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from localpers.engine.decoding import SamplerSettings
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.registry import compared_methods
from localpers.users.history_index import HistoryIndex
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.methods.card.personalizer import Personalizer
    from localpers.methods.reports import FitReport, RewriteResult

Progress = Callable[[str, int, int], None]  # (stage, done, total), called from the worker thread
TextSink = Callable[[str], None]  # receives streamed text pieces, called from the worker thread


@dataclass(frozen=True)
class EngineInfo:
    """Facts about the loaded bundle that the controls need."""

    bundle_sha256: str
    bundle_label: str
    default_strength: float
    default_top_k: int
    methods: tuple[str, ...]  # offered in the method selector, in this order (the registry's compared ones)
    clusters: int | None = None  # the bundle's k: a stored cluster at or past it is a damaged state
    head_d: int | None = None  # the head's width: a stored vector of another length is damaged


@dataclass(frozen=True)
class RewriteRequest:
    """One generation: the text, the task, the method and (for CARD) the user's profile and knobs."""

    text: str
    task: str
    method: str
    cluster: int | None = None
    vector: np.ndarray | None = None
    strength: float | None = None
    top_k: int | None = None
    record_steps: bool = False
    history: HistoryIndex | None = None  # the user's examples, for bundles trained with history prompts
    bias: TokenBias | None = None  # the user's token bias (part of CARD's correction)
    bias_strength: float | None = None
    user: str | None = None  # whose history and correction these are (None: no user's)


class WritingService(Protocol):
    """The engine-bound operations of the TUI; every method may take seconds and runs off the UI thread."""

    store: UserStore

    def load(self) -> EngineInfo:
        """Load the model and bundle (slow, once); later calls return the same info."""
        ...

    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        """Generate for `request`, streaming pieces to `on_text`; an exception from `on_text` aborts it."""
        ...

    def fit(self, user: User, progress: Progress) -> FitReport:
        """Fit `user`'s cluster and vector from their history and store the result in their folder."""
        ...

    def ensure_demo_user(self, progress: Progress) -> User:
        """The shipped demo user, created and fitted when missing or stale."""
        ...

    def close(self) -> None:
        """Free the model; no other call may follow."""
        ...


class EngineService:
    """`WritingService` over a real `Personalizer`, opened lazily by `load()` from `opener`."""

    def __init__(
        self,
        opener: Callable[[], Personalizer],
        store: UserStore | None = None,
        *,
        sampling: SamplerSettings | None = None,
        candidates: int = 1,
    ) -> None:
        self.store = store or UserStore()
        self.sampling = sampling  # llama.cpp sampler settings for every rewrite (None: greedy)
        self.candidates = candidates  # > 1: every rewrite keeps the consensus of that many candidates
        self._opener = opener
        self._personalizer: Personalizer | None = None
        self._info: EngineInfo | None = None
        self._load_lock = threading.Lock()

    @property
    def personalizer(self) -> Personalizer:
        if self._personalizer is None:
            self.load()
        assert self._personalizer is not None
        return self._personalizer

    def load(self) -> EngineInfo:
        with self._load_lock:
            if self._info is None:
                personalizer = self._opener()
                self._personalizer = personalizer
                config = personalizer.head_config
                self._info = EngineInfo(
                    bundle_sha256=personalizer.bundle_sha256,
                    bundle_label=f"{personalizer.bundle.directory.name} (k={personalizer.bundle.k})",
                    default_strength=float(config.default_strength),
                    default_top_k=int(config.top_k),
                    methods=compared_methods(),
                    clusters=personalizer.bundle.k,
                    head_d=int(config.d),
                )
            return self._info

    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        return self.personalizer.rewrite(
            request.text,
            task=request.task,
            method=request.method,
            cluster=request.cluster,
            vector=request.vector,
            strength=request.strength,
            top_k=request.top_k,
            on_text=on_text,
            record_steps=request.record_steps,
            history=request.history,
            sampling=self.sampling,
            candidates=self.candidates,
            bias=request.bias,
            bias_strength=request.bias_strength,
            show_examples=request.history is not None,
        )

    def fit(self, user: User, progress: Progress) -> FitReport:
        with user.fitting():  # refused while another command fits this user
            return self.personalizer.fit_user(user, progress=progress)

    def ensure_demo_user(self, progress: Progress) -> User:
        from localpers.device.demo import ensure_demo_user

        user, _ = ensure_demo_user(self.personalizer, self.store, progress)
        return user

    def close(self) -> None:
        if self._personalizer is not None:
            self._personalizer.close()
            self._personalizer = None
