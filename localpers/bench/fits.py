"""The benchmark's per-user fits: one user store per history truncation and fit option, reused across runs.

`FitStore.profile` hands a method what it `needs`: nothing, the user's cluster, or the full CARD vector
fit (cluster, y-, pair features, lambda) made by `Personalizer.fit_user` in the benchmark's own user
store under `DIR/users/`, never the real one. A fit is redone only when its fingerprint (bundle, item
ids, fit options, BENCH_VERSION, and `configuration`: the CPU's kernels and the code that computes outputs)
changes; y- already generated for the same author in another folder under the same configuration are shared,
and a folder refitted under another configuration first drops its y- and pair caches (another CPU's greedy y-,
or an older code's, would have gone into the new fit). This module neither generates queries nor scores them
(see `runner`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_text
from localpers.bench.data import BenchUser
from localpers.bench.methods import Method, UserProfile
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT, DEFAULT_REGULARISATION
from localpers.methods.card.pair_cache import FEATURES_FILE, NEGATIVES_FILE
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import stored_token_bias, user_profile
from localpers.users.store import User, UserStore

# bump when a change invalidates cached results (4: calibrated habits; 5: recent examples in the prompt; 6: the
# headline task's word rule on by default)
BENCH_VERSION = 6


# what computes a method's outputs: a change here can change them, and a cached result must not outlive it
OUTPUT_CODE = (
    "methods",
    "engine",
    "users",
    "tasks.py",
    "bench/methods.py",
    "bench/card_methods.py",
    "bench/prompt_methods.py",
    "bench/extra_methods.py",
    "bench/runner.py",  # builds the cached record
    "bench/metrics.py",  # the ROUGE figures in it
    "bench/styles.py",  # a probe's transformed references
    "bench/data.py",  # the queries' text as read and normalised
    "bench/fits.py",  # the fits' options and fingerprints
)


def sha256_text(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@functools.cache
def code_sha256() -> str:
    """sha256 over the sources that compute outputs (`OUTPUT_CODE`): results and fits were reused after commits
    that changed what they compute, as long as nobody bumped BENCH_VERSION by hand."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for entry in OUTPUT_CODE:
        path = package / entry
        for source in sorted(path.rglob("*.py") if path.is_dir() else [path]):
            digest.update(
                source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes() + b"\0"
            )
    return digest.hexdigest()


def configuration(personalizer: Personalizer) -> str:
    """What a cached output depends on besides its inputs: the CPU's kernels and the code (`code_sha256`)."""
    return sha256_text([personalizer.engine.kernels, code_sha256()])


class FitStore:
    """Per-user fits of the benchmark, one user store per history truncation, reused across runs."""

    def __init__(self, root: Path, personalizer: Personalizer) -> None:
        self.root = root
        self.personalizer = personalizer
        self._clusters: dict[tuple[str, int | None], tuple[int | None, float]] = {}
        self._encoder_warm = False

    def _warm_encoder(self) -> None:
        """Load the sentence encoder once, so its start-up is not billed to the first user's fit."""
        if not self._encoder_warm:
            from localpers.engine.encoder import user_embedding

            user_embedding(["warm-up"])
            self._encoder_warm = True

    def _user(
        self, user: BenchUser, limit: int | None, regularisation: float | None, prior: float | None
    ) -> User:
        folder = f"history-{'all' if limit is None else limit}"
        if regularisation is not None:
            folder += f"-reg{regularisation:g}"
        if prior is not None:
            folder += f"-prior{prior:g}"
        store = UserStore(root=self.root / folder)
        name = user.store_name
        return store.get(name) if name in store.list() else store.create(name)

    def profile(
        self,
        user: BenchUser,
        limit: int | None,
        method: Method,
        on_stage: Callable[[str], None],
        regularisation: float | None = None,
        prior: float | None = None,
    ) -> UserProfile:
        items = user.history_up_to(limit) if method.uses_history else ()
        profile = UserProfile(name=user.store_name, items=items)
        if method.needs == "vector":
            self._vector_profile(user, limit, regularisation, prior, profile, on_stage)
        elif method.needs == "cluster":
            profile.cluster, profile.fit_seconds = self._cluster(user, limit, items)
            profile.cluster_bytes = _cluster_state_bytes(profile.cluster)
        return profile

    def _cluster(self, user: BenchUser, limit: int | None, items: tuple) -> tuple[int | None, float]:
        key = (user.store_name, limit)
        if key not in self._clusters:
            if not items:
                self._clusters[key] = (None, 0.0)
            else:
                self._warm_encoder()
                started = time.perf_counter()
                cluster, _ = self.personalizer.assign_cluster([item.output for item in items])
                self._clusters[key] = (cluster, time.perf_counter() - started)
        return self._clusters[key]

    def _share_negatives(self, stored: User, config: str) -> bool:
        """Seed a new fit folder with y- already generated for this user in the other folders whose fits were made
        under the same `configuration`.

        y- is the cluster model's greedy output, fixed by (bundle, cluster, item) in one fit format, and the
        file keys them by exactly that (its fit mark is the same in every folder of one run's code), so history
        truncations and regularisation variants need not regenerate them. Returns whether anything was shared (the fit time then excludes that generation).
        """
        target = stored.dir / NEGATIVES_FILE
        if target.exists():
            return False
        merged: dict[str, dict[str, str]] = {}
        for sibling in sorted(self.root.glob(f"*/users/{stored.name}/{NEGATIVES_FILE}")):
            try:
                state = json.loads((sibling.parent / "state.json").read_text(encoding="utf-8"))
                if (state.get("bench") or {}).get("configuration") != config:
                    continue
                known = json.loads(sibling.read_text(encoding="utf-8"))
            except (OSError, ValueError, AttributeError):  # a folder without a fit, or a damaged state
                continue
            if isinstance(known, dict):
                for key, negatives in known.items():
                    if isinstance(negatives, dict):
                        merged.setdefault(key, {}).update(negatives)
        if not merged:
            return False
        # the Personalizer reads one key (bundle:cluster) per file, so keep every key: it picks its own
        atomic_write_text(target, json.dumps(merged, ensure_ascii=False))
        return True

    def _vector_profile(
        self,
        user: BenchUser,
        limit: int | None,
        regularisation: float | None,
        prior: float | None,
        profile: UserProfile,
        on_stage: Callable[[str], None],
    ) -> None:
        stored = self._user(user, limit, regularisation, prior)
        items = list(profile.items)
        prior_weight = DEFAULT_PRIOR_WEIGHT if prior is None else prior
        config = configuration(self.personalizer)
        fingerprint = sha256_text(
            [
                BENCH_VERSION,
                self.personalizer.bundle_sha256,
                [item.id for item in items],
                regularisation,
                {"prior_weight": prior_weight},
                config,
            ]
        )
        state = stored.state()
        bench = state.get("bench") if isinstance(state.get("bench"), dict) else {}
        if bench.get("fingerprint") != fingerprint or not state.get("fit"):
            # caches made under another configuration (another CPU's kernels, older code; a fit from before the
            # configuration was recorded counts as one) go; an interrupted fit's under this one are its saved work
            if bench and bench.get("configuration") != config:
                for name in (NEGATIVES_FILE, FEATURES_FILE):
                    with contextlib.suppress(FileNotFoundError):
                        (stored.dir / name).unlink()
            # said before the fit starts: what it saves is this configuration's, to resume or to share
            stored.save_state({**state, "bench": {"configuration": config}})
            if [item.id for item in stored.history()] != [item.id for item in items]:
                stored.save_history(items)
            shared = self._share_negatives(stored, config)
            self._warm_encoder()

            def stage(name: str, done: int, total: int) -> None:
                on_stage(f"{name} {done}/{total}")

            self.personalizer.fit_user(
                stored,
                progress=stage,
                regularisation=DEFAULT_REGULARISATION if regularisation is None else regularisation,
                prior_weight=prior_weight,
            )
            vector_path = stored.vector_path()
            stored_bytes = stored.state_path.stat().st_size + (
                vector_path.stat().st_size if vector_path is not None else 0
            )
            stored.save_state(
                {
                    **stored.state(),
                    "bench": {
                        "fingerprint": fingerprint,
                        "configuration": config,
                        "stored_bytes": stored_bytes,
                        "shared_negatives": shared,
                    },
                }
            )
            state = stored.state()
        cluster, vector, state = user_profile(stored)
        report = state["fit"]
        profile.cluster = cluster
        profile.vector = vector
        profile.bias = stored_token_bias(stored, state)
        profile.choice = state.get("choice")
        profile.fit_seconds = float(sum(report.get("seconds", {}).values()))
        profile.vector_bytes = int(state["bench"]["stored_bytes"])
        profile.cluster_bytes = _cluster_state_bytes(cluster)
        profile.fit_report = {**report, "shared_negatives": bool(state["bench"].get("shared_negatives"))}


def _cluster_state_bytes(cluster: int | None) -> int:
    """What a cluster-only device keeps: the cluster id as a JSON state file (nothing for no cluster)."""
    return 0 if cluster is None else len(json.dumps({"cluster": cluster}).encode())
