"""CARD's preference pairs on the device: y- (the base model's own output) and the pair features.

The base model is the adapter CARD corrects for the user (`Personalizer.card_adapter`: their cluster adapter, or
the global one where the bundle's `head.base` says so). For each history item, y+ is the user's output and y- the
base model's greedy output for the same prompt (conditioned on the items before it, as the publisher trained the
head; `fit_prompts` builds the prompts, in groups that share one block of recent outputs, so the batched pass
evaluates each block once). y- are deterministic for (bundle, cluster, prompt), so they are cached in the user's
folder; the pair features `g(y+) - g(y-)` (the head's sequence features, teacher-forced) are kept in memory for
the per-user choice's refit and cached beside them (both files: `pair_cache`, under the fit mark too, so a new
fit format or version of localpers makes them anew), so a refit after new items scores only the new pairs:
evaluating the prompts, not generating y-, is most of a fit's time. Both are written after each group of prompts
and once more when a fit is stopped (Ctrl-C), so the next fit goes on from there; a write that failed is
remembered (`cache_write_failed`), so the command does not say the work was kept. It also yields the base
model's log-probability of each y+'s first token (the opening habits' calibration). The batched pass is
`pair_batches`'; the keys and the in-memory memo are `pair_keys`'. It fits nothing and decides nothing:
`user_fit.fit_items` turns its output into a vector and a token bias.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from localpers.bundle.format import Bundle
from localpers.engine import Engine
from localpers.engine.generation import generate
from localpers.errors import LocalpersError
from localpers.methods.card import fit_prompts, pair_cache
from localpers.methods.card.head import CardHead
from localpers.methods.card.pair_batches import score_in_batches
from localpers.methods.card.pair_keys import PairMemo, distinct, negative_key
from localpers.methods.stored_files import fit_mark
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat
from localpers.users.ordinals import ordinals_of
from localpers.users.store import User

# The one-at-a-time loop (prompts the batched pass leaves to it) writes the caches after this many new y- or pairs,
# as the batched pass does after each group.
SAVE_EVERY = 16
# Pair features kept in memory, so the choice's refit on a user's earlier items reuses the fit's (same prompts).
PAIR_MEMO_SIZE = 4096

Progress = Callable[[str, int, int], None]  # (stage, done, total)


# no token of the vocabulary is longer: a cached y- past this many characters a token is no generation's
MAX_NEGATIVE_CHARACTERS_PER_TOKEN = 64


class PairBuilder:
    """y- generation (cached per user), pair features and first-token log-probabilities on one engine."""

    def __init__(
        self,
        engine: Engine,
        bundle: Bundle,
        bundle_sha256: str,
        head: CardHead,
        prompt_format: PromptFormat | None,
        base_adapter: Callable[[int | None], str],
    ) -> None:
        """`base_adapter(cluster)` names the adapter y- and the features come from (the base model)."""
        self.engine = engine
        self._base_adapter = base_adapter
        self.bundle = bundle
        self.bundle_sha256 = bundle_sha256
        self.head = head
        self.prompt_format = prompt_format
        # a cache write failed (or a stop cut the last one short) since `Personalizer.fit_user` reset it
        self.cache_write_failed = False
        self._pair_memo = PairMemo(PAIR_MEMO_SIZE)

    def _adapter(self, cluster: int | None) -> str:
        return self._base_adapter(cluster)

    def negatives(
        self, items: Sequence[HistoryItem], cluster: int, progress: Progress | None = None
    ) -> list[str]:
        """y- for each item: the base model's own greedy output for the same input."""
        self.engine.set_adapter(self._adapter(cluster))
        outputs = []
        for done, item in enumerate(items):
            outputs.append(self._generate_negative(item))
            if progress:
                progress("negatives", done + 1, len(items))
        return outputs

    def pair_differences(
        self,
        items: Sequence[HistoryItem],
        negatives: Sequence[str],
        cluster: int | None,
        progress: Progress | None = None,
    ) -> np.ndarray:
        """`g(y+) - g(y-)` per pair, teacher-forced through the base model, one pair at a time on plain prompts and
        cached nowhere; `(n, D)`. What the fit computes is `negatives_and_differences`: this is its independent
        check (the tests score held-out items with it)."""
        self.engine.set_adapter(self._adapter(cluster))
        rows = []
        for done, (item, negative) in enumerate(zip(items, negatives, strict=True)):
            rows.append(self._pair_difference(item, negative)[0])
            if progress:
                progress("features", done + 1, len(items))
        return np.asarray(rows, dtype=np.float32).reshape(-1, self.head.d)

    def items_within_context(self, items: Sequence[HistoryItem]) -> tuple[list[HistoryItem], int]:
        """The items whose pairs fit the engine's context, and how many were left out (`fit_prompts`)."""
        return fit_prompts.items_within_context(self.engine, items, self.prompt_format)

    def training_prompts_and_blocks(
        self, items: Sequence[HistoryItem], history_offset: int = 0, ordinals: Sequence[int] | None = None
    ) -> list[tuple[str, str]]:
        """Each item's prompt and the shared block of recent outputs it starts with (`fit_prompts`)."""
        return fit_prompts.prompts_and_blocks(items, self.prompt_format, history_offset, ordinals)

    def negatives_and_differences(
        self,
        user: User,
        items: Sequence[HistoryItem],
        cluster: int,
        progress: Progress | None,
        history_offset: int = 0,
    ) -> tuple[list[str], np.ndarray, list[float | None], dict[str, float]]:
        """y- per item (cached), `g(y+) - g(y-)` of the distinct pairs, and y+'s first-token log-probability.

        The log-probability is the base model's at every item's prompt, from the pair's scoring; where y- is y+
        itself or empty, only y+'s first token is scored (a zero difference is cached for it, never a row). The
        opening habits average it over all the items: leaving out those the model already writes as the user
        does would make a habit look rarer to the model than it is (and its bias too large).

        Generating y- and scoring the pair one item after the other lets the scoring reuse the prompt the
        generation just evaluated (the engine remembers its last prompt), so each article is run once.
        A conditioned prompt depends on the items before it, so its y- is cached under the prompt's hash too.
        """
        known = self._read_negatives(user, cluster)
        self.engine.set_adapter(self._adapter(cluster))
        seconds = {"negatives": 0.0, "features": 0.0}
        negatives: list[str] = []
        rows: list[np.ndarray] = []
        first_logprobs: list[float | None] = []
        # counted by the items' ordinals, so a removal keeps the other items' prompts and their cached pairs
        prompts_and_blocks = self.training_prompts_and_blocks(
            items, history_offset, ordinals_of(user.dir, items)
        )
        prompts = [prompt for prompt, _ in prompts_and_blocks]
        blocks = [block for _, block in prompts_and_blocks]
        self._drop_impossible_negatives(
            items, [negative_key(item, prompt) for item, prompt in zip(items, prompts, strict=True)], known
        )
        saved = _SavedPairs(len(known), self._read_features(user, cluster))
        reported = 0

        def report(done: int) -> None:  # the batched pass and the loop after it count the same items
            nonlocal reported
            if progress and done > reported:
                reported = done
                progress("pairs", done, len(items))

        def save() -> bool:
            return self._save_pairs(user, cluster, items, prompts, known, saved)

        for item, prompt in zip(items, prompts, strict=True):
            negative = known.get(negative_key(item, prompt))
            found = (
                saved.features.get(pair_cache.pair_hash(cluster, prompt, item.output, negative))
                if negative is not None
                else None
            )
            if found is not None:
                self._pair_memo.remember((cluster, prompt, item.output, negative), found)
        try:
            score_in_batches(
                self.engine,
                self.head,
                items,
                prompts,
                blocks,
                known,
                cluster,
                self._pair_memo,
                seconds,
                report,
                save,
            )
            unsaved = 0
            for done, (item, prompt) in enumerate(zip(items, prompts, strict=True)):
                key = negative_key(item, prompt)
                if key not in known:
                    started = time.perf_counter()
                    known[key] = self._generate_negative(item, prompt)
                    unsaved += 1
                    seconds["negatives"] += time.perf_counter() - started
                negative = known[key]
                negatives.append(negative)
                started = time.perf_counter()
                memo_key = (cluster, prompt, item.output, negative)
                if memo_key not in self._pair_memo:
                    self._pair_memo.remember(memo_key, self._pair_difference(item, negative, prompt))
                    unsaved += 1
                difference, first_logprob = self._pair_memo[memo_key]
                if distinct(item, negative):
                    rows.append(difference)
                first_logprobs.append(first_logprob)
                seconds["features"] += time.perf_counter() - started
                if unsaved >= SAVE_EVERY:
                    save()
                    unsaved = 0
                report(done + 1)
            save()
        except KeyboardInterrupt:
            # what was scored since the last group's save is saved too, so the next fit goes on from the stop;
            # until that save ends (a second Ctrl-C may cut it short) the work counts as unsaved
            failed_before, self.cache_write_failed = self.cache_write_failed, True
            try:
                written = save()
            except LocalpersError:  # the user deleted, made anew or locked by another command meanwhile
                written = False
            self.cache_write_failed = failed_before or not written
            raise
        differences = np.asarray(rows, dtype=np.float32).reshape(-1, self.head.d)
        return negatives, differences, first_logprobs, seconds

    def _drop_impossible_negatives(
        self, items: Sequence[HistoryItem], keys: Sequence[str], known: dict[str, str]
    ) -> None:
        """Drop from `known` a cached y- (under each item's key) longer than any generation of its task (a damaged
        cache): kept, it failed every fit ("text too long", blaming the history) and was never replaced; dropped,
        it is generated again. CARD's pairs and EXACT's (`cached_negatives`) both."""
        for item, key in zip(items, keys, strict=True):
            cached = known.get(key)
            if (
                cached
                and len(cached) > MAX_NEGATIVE_CHARACTERS_PER_TOKEN * get_task(item.task).default_max_tokens
            ):
                del known[key]
            elif cached:
                limit = get_task(item.task).default_max_tokens + 8
                if len(self.engine.tokenize(" " + cached, add_bos=False)) > limit:
                    del known[key]

    def _save_pairs(
        self,
        user: User,
        cluster: int,
        items: Sequence[HistoryItem],
        prompts: Sequence[str],
        known: dict[str, str],
        saved: _SavedPairs,
    ) -> bool:
        """Write the y- and pair features this fit has that the user's caches lack (none: nothing written); False
        when a cache could not be written (`cache_write_failed` says so from then on).

        Called after each group of prompts, at the end and when the fit is stopped, so a fit stopped midway
        (Ctrl-C, a closed laptop) keeps the work it did and the next fit starts from there.
        """
        written = True
        if len(known) > saved.negatives:
            used_keys = [negative_key(item, prompt) for item, prompt in zip(items, prompts, strict=True)]
            written &= self._write_negatives(user, cluster, known, used_keys)
            saved.negatives = len(known)
        used = {}
        for item, prompt in zip(items, prompts, strict=True):
            negative = known.get(negative_key(item, prompt))
            memo_key = (cluster, prompt, item.output, negative or "")
            if negative is not None and memo_key in self._pair_memo:
                used[pair_cache.pair_hash(cluster, prompt, item.output, negative)] = self._pair_memo[memo_key]
        if not set(used) <= set(saved.features):
            merged = {**used, **{k: v for k, v in saved.features.items() if k not in used}}
            written &= self._write_features(user, cluster, merged)
            saved.features = merged
        self.cache_write_failed |= not written
        return written

    def _generate_negative(self, item: HistoryItem, prompt: str | None = None) -> str:
        task = get_task(item.task)
        result = generate(
            self.engine,
            task.prompt_for(item.input) if prompt is None else prompt,
            max_tokens=task.default_max_tokens,
            stop=task.stop_strings,
        )
        return result.text.strip()

    def _pair_difference(
        self, item: HistoryItem, negative: str, prompt_text: str | None = None
    ) -> tuple[np.ndarray, float]:
        """`g(y+) - g(y-)` and the base model's log-probability of y+'s first token; where y- is y+ or empty, a
        zero difference and only that first token scored."""
        task = get_task(item.task)
        prompt = self.engine.tokenize(task.prompt_for(item.input) if prompt_text is None else prompt_text)
        positive_tokens = self.engine.tokenize(" " + task.scored_output(item.output), add_bos=False)
        if not distinct(item, negative):
            (first,) = self.engine.score(prompt, [positive_tokens[:1]], logprob_rows=1)
            return self._no_difference(), float(first.logprobs[0])
        negative_tokens = self.engine.tokenize(" " + negative, add_bos=False)
        plus, minus = self.engine.score(prompt, [positive_tokens, negative_tokens], logprob_rows=1)
        difference = self.head.sequence_feature(plus.tokens, plus.features) - self.head.sequence_feature(
            minus.tokens, minus.features
        )
        return difference, float(plus.logprobs[0])

    def _no_difference(self) -> np.ndarray:
        return np.zeros(self.head.d, dtype=np.float32)

    def cached_negatives(
        self, user: User, items: Sequence[HistoryItem], cluster: int, progress: Progress | None
    ) -> list[str]:
        """y- are deterministic for (bundle, cluster, item) in one fit format: keep them in the user's own
        folder."""
        known = self._read_negatives(user, cluster)
        self._drop_impossible_negatives(items, [item.id for item in items], known)
        missing = [item for item in items if item.id not in known]
        if missing:
            for item, negative in zip(missing, self.negatives(missing, cluster, progress), strict=True):
                known[item.id] = negative
            self._write_negatives(user, cluster, known, [item.id for item in items])
        return [known[item.id] for item in items]

    def _negatives_key(self, cluster: int) -> str:
        """The key of both caches: the bundle, the adapter y- came from and the fit mark (`fit_mark`: the version
        and the fit format, as EXACT's selection cache), so a fit after a FIT_FORMAT bump, or by another version,
        generates and scores anew instead of reading what the code before it computed."""
        return f"{self.bundle_sha256}:{self._adapter(cluster)}:{fit_mark()}"

    def _read_negatives(self, user: User, cluster: int) -> dict[str, str]:
        return pair_cache.read_negatives(user.dir, self._negatives_key(cluster))

    def _write_negatives(self, user: User, cluster: int, known: dict[str, str], used: Sequence[str]) -> bool:
        with user.locked():  # a user deleted meanwhile is refused by name, not by a missing folder
            current = user.history_ids()  # an item removed while this fit ran stays removed
            kept = {key: text for key, text in known.items() if pair_cache.item_of_key(key) in current}
            return pair_cache.write_negatives(user.dir, self._negatives_key(cluster), kept, used)

    def _read_features(self, user: User, cluster: int) -> pair_cache.PairFeatures:
        return pair_cache.read_features(user.dir, self._negatives_key(cluster), self.head.d)

    def _write_features(self, user: User, cluster: int, pairs: pair_cache.PairFeatures) -> bool:
        """This fit's pairs come first in `pairs`, so they are the ones a full cache keeps; False if unwritten."""
        with user.locked():
            return pair_cache.write_features(user.dir, self._negatives_key(cluster), self.head.d, pairs)


class _SavedPairs:
    """What the user's caches hold so far in this fit: how many y-, and the pair features by hash."""

    def __init__(self, negatives: int, features: pair_cache.PairFeatures) -> None:
        self.negatives = negatives
        self.features = features
