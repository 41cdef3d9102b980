"""EXACT at inference: retrieve the attributes of the nearest indexed input of the task, and rewrite with them.

`retrieve` embeds the new input and takes the nearest input of the user's index (cosine) among the items of the
same task, as CARD's and CoPe's prompts take their history examples per task; `rewrite_exact`
generates with the cluster model on the prompt carrying that input's attribute line (`exact.attributed_prompt`).
`check_bundle` refuses an index made with another bundle or fit format. Building the index is
`localpers.methods.exact`; the index file is `localpers.methods.exact_index`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from localpers.engine.context_bound import tokens_within_context
from localpers.engine.decoding import SamplerSettings
from localpers.errors import LocalpersError
from localpers.methods.attributes import attribute_line
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.exact_index import ExactIndex, refit_hint
from localpers.methods.reports import RewriteResult
from localpers.methods.stored_files import fit_is_outdated
from localpers.tasks import get_task


@dataclass
class Retrieval:
    """The attributes retrieved for an input and where they came from."""

    attributes: list[str]
    similarity: float | None
    item_id: str | None
    matched_input: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def retrieve(index: ExactIndex, text: str, task: str = "headline") -> Retrieval:
    """The attribute set of the indexed input of `task` nearest to `text`; none when the index has no item of the
    task (attributes selected on another task's pair describe how the user writes that task, not this one)."""
    from localpers.engine.encoder import embed_texts

    found = index.nearest(embed_texts([get_task(task).content(text)])[0], task)
    if found is None:
        return Retrieval([], None, None, None)
    entry, similarity = found
    return Retrieval(list(entry.attributes), round(similarity, 4), entry.item_id, entry.input)


def check_bundle(index: ExactIndex, personalizer: Personalizer, user_name: str) -> None:
    """Refuse an index built with another bundle or by a localpers of another fit format (one without a mark was
    built before marks, format 1's), as CARD's and CoPe's fits are refused."""
    if index.meta.get("bundle_sha256") != personalizer.bundle_sha256:
        raise LocalpersError(
            f"user {user_name!r}'s EXACT index was built with another bundle; {refit_hint(user_name)}"
        )
    if fit_is_outdated(index.meta):
        raise LocalpersError(
            f"user {user_name!r}'s EXACT index was built by a localpers of another fit format, whose indexes this"
            f" one does not read; {refit_hint(user_name)}"
        )


def rewrite_exact(
    personalizer: Personalizer,
    index: ExactIndex,
    text: str,
    *,
    task: str = "headline",
    max_tokens: int | None = None,
    on_text: Callable[[str], None] | None = None,
    sampling: SamplerSettings | None = None,
    stop: Sequence[str] = (),
    alone_over: Callable[[int], bool] | None = None,
) -> tuple[RewriteResult, Retrieval]:
    """Generate with the cluster model on the prompt carrying the retrieved attribute line (`stop`: stop strings
    added to the task's).

    `alone_over(room)` says whether the text, with `room` characters kept for the attribute line, goes into the
    prompt whole with the line after it, bounded by the context only (`base.gives_text_alone`); otherwise a text
    over the task's limit less the line is refused or cut, as the task does.
    """
    started = time.perf_counter()
    retrieval = retrieve(index, text, task)
    retrieval_ms = 1000 * (time.perf_counter() - started)
    line = attribute_line(retrieval.attributes) if retrieval.attributes else ""
    alone = alone_over is not None and alone_over(len(line) + 1 if line else 0)
    prompt = None
    if alone:
        whole = get_task(task).content(text)
        prompt = tokens_within_context(personalizer.engine, f"{whole}\n{line}" if line else whole)
    cluster = index.meta.get("cluster")
    # the line is the prompt's note: a text too dense for the context is cut from its end, never the line
    result = personalizer.rewrite(
        text,
        note="" if alone else line,
        task=task,
        method="cluster",
        cluster=cluster,
        max_tokens=max_tokens,
        on_text=on_text,
        sampling=sampling,
        prompt=prompt,
        stop=stop,
    )
    # Retrieval (one encoder call) is part of EXACT's prompt cost.
    result = replace(
        result,
        method="exact",
        prompt_ms=round(result.prompt_ms + retrieval_ms, 2),
        total_ms=round(result.total_ms + retrieval_ms, 2),
    )
    return result, retrieval
