"""EXACT as a registry method: `fit` builds the user's attribute index, `rewrite` prompts with the nearest attributes.

Selection and the index are `localpers.methods.exact`, retrieval and the rewrite `localpers.methods.exact_rewrite`;
`ExactUserDecoder` holds one user's index.
"""

from __future__ import annotations

from typing import Any

from localpers.methods.base import (
    Fitted,
    Method,
    Progress,
    RewriteOptions,
    UserDecoder,
    gives_text_alone,
    note_cut_text,
)
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope_method import counted as _count
from localpers.methods.cope_method import storage_line
from localpers.methods.exact import ExactIndex, index_exact, index_path, load_index
from localpers.methods.exact_cache import SELECTIONS_FILE
from localpers.methods.exact_rewrite import Retrieval, check_bundle, rewrite_exact
from localpers.methods.reports import RewriteResult
from localpers.users.store import User


class ExactUserDecoder(UserDecoder):
    """One user's EXACT index, checked against the bundle, over the Personalizer's cluster adapter.

    It never `serves` a later request: the index is read afresh each time, so a refit shows at once.
    """

    def __init__(self, personalizer: Personalizer, user: User) -> None:
        self.personalizer = personalizer
        self.index: ExactIndex = load_index(user)
        check_bundle(self.index, personalizer, user.name)

    def rewrite_with_attributes(self, text: str, options: RewriteOptions) -> tuple[RewriteResult, Retrieval]:
        """The rewrite and the retrieved attributes it was prompted with."""
        return rewrite_exact(
            self.personalizer,
            self.index,
            text,
            task=options.task,
            max_tokens=options.max_tokens,
            on_text=options.on_text,
            sampling=options.sampling,
            stop=options.stop,
            alone_over=lambda room: gives_text_alone(text, options, room),
        )

    def rewrite(self, text: str, options: RewriteOptions) -> RewriteResult:
        return self.rewrite_with_attributes(text, options)[0]


class ExactMethod(Method):
    name = "exact"
    summary = "the style attributes of your closest earlier inputs of the same task, written into the prompt"
    own_decoder = True

    def fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None, progress: Progress | None
    ) -> Fitted:
        fitted = index_exact(personalizer, user, history_limit=history_limit, progress=progress)
        report = {
            "user": user.name,
            "method": "exact",
            **fitted.to_json(),
            "stored_bytes": self.stored_bytes(user),
        }
        reused = f", {report['n_reused']} searched by an earlier fit" if report["n_reused"] else ""
        left_out = report["n_filtered_negative_gain"]
        head = (
            f"user {user.name}: EXACT index of {_count(report['n_indexed'], 'input')} from"
            f" {_count(report['n_pairs'], 'pair')}{reused} (cluster {report['cluster']}, k={report['k']};"
            f" {_count(left_out, 'pair')} with negative gain left out)"
        )
        lines = [head, storage_line(report)]
        if report.get("n_too_long"):
            lines.append(
                f"{_count(report['n_too_long'], 'history item')} left out: too long for the model's context once"
                " tokenized, with an attribute line after it"
            )
        if not report.get("selections_cached", True):
            lines.append(
                f"note: {SELECTIONS_FILE} in the user's folder could not be written (a folder or FIFO where it goes,"
                " or a full disk): the next fit searches every pair again"
            )
        return Fitted(report, "\n".join(lines))

    def rewrite(
        self, personalizer: Personalizer, user: User | None, text: str, options: RewriteOptions
    ) -> dict[str, Any]:
        assert user is not None  # needs_user
        result, retrieval = self.open_decoder(personalizer, user).rewrite_with_attributes(text, options)
        note_cut_text(text, result, options)
        return {"user": user.name, **result.to_json(), "attributes": retrieval.to_json()}

    def open_decoder(self, personalizer: Personalizer, user: User) -> ExactUserDecoder:
        return ExactUserDecoder(personalizer, user)

    def stored_bytes(self, user: User) -> int:
        path = index_path(user)
        return path.stat().st_size if path.exists() else 0
