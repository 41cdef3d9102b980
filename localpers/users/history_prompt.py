"""History-conditioned prompts: the author's own earlier outputs shown in front of the task prompt.

    Headlines this author wrote before:
    - <least similar of the chosen examples>
    ...
    - <most similar>

    Generate a headline for the following article: <text>
    Headline:

The bundle's manifest says how many examples (`examples`) and how they were retrieved for training: the
items most similar to the new text (BM25 over each item's content + output, query = the new content), most
similar last, so the closest one sits next to the task. On the device all but the `CLOSEST_PER_TEXT` closest
are the user's most recent outputs instead (`recent`): that block is the same for every text the user
rewrites, so the engine keeps its keys and values and evaluates only the rest of the prompt (measured on
the train authors' dev split: no loss against all-similar, docs/RESULTS.md section 0f). When one of the outputs
closest to the text belongs to a series the user repeats (`localpers.users.series`), the device shows that
series' latest members in place of the closest one (`PromptFormat.series`, section 0zn). Only items of the same
task count; no such item gives the plain task prompt, so a user with no history gets exactly what a plain
adapter was trained on. The publisher builds its training prompts with the same functions (each item's
pool = the author's earlier items), and the device builds rewrite prompts through `history_index.prompt_for_user`: one
code path, so the two cannot drift apart.

A version-2 format may also describe its `described` closest examples: each is shown after the list as a
completed task prompt (the item's content, cut to `DEMONSTRATION_WORDS` words, and the user's output), one
blank line apart (measured no better on our data, docs/RESULTS.md section 0i; kept for other backbones).
`conditioned_prompt` is the one composition of recent, retrieved and described examples; `shown_examples` says
which items that composition shows and why (`rewrite --examples`, the TUI's Why view), so the two cannot disagree.

`PromptFormat` is what a bundle's manifest records (`"prompt": {...}`); a bundle without it uses plain
prompts. A user's retrieval index, derived from the history and cached next to it, is
`localpers.users.history_index.HistoryIndex`. This module loads no model and opens no connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localpers.errors import LocalpersError
from localpers.tasks import Task, cut_text
from localpers.users.history import item_id
from localpers.users.retrieval import Bm25Index, HistorySearch, best_positions
from localpers.users.series import MIN_SIZE as SERIES_MIN_SIZE
from localpers.users.series import SEARCH_DEPTH as SERIES_SEARCH_DEPTH
from localpers.users.series import SHOWN as SERIES_SHOWN
from localpers.users.series import about_series, find_series

FORMAT_NAME = "history-examples"
# Version 2 adds `described` (demonstrations). A bundle without demonstrations still says version 1, so a device
# with an older localpers keeps reading it.
SUPPORTED_VERSIONS = (1, 2)
# A demonstration's content is cut to this many words (descriptions in the shared data run 10-60).
DEMONSTRATION_WORDS = 60
# What keeps a conditioned prompt inside the context whatever the history holds (the shared data's
# headlines have at most 118 characters and its descriptions 267, so neither cut changes a prompt of
# theirs): a listed example is cut to EXAMPLE_CHARS, a demonstration's content (60 words of one long
# word each) to DEMONSTRATION_CHARS.
EXAMPLE_CHARS = 200
DEMONSTRATION_CHARS = 600
# Examples retrieved per text on the device; the others are the user's most recent outputs (`recent`).
CLOSEST_PER_TEXT = 1
_HEADERS = {"headline": "Headlines", "title": "Titles"}


@dataclass(frozen=True)
class PromptFormat:
    """How many past outputs a history-conditioned prompt shows, and how they are chosen."""

    examples: int = 5
    retrieval: str = "bm25"
    # Of the retrieved (closest) examples, the last this many are shown as demonstrations: the task prompt for the
    # item's content followed by the user's output, instead of the output alone.
    described: int = 0
    # Of the examples, this many are the user's most recent outputs (shown first) instead of retrieved ones. Not in
    # the manifest: the publisher trains with `--recent-examples` (default 0); the device always reads
    # `examples - CLOSEST_PER_TEXT` (`from_manifest`), whatever the bundle was trained with.
    recent: int = 0
    # When one of the outputs closest to the text belongs to a series of at least this many outputs
    # (`localpers.users.series`), the retrieved examples are that series' most recent members instead; 0 = never.
    # Not in the manifest either: the device always reads `series.MIN_SIZE`, the publisher trains with 0.
    series: int = 0

    @property
    def version(self) -> int:
        return 2 if self.described else 1

    def to_manifest(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "examples": self.examples,
            "retrieval": self.retrieval,
        }
        if self.described:
            entry["described"] = self.described
        return entry

    @classmethod
    def from_manifest(cls, entry: Any, where: str = "manifest.json") -> PromptFormat | None:
        """The bundle's prompt format; None (plain prompts) when the manifest has no `prompt` entry."""
        if entry is None:
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT_NAME:
            raise LocalpersError(f"{where}: field 'prompt' is not a {FORMAT_NAME!r} entry")
        version, examples = entry.get("version"), entry.get("examples")
        if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
            raise LocalpersError(
                f"{where}: prompt format version {version!r} is not supported (this localpers reads versions"
                f" {', '.join(map(str, SUPPORTED_VERSIONS))}; a newer localpers may read it)"
            )
        if not _whole(examples) or not 1 <= examples <= 20:
            raise LocalpersError(f"{where}: field 'prompt.examples' must be a whole number from 1 to 20")
        if entry.get("retrieval") != "bm25":
            raise LocalpersError(f"{where}: field 'prompt.retrieval' must be 'bm25'")
        described = entry.get("described", 0) if version >= 2 else 0
        if not _whole(described) or not 0 <= described <= examples:
            raise LocalpersError(
                f"{where}: field 'prompt.described' must be a whole number from 0 to prompt.examples"
            )
        closest = max(CLOSEST_PER_TEXT, described)
        return cls(
            examples=examples, described=described, recent=max(0, examples - closest), series=SERIES_MIN_SIZE
        )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def build_prompt(
    task: Task, text: str, examples: Sequence[str], demonstrations: Sequence[tuple[str, str]] = ()
) -> str:
    """The task prompt for `text`, with `examples` (least similar first) listed in front when there are any.

    `demonstrations` ((input, output) pairs) follow the list, each as a completed task prompt, one blank line apart.
    """
    parts = [_examples_block(task, examples)] if examples else []
    parts += [_demonstration(task, input_text, output) for input_text, output in demonstrations]
    if not parts:
        return task.prompt_for(text)
    return "\n".join(parts) + "\n" + task.prompt_for(text)


def _demonstration(task: Task, input_text: str, output: str) -> str:
    words = task.content(input_text).split()
    content = " ".join(words[:DEMONSTRATION_WORDS]) + (" ..." if len(words) > DEMONSTRATION_WORDS else "")
    return task.prompt_for(cut_text(content, DEMONSTRATION_CHARS)) + " " + _one_line(output) + "\n"


def conditioned_prompt(
    task: Task,
    text: str,
    pool: Sequence[tuple[str, str]],
    prompt_format: PromptFormat,
    index: HistorySearch | None = None,
    *,
    recent_end: int | None = None,
    word_sets: Sequence[frozenset[str]] | None = None,
) -> str:
    """The history-conditioned prompt for `text` from `pool` ((input, output) pairs, oldest first).

    The one composition the publisher's training prompts, the fit's pairs and `rewrite` all use: the format's
    recent outputs, then the retrieved ones (or a series' members, see `PromptFormat.series`), the last
    `described` retrieved items as demonstrations. `recent_end` takes the recent outputs from the items before
    that position instead of the pool's end (the fit shows several items the same, slightly older, block;
    `localpers.methods.card.pairs`). `word_sets` may carry `series.word_set` of every output of `pool`.
    """
    chosen = _compose(task, text, pool, prompt_format, index, recent_end, word_sets)
    return build_prompt(
        task, text, [pool[i][1] for i in chosen.listed], [pool[i] for i in chosen.demonstrated]
    )


def shown_examples(
    task: Task,
    text: str,
    pool: Sequence[tuple[str, str]],
    prompt_format: PromptFormat,
    index: HistorySearch | None = None,
    *,
    word_sets: Sequence[frozenset[str]] | None = None,
) -> list[ShownExample]:
    """The history items `conditioned_prompt` shows for `text`, in the prompt's order, each with why.

    The same composition as the prompt (`_compose`), so what a user is told was shown is what was shown.
    """
    chosen = _compose(task, text, pool, prompt_format, index, None, word_sets)
    retrieved_why = "series" if chosen.series else "closest"
    return [
        ShownExample(
            item_id(task.name, pool[i][0], pool[i][1]),
            pool[i][1],
            "recent" if i in chosen.recent else retrieved_why,
            described=i in chosen.demonstrated,
        )
        for i in chosen.listed + chosen.demonstrated
    ]


@dataclass(frozen=True)
class ShownExample:
    """One of the user's history items a conditioned prompt shows: its id, its output and why it is there.

    `why` is "recent" (one of the user's latest outputs, the block every prompt shares), "closest" (retrieved
    for this text) or "series" (a latest member of a series the user repeats, `localpers.users.series`);
    `described` says it is shown with its input, as a demonstration.
    """

    id: str
    output: str
    why: str
    described: bool = False

    def to_json(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"id": self.id, "output": self.output, "why": self.why}
        if self.described:
            payload["described"] = True
        return payload


@dataclass(frozen=True)
class _Composition:
    """Positions in the pool of the prompt's recent and retrieved examples; `series`: the latter are a series."""

    recent: list[int]
    retrieved: list[int]
    series: bool
    described: int

    @property
    def listed(self) -> list[int]:
        return self.recent + self.retrieved[: len(self.retrieved) - self.described]

    @property
    def demonstrated(self) -> list[int]:
        return self.retrieved[len(self.retrieved) - self.described :] if self.described else []


def _compose(
    task: Task,
    text: str,
    pool: Sequence[tuple[str, str]],
    prompt_format: PromptFormat,
    index: HistorySearch | None,
    recent_end: int | None,
    word_sets: Sequence[frozenset[str]] | None,
) -> _Composition:
    latest, retrieved, series = _choose(
        task,
        text,
        pool,
        prompt_format.examples,
        index,
        prompt_format.recent,
        recent_end,
        series_size=prompt_format.series,
        word_sets=word_sets,
    )
    return _Composition(latest, retrieved, series, min(prompt_format.described, len(retrieved)))


def shared_prefix(
    task: Task, pool: Sequence[tuple[str, str]], prompt_format: PromptFormat, recent_end: int | None = None
) -> str:
    """The text every `build_prompt` of this pool and format starts with: the header and the recent examples.

    Empty when the format shows no recent examples or the pool is empty. The final newline is left out: the
    tokenizer may join it with what follows (a blank line), and a shared prefix must tokenize the same alone.
    `recent_end` is `conditioned_prompt`'s.
    """
    end = len(pool) if recent_end is None else min(recent_end, len(pool))
    recent = min(prompt_format.recent, prompt_format.examples, end)
    if recent <= 0:
        return ""
    latest = [output for _, output in pool[end - recent : end]]
    return _examples_block(task, latest)[:-1]


def _examples_block(task: Task, examples: Sequence[str]) -> str:
    header = f"{_HEADERS.get(task.name, 'Texts')} this author wrote before:\n"
    return header + "".join(f"- {_one_line(example)}\n" for example in examples)


def _one_line(text: str) -> str:
    """An example as the prompt lists it: on one line, cut to EXAMPLE_CHARS (longer ones are rare)."""
    return cut_text(" ".join(text.split()), EXAMPLE_CHARS)


def searched_text(task: Task, text: str) -> str:
    """The part of a text retrieval reads: its content without the task's instruction, as far as a prompt carries
    it (`max_input_chars`). A 10 MB history item once cost every fit ~10 s of BM25 scoring over words no prompt
    shows; texts within the limit (every benchmark item) are read whole, as before."""
    return cut_text(task.content(text), task.max_input_chars)


def history_document(task: Task, input_text: str, output: str) -> str:
    """What the history index searches for one item: its input (`searched_text`), then its output."""
    return searched_text(task, input_text) + " " + output


def select_examples(
    task: Task,
    text: str,
    pool: Sequence[tuple[str, str]],
    count: int,
    index: HistorySearch | None = None,
    *,
    recent: int = 0,
) -> list[str]:
    """Outputs of the `count` items of `pool` ((input, output) pairs) most similar to `text`, most similar last.

    With `recent`, the last `recent` items of `pool` (the most recent, oldest first) open the list and the rest
    are the most similar among the others. `index` may be a prebuilt BM25 index over exactly `pool`'s documents;
    ties keep pool order.
    """
    latest, retrieved, _ = _choose(task, text, pool, count, index, recent)
    return [pool[i][1] for i in latest + retrieved]


def _choose(
    task: Task,
    text: str,
    pool: Sequence[tuple[str, str]],
    count: int,
    index: HistorySearch | None,
    recent: int,
    recent_end: int | None = None,
    *,
    series_size: int = 0,
    word_sets: Sequence[frozenset[str]] | None = None,
) -> tuple[list[int], list[int], bool]:
    """Positions in `pool` of the recent examples (oldest first) and the retrieved ones (most similar last), and
    whether the latter are a series' members.

    The recent examples are the last `recent` items before `recent_end` (default: the whole pool). With
    `series_size`, a series among the `series.SEARCH_DEPTH` closest items that share a word with the text
    replaces the retrieved ones by its `series.SHOWN` most recent members that the recent examples do not
    already show (oldest first), where the text is about it (`series.about_series`).
    """
    if not pool or count <= 0:
        return [], [], False
    end = len(pool) if recent_end is None else max(0, min(recent_end, len(pool)))
    recent = min(recent, count, end)
    latest = list(range(end - recent, end))
    index = index or Bm25Index([history_document(task, i, o) for i, o in pool])
    query = searched_text(task, text)
    scores = index.scores(query)
    ranked = best_positions(scores, max(count, SERIES_SEARCH_DEPTH if series_size else 0))
    if series_size:
        outputs = [output for _, output in pool]
        related = [i for i in ranked[:SERIES_SEARCH_DEPTH] if scores[i] > 0]  # not merely the history's end
        members = find_series(outputs, related, min_size=series_size, word_sets=word_sets)
        shown = [i for i in members if i not in latest][-SERIES_SHOWN:]
        documents = [history_document(task, *pool[i]) for i in members] if shown else []
        if shown and about_series(query, documents, len(pool)):
            return latest, shown, True
    best = [i for i in ranked if i not in latest][: count - recent]
    return latest, list(reversed(best)), False
