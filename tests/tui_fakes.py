"""A fake `WritingService` for fast Pilot tests: deterministic text, real user folders, no model.

Outputs depend on the method, the user's vector and α, so tests can see a refit or a control change
reach the personalized output. `hold` (a threading.Event) pauses generation between streamed pieces;
`max_concurrent` records whether two engine calls ever overlapped.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from localpers.methods.registry import compared_methods
from localpers.methods.reports import CandidateShift, FitReport, RewriteResult, RewriteStep
from localpers.tui.service import EngineInfo, Progress, RewriteRequest, TextSink
from localpers.users.history import history_digest
from localpers.users.history_prompt import ShownExample
from localpers.users.store import User, UserStore

FAKE_SHA = "f" * 64


def fake_text(request: RewriteRequest) -> str:
    """global: 'Plain: first words'; cluster: 'Cluster 0: ...'; global-history: 'History: ...'; card: upper case
    tagged with α, k, vector."""
    words = request.text.split()[:5]
    if request.method == "global":
        return "Plain: " + " ".join(words)
    if request.method == "cluster":
        return f"Cluster {request.cluster}: " + " ".join(words).lower()
    if request.method == "global-history":
        return "History: " + " ".join(words).lower()
    weight = 0 if request.vector is None else int(request.vector[0])
    return " ".join(words).upper() + f" ! a{request.strength:.2f} k{request.top_k} v{weight}"


class FakeService:
    def __init__(self, store: UserStore | None = None, *, piece_delay: float = 0.0) -> None:
        self.store = store or UserStore()
        self.piece_delay = piece_delay
        self.hold: threading.Event | None = None
        self.rewrites: list[RewriteRequest] = []
        self.fits: list[str] = []
        self.closed = False
        self.fail_fit: str | None = None
        self.busy_fits = 0  # how many fits find the user held by another localpers command
        # the fit a user without items came with, returned unchanged as the real fit keeps one imported so
        self.kept_fit: FitReport | None = None
        self._active = 0
        self.max_concurrent = 0
        self._guard = threading.Lock()

    def _enter(self) -> None:
        with self._guard:
            self._active += 1
            self.max_concurrent = max(self.max_concurrent, self._active)

    def _leave(self) -> None:
        with self._guard:
            self._active -= 1

    def load(self) -> EngineInfo:
        return EngineInfo(FAKE_SHA, "fake-bundle (k=2)", 1.0, 10, compared_methods(), clusters=2)

    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        self._enter()
        try:
            self.rewrites.append(request)
            text = fake_text(request)
            pieces = [word + " " for word in text.split(" ")]
            for piece in pieces:
                if self.hold is not None:
                    self.hold.wait(timeout=10)
                if self.piece_delay:
                    time.sleep(self.piece_delay)
                on_text(piece)
            steps = fake_steps(pieces) if request.record_steps else []
            pool = request.history.pool if request.history is not None else []
            shown = [ShownExample(f"id{n}", output, "recent") for n, (_, output) in enumerate(pool[-2:])]
            return RewriteResult(
                text=text,
                method=request.method,
                task=request.task,
                cluster=request.cluster,
                adapter=request.method,
                strength=request.strength,
                top_k=request.top_k,
                tokens=len(pieces),
                prompt_ms=1.0,
                ms_per_token=10.0,
                total_ms=10.0 * len(pieces),
                steps=steps,
                examples=shown,
            )
        finally:
            self._leave()

    def fit(self, user: User, progress: Progress) -> FitReport:
        self._enter()
        try:
            self.fits.append(user.name)
            if self.busy_fits:
                from localpers.errors import UserBusy

                self.busy_fits -= 1
                raise UserBusy(f"user {user.name!r} is being fitted by another localpers command")
            if self.fail_fit:
                from localpers.errors import LocalpersError

                raise LocalpersError(self.fail_fit)
            items = user.history()
            if not items and self.kept_fit is not None:
                return dataclasses.replace(self.kept_fit, kept_without_history=True)  # as `fit_user` marks it
            for stage in ("negatives", "features"):
                for done in range(1, len(items) + 1):
                    progress(stage, done, len(items))
            mode = "vector" if len(items) >= 3 else ("too-few-pairs" if items else "cold-start")
            report = FitReport(
                mode=mode,
                cluster=0 if items else None,
                cluster_similarities=[0.61, 0.23] if items else [],
                n_items=len(items),
                n_pairs=len(items),
                n_identical_skipped=0,
                train_accuracy=1.0 if mode == "vector" else None,
                heldout_accuracy=0.8 if mode == "vector" else None,
                heldout_accuracy_default=0.5 if mode == "vector" else None,
                n_heldout=2 if mode == "vector" else 0,
                regularisation=1.0,
                vector_norm=float(len(items)),
                seconds={"cluster": 0.1, "negatives": 0.2, "features": 0.3, "fit": 0.01},
                bundle_sha256=FAKE_SHA,
                history_sha256=history_digest(items),  # as the real fit records
            )
            state = {"cluster": report.cluster, "bundle_sha256": FAKE_SHA, "fit": report.to_json()}
            vector = np.full(4, len(items), dtype=np.float32) if items else None
            user.save_fit(vector, state)
            return report
        finally:
            self._leave()

    def ensure_demo_user(self, progress: Progress) -> User:
        from localpers.users.history import demo_history_path
        from localpers.users.history_import import parse_history_file

        demo = self.store.get("demo") if "demo" in self.store.list() else self.store.create("demo")
        if not demo.history():
            demo.save_history(parse_history_file(demo_history_path()))
        self.fit(demo, progress)
        return demo

    def close(self) -> None:
        self.closed = True


def fake_steps(pieces: list[str]) -> list[RewriteStep]:
    """One step per piece: alternating pushes, the third token's choice changed by the correction."""
    steps = []
    for index, piece in enumerate(pieces):
        correction = (index % 3 - 1) * 0.5 * (index + 1)
        other = CandidateShift(1000 + index, "other", 5.0, 5.0 - correction / 2)
        chosen = CandidateShift(
            index, piece, 4.0 if index == 2 else 6.0, (4.0 if index == 2 else 6.0) + correction
        )
        candidates = sorted([chosen, other], key=lambda c: -c.after)
        steps.append(RewriteStep(index, piece, correction, candidates))
    return steps
