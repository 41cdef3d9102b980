"""EXACT on the device: per-pair greedy attribute selection and the prompt-level index it builds.

Indexing (`index_exact`), for each preference pair of the user's history (`y+` = the user's output,
`y-` = CARD's base adapter's greedy output, shared with CARD's fit through `negatives.json`):

    F(A) = log p(y+ | x, A) - log p(y- | x, A)       under the cluster model
    greedy: A = {}; k times, add the attribute a maximising F(A + {a})         (EXACT Algorithm 1)

The greedy search itself (`greedy_select`, `Selection`) is `localpers.methods.exact_greedy`; this module builds
the prompts it scores, scores them and keeps what it finds.

The attribute set enters the prompt as a line after the input, `Attributes: <A1, A2, a>`, just before
the answer cue, so every candidate prompt of a greedy step shares the article and the attributes
already chosen; `SideBySideScorer` (`localpers.methods.scoring_batch`) evaluates those once in sequence 0 of the
KV cache and a step's candidates side by side in the engine's batched sequences, each only its name, `y+` and
`y-` (a pair's whole search one at a time, as `PrefixScorer` does, where a step of it does not fit a batched
sequence: the margins a pair's gain compares come from one path). Pairs whose selected set
does not beat the plain prompt (`F(A) < F({})`, the non-negative gain filter) are left out of the index, and an
input repeated within a task keeps its best set. What the search found for each pair is cached in the user's folder
(`localpers.methods.exact_cache`), so a refit searches only new pairs and a stopped fit goes on where it stopped.
The index (sentence-encoder embedding of each input -> attribute set) goes to the user's folder as
one safetensors file, written atomically (`localpers.methods.exact_index`, whose `ExactIndex`,
`IndexEntry`, `index_path` and `load_index` are importable from here too).

Inference (retrieving the nearest input's attributes, the rewrite) is `localpers.methods.exact_rewrite`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

from localpers import interrupts
from localpers.engine import Engine
from localpers.errors import LocalpersError
from localpers.methods.attributes import ATTRIBUTES, attribute_line
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.exact_cache import (
    SelectionRecord,
    read_selections,
    scored_digest,
    selections_key,
    write_selections,
)
from localpers.methods.exact_greedy import DEFAULT_K, NoFiniteMargin, PathChanged, Selection, greedy_select
from localpers.methods.exact_index import ExactIndex, IndexEntry, index_path
from localpers.methods.exact_index import load_index as load_index  # re-exported for the index's readers
from localpers.methods.scoring import PrefixScorer
from localpers.methods.scoring_batch import SideBySideScorer
from localpers.methods.stored_files import fit_mark
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.store import User, history_for

# How a search scores its candidates (the index's meta `search`, part of the selection cache's key): side by side
# in batched sequences picks otherwise than one at a time, since llama.cpp's numbers move with the batching. Each
# pair's search scores every margin one way (`PairMargins.many`): side by side where all its steps fit the batched
# sequences, else wholly one at a time; which one follows from the pair's texts and these settings, so the label
# names that rule, not the path a given pair took. (Plain "side-by-side" searches could mix the two in one pair.)
SEARCH = "side-by-side where a pair fits"

Progress = Callable[[str, int, int], None]


# --------------------------------------------------------------------------------------- prompts and scoring


def attributed_prompt(task: str, text: str, attributes: Sequence[str]) -> str:
    """The task's plain prompt for `text` with EXACT's attribute line after the text (none without attributes).

    The line is the prompt's note (`Task.prompt_for`): whole and on its own line, the text cut to leave it room,
    never joined into the text a task joins the lines of (paraphrase); a text too dense for the context at that
    length is cut shorter by the rewrite (`prompting.prompt_tokens`) and left out of a fit
    (`pairs_within_context`).
    """
    return get_task(task).prompt_for(text, attribute_line(attributes) if attributes else "")


def pairs_within_context(
    engine: Engine, items: Sequence[HistoryItem], library: Sequence[str], k: int
) -> tuple[list[HistoryItem], int]:
    """The items whose pairs a search can score within the engine's context, and how many were left out.

    Counted for each item: the longer of its plain prompt (y-'s and the base margin's; a cut text keeps more of
    itself there, which in a dense script can outweigh the line) and its prompt with the longest attribute line `k`
    of `library` can make, and the longer of its output and the y- the fit generates. A text the task's character
    limit lets in can still tokenize far too densely (CJK, emoji), and one such item stopped the whole fit.
    """
    longest = sorted(library, key=len)[-k:] if k > 0 else []
    kept = []
    for item in items:
        task = get_task(item.task)
        output = len(engine.tokenize(" " + task.scored_output(item.output), add_bos=False))
        prompt = max(
            len(engine.tokenize(attributed_prompt(item.task, item.input, shown))) for shown in ((), longest)
        )
        if prompt + max(output, task.default_max_tokens) <= engine.n_ctx:
            kept.append(item)
    return kept, len(items) - len(kept)


class PairMargins:
    """F(A) for one (x, y+, y-) on the engine's active adapter, through a shared `PrefixScorer`."""

    def __init__(self, scorer: PrefixScorer, item: HistoryItem, negative: str) -> None:
        engine = scorer.engine
        self.scorer = scorer
        self.item = item
        self.positive = engine.tokenize(" " + get_task(item.task).scored_output(item.output), add_bos=False)
        self.negative = engine.tokenize(" " + negative, add_bos=False)
        # the path every `many` of this pair takes (a `SideBySideScorer`'s): None until the first call decides it
        self.side_by_side: bool | None = None
        self._reported = 0  # scorings `many` reported to its `done`
        self._unreported = (
            0  # scorings of a search started over to leave unreported (they were reported once)
        )

    def __call__(self, attributes: tuple[str, ...]) -> float:
        prompt = attributed_prompt(self.item.task, self.item.input, attributes)
        plus, minus = self.scorer.score(self.scorer.engine.tokenize(prompt), [self.positive, self.negative])
        return plus - minus

    def many(self, sets: Sequence[tuple[str, ...]], done: Callable[[int], None] | None = None) -> list[float]:
        """F(A) for each set, through the scorer's `score_each` (side by side with a `SideBySideScorer`).

        Every call scores one way, the first call's: side by side if its prompts fit the batched sequences, else one
        at a time. A later call whose prompts do not fit (a cut text leaves a step less shared prefix than the first)
        turns the pair to one at a time and raises `PathChanged`, so `greedy_select` searches again; `done` then
        hears of each scoring once.
        """
        engine = self.scorer.engine
        prompts = [engine.tokenize(attributed_prompt(self.item.task, self.item.input, a)) for a in sets]
        continuations = [self.positive, self.negative]
        report = partial(self._report, done)
        if not isinstance(self.scorer, SideBySideScorer):
            scored = self.scorer.score_each(prompts, continuations, report)
        else:
            fits = self.scorer.fit(prompts, continuations)
            if self.side_by_side is None:
                self.side_by_side = fits
            elif self.side_by_side and not fits:
                self.side_by_side = False
                self._unreported, self._reported = self._reported, 0
                raise PathChanged
            scored = self.scorer.score_each(prompts, continuations, report, side_by_side=self.side_by_side)
        return [plus - minus for plus, minus in scored]

    def _report(self, done: Callable[[int], None] | None, count: int) -> None:
        again = min(count, self._unreported)
        self._unreported -= again
        self._reported += count - again
        if done is not None and count > again:
            done(count - again)


def index_key(task: str, text: str) -> tuple[str, str]:
    """An index entry's key: its task and what the index embeds of its input (retrieval keeps to one task, so an
    input given for two tasks is indexed once for each)."""
    return task, get_task(task).content(text)


def keep_for_index(
    selections: Sequence[tuple[HistoryItem, Selection]],
) -> tuple[dict[tuple[str, str], tuple[HistoryItem, Selection]], int, int]:
    """The pairs the index keeps, by task and input body (`index_key`): `(kept, n_negative_gain, n_duplicates)`.

    A pair whose attributes lower the margin below the plain prompt's is dropped (the non-negative
    gain filter), as is one whose margins are not finite numbers (non-finite logits; the index's loader refuses
    them); of several pairs of one task with the same input, the one with the largest margin stays.
    """
    best: dict[tuple[str, str], tuple[HistoryItem, Selection]] = {}
    filtered = duplicates = 0
    for item, selection in selections:
        if not (np.isfinite(selection.margin) and np.isfinite(selection.base_margin) and selection.gain >= 0):
            filtered += 1
            continue
        key = index_key(item.task, item.input)
        if key in best:
            duplicates += 1
            if best[key][1].margin >= selection.margin:
                continue
        best[key] = (item, selection)
    return best, filtered, duplicates


@dataclass
class ExactReport:
    """What `index_exact` did (stored in the index's meta and printed by the CLI)."""

    cluster: int | None
    adapter: str
    k: int
    n_items: int
    n_pairs: int
    n_reused: int  # pairs whose selection an earlier fit had made (`localpers.methods.exact_cache`)
    n_identical_skipped: int
    n_filtered_negative_gain: int
    n_duplicates_merged: int
    n_indexed: int
    margin_evaluations: int
    # Tokens of this fit's searches run through the model: each step's shared prompt prefix (what sequence 0 did not
    # hold yet) once, and each candidate's own prompt tokens, y+ and y- but their last tokens
    tokens_evaluated: int
    # What scoring each candidate's whole prompt, y+ and y- (but their last tokens) from an empty cache would run
    tokens_without_reuse: int
    mean_gain: float | None
    seconds: dict[str, float]
    selections_cached: bool = (
        True  # False when the selection cache could not be written (a folder or FIFO there)
    )
    n_too_long: int = (
        0  # items left out: with the longest attribute line their pair would not fit the context
    )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def index_exact(
    personalizer: Personalizer,
    user: User,
    *,
    k: int = DEFAULT_K,
    library: Sequence[str] = ATTRIBUTES,
    history_limit: int | None = None,
    max_pairs: int | None = None,
    cluster: int | None = None,
    progress: Progress | None = None,
) -> ExactReport:
    """Select attributes for every preference pair of `user` and store the index in their folder.

    `max_pairs` builds pairs from the most recent items only (each pair costs 1 + 42 + 41 + 40
    prompt scorings at k = 3; the cluster is still assigned from the whole history);
    `cluster` skips the cluster assignment when the caller already knows it. A pair searched by an earlier fit
    (same bundle, adapter, k, library and fit format; the same prompts, y+ and y-) keeps what that search found
    instead of being searched again; each new search is saved to the cache as soon as it ends. Items removed while
    the fit ran are neither indexed nor counted among the report's pairs and inputs. A stop (Ctrl-C) after a
    search could not be saved is marked (`interrupts.mark_unsaved`): the command does not say the searches are.
    """
    writes = _CacheWrites()
    with interrupts.marking_unsaved(lambda: writes.failed):
        return _index_exact(
            personalizer,
            user,
            k=k,
            library=library,
            history_limit=history_limit,
            max_pairs=max_pairs,
            cluster=cluster,
            progress=progress,
            writes=writes,
        )


@dataclass
class _CacheWrites:
    failed: bool = False  # a search could not be written to the selection cache


def _index_exact(
    personalizer: Personalizer,
    user: User,
    *,
    k: int,
    library: Sequence[str],
    history_limit: int | None,
    max_pairs: int | None,
    cluster: int | None,
    progress: Progress | None,
    writes: _CacheWrites,
) -> ExactReport:
    items = history_for(user, history_limit, "EXACT")
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    if cluster is None:
        cluster, _ = personalizer.assign_cluster([item.output for item in items])
    seconds["cluster"] = time.perf_counter() - started

    started = time.perf_counter()
    paired = items[-max_pairs:] if max_pairs is not None else items
    paired, too_long = pairs_within_context(personalizer.engine, paired, library, k)
    negatives = personalizer.pairs.cached_negatives(user, paired, cluster, progress)
    seconds["negatives"] = time.perf_counter() - started
    pairs = [(i, n) for i, n in zip(paired, negatives, strict=True) if n and n != i.output]

    started = time.perf_counter()
    adapter = personalizer.adapter_for("cluster", cluster)
    personalizer.engine.set_adapter(adapter)
    scorer = SideBySideScorer(personalizer.engine)
    key = selections_key(personalizer.bundle_sha256, adapter, k, library, fit_mark(), SEARCH)
    records = read_selections(user.dir, key, library, k)
    digests = {item.id: _scored_texts_digest(item, negative, library[:k]) for item, negative in pairs}
    found: dict[str, Selection] = {}
    for item, _ in pairs:
        record = records.get(item.id)
        if record is not None and record.scored == digests[item.id]:
            found[item.id] = Selection(record.attributes, record.margin, record.base_margin)
    reused = set(found)
    searched = [(item, negative) for item, negative in pairs if item.id not in found]
    # progress by prompt scoring, not by pair: a pair's search takes 30 s or more on 2 cores
    per_pair = 1 + sum(len(library) - step for step in range(min(k, len(library))))
    scorings = 0

    def counted(count: int) -> None:
        nonlocal scorings
        for _ in range(count):  # each scoring reported, as when they were made one at a time
            scorings += 1
            if progress:
                progress("attributes", scorings, per_pair * len(searched))

    for item, negative in searched:
        margins = PairMargins(scorer, item, negative)
        try:
            selection = greedy_select(library=library, k=k, margins=partial(margins.many, done=counted))
        except NoFiniteMargin as exc:
            raise LocalpersError(f"history item {item.id[:8]}: {exc}") from None
        found[item.id] = selection
        records[item.id] = SelectionRecord(
            digests[item.id], selection.attributes, selection.margin, selection.base_margin
        )
        # after each search, so a stopped fit keeps what it found; refused for a deleted user
        with user.locked():
            current = user.history_ids()  # an item removed while this fit ran stays removed
            kept = {item_id: r for item_id, r in records.items() if item_id in current}
            writes.failed |= not write_selections(user.dir, key, kept)
    selections = [(item, found[item.id]) for item, _ in pairs]
    evaluations = sum(selection.evaluations for _, selection in selections)
    seconds["selection"] = time.perf_counter() - started

    started = time.perf_counter()
    from localpers.engine.encoder import embed_texts

    # every input an index of these pairs could hold, embedded once however many tasks it was given for
    texts = list(dict.fromkeys(text for _, text in keep_for_index(selections)[0]))
    embedded = embed_texts(texts)
    seconds["embed"] = time.perf_counter() - started
    meta = {
        "fitted_by": fit_mark(),
        "bundle_sha256": personalizer.bundle_sha256,
        "cluster": cluster,
        "adapter": adapter,
        "k": k,
        "library": list(library),
        "search": SEARCH,
    }
    with user.locked():  # refuses a user deleted while the index was built
        current = user.history_ids()  # an item removed while this fit ran stays removed, and uncounted
        selections = [(item, selection) for item, selection in selections if item.id in current]
        best, filtered, duplicates = keep_for_index(selections)
        gains = [selection.gain for _, selection in selections if np.isfinite(selection.gain)]
        report = ExactReport(
            cluster=cluster,
            adapter=adapter,
            k=k,
            n_items=len(items),
            n_pairs=len(selections),
            n_reused=len(reused & current),
            n_identical_skipped=len(paired) - len(pairs),
            n_filtered_negative_gain=filtered,
            n_duplicates_merged=duplicates,
            n_indexed=len(best),
            margin_evaluations=evaluations,
            tokens_evaluated=scorer.evaluated_tokens,
            tokens_without_reuse=scorer.requested_tokens,
            mean_gain=round(float(np.mean(gains)), 4) if gains else None,
            seconds={name: round(value, 3) for name, value in seconds.items()},
            selections_cached=not writes.failed,
            n_too_long=too_long,
        )
        entries = [
            IndexEntry.of(item, sel.attributes, sel.margin, sel.base_margin) for item, sel in best.values()
        ]
        row_of = {text: row for row, text in enumerate(texts)}
        embeddings = embedded[[row_of[text] for _, text in best]]
        ExactIndex(entries, embeddings, {**meta, "report": report.to_json()}).save(index_path(user))
    return report


def _scored_texts_digest(item: HistoryItem, negative: str, probe: Sequence[str]) -> str:
    """The digest of what a pair's search scores: its prompt plain and with attributes (the task's wording, its
    cut and the attribute line's form), y+ as scored, and y-. A stored search is reused only for the same."""
    task = get_task(item.task)
    return scored_digest(
        [
            attributed_prompt(item.task, item.input, ()),
            attributed_prompt(item.task, item.input, probe),
            task.scored_output(item.output),
            negative,
        ]
    )
