"""Planning generations: the personalized panel's request (`personal_request`), what determines an output
(`request_key`), a small result cache, and `Run`s.

`personal_request` asks the method registry, never a method's name: the non-personalized reference is
`BASELINE_METHOD`, and a method the correction's strengths tune (`Listed.tuned`: CARD) gets the user's
vector, token bias, α and top-k and records its steps for the Why view.

A job is one or more `Run`s; a run is one generation that feeds one or both output panels (when the
personalized request falls back to the global adapter it is the same generation as the baseline).
Nothing here touches the engine or the screen.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from localpers.methods.card.method import unfitted_method
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.registry import BASELINE_METHOD, UNFITTED_METHOD, listed
from localpers.methods.reports import RewriteResult
from localpers.tui.service import RewriteRequest
from localpers.tui.userdata import Profile
from localpers.users.history_index import HistoryIndex

CACHE_SIZE = 64

Key = tuple[object, ...]


@dataclass(frozen=True)
class Run:
    """One generation of a job and the output panels ("baseline", "personal") it feeds."""

    key: Key
    request: RewriteRequest
    targets: tuple[str, ...]


def request_key(request: RewriteRequest) -> Key:
    """What determines a (greedy) output: identical keys give identical text.

    Besides the text and knobs that is the user and what of theirs the prompt and correction use: the
    history examples (a digest of the pool the prompt picks from, so a switch of user or a removed item
    misses), the vector, the token bias and its strength.
    """
    vector = None if request.vector is None else hashlib.sha1(request.vector.tobytes()).hexdigest()
    return (
        request.text,
        request.task,
        request.method,
        request.user,
        _history_digest(request.history),
        request.cluster,
        vector,
        request.strength,
        request.top_k,
        _bias_digest(request.bias),
        request.bias_strength,
    )


def _history_digest(history: HistoryIndex | None) -> str | None:
    if history is None:
        return None
    return hashlib.sha256(json.dumps(history.pool, ensure_ascii=False).encode("utf-8")).hexdigest()


def _bias_digest(bias: TokenBias | None) -> str | None:
    if bias is None:
        return None
    return hashlib.sha256(json.dumps(bias.to_json(), sort_keys=True).encode("utf-8")).hexdigest()


def result_status(result: RewriteResult, *, cached: bool = False) -> str:
    """The subtitle of a finished output, e.g. '9 tokens · 11.2 ms/token'."""
    status = f"{result.tokens} tokens · {result.ms_per_token:.1f} ms/token"
    if result.text_chars_read is not None:
        status += f" · read the first {result.text_chars_read:,} characters"
    return status + (" · cached" if cached else "")


class ResultCache:
    """The last `size` results by request key (least recently used dropped first)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._results: OrderedDict[Key, RewriteResult] = OrderedDict()

    def get(self, key: Key) -> RewriteResult | None:
        result = self._results.get(key)
        if result is not None:
            self._results.move_to_end(key)
        return result

    def put(self, key: Key, result: RewriteResult) -> None:
        self._results[key] = result
        self._results.move_to_end(key)
        while len(self._results) > self.size:
            self._results.popitem(last=False)

    def __len__(self) -> int:
        return len(self._results)


def plan_runs(
    requests: list[tuple[str, RewriteRequest]], cache: ResultCache, *, force: bool
) -> tuple[dict[str, RewriteResult], list[Run]]:
    """(cached results by target, runs still to generate); equal requests share one run.

    `requests` pairs each panel ("personal", "baseline") with what it should show; `force` ignores the cache.
    """
    cached: dict[str, RewriteResult] = {}
    runs: list[Run] = []
    for target, request in requests:
        key = request_key(request)
        hit = None if force else cache.get(key)
        if hit is not None:
            cached[target] = hit
            continue
        index = next((i for i, run in enumerate(runs) if run.key == key), None)
        if index is None:
            runs.append(Run(key, request, (target,)))
        else:
            runs[index] = Run(key, request, (*runs[index].targets, target))
    return cached, runs


def personal_request(
    text: str,
    task: str,
    method: str,
    profile: Profile | None,
    *,
    history: HistoryIndex | None,
    strength: float,
    top_k: int,
) -> tuple[RewriteRequest, str]:
    """The personalized panel's request for `method` and the panel title saying what it is.

    Without a user it is the baseline's request. Before the user's first fit (or a fit made before they had
    any history) CARD and the adapter with the user's history both get `UNFITTED_METHOD`, the user's history
    in the prompt without a correction, as `localpers rewrite` does; with no history either, the baseline's.
    `strength` and `top_k` (the steppers) apply only to a tuned method.
    """
    if method == BASELINE_METHOD:
        return RewriteRequest(text, task, BASELINE_METHOD), "Personalized · global (not personalized)"
    if profile is None:
        return RewriteRequest(text, task, BASELINE_METHOD), "Personalized · no user: global adapter"
    shows_history = history is not None and bool(history.pool)
    if not profile.can_personalize:
        fallback = unfitted_method(method, shows_history)
        if fallback == UNFITTED_METHOD and shows_history:
            label = f"Personalized · {listed(fallback).label}"
            if method != fallback:
                # the profile panel says ctrl+f fits; a stored fit is matched to the bundle once the model loaded
                checking = profile.fit is not None and profile.bundle_matches is None
                label += " · waiting for the model" if checking else " · not fitted"
            return RewriteRequest(text, task, fallback, history=history, user=profile.user), label
        why = "no history yet" if not shows_history else "no fitted profile yet"
        return RewriteRequest(text, task, BASELINE_METHOD), f"Personalized · {why}: global adapter"
    if not listed(method).tuned:
        request = RewriteRequest(
            text, task, method, cluster=profile.cluster, history=history, user=profile.user
        )
        return request, f"Personalized · {listed(method).label}"
    request = RewriteRequest(
        text,
        task,
        method,
        cluster=profile.cluster,
        vector=profile.vector,
        strength=strength,
        top_k=top_k,
        record_steps=True,
        history=history,
        bias=profile.bias,
        bias_strength=profile.bias_strength,
        user=profile.user,
    )
    chosen = " (the fit's choice)" if strength == profile.vector_strength else ""
    title = f"{listed(method).label} · cluster {profile.cluster} · α {strength:.2f}{chosen} · top-{top_k}"
    return request, f"Personalized · {title}"
