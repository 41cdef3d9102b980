"""EXACT as a registry method: `fit` builds the user's attribute index, `rewrite` prompts with the nearest attributes.

Selection, index and retrieval are `localpers.methods.exact`.
"""

from __future__ import annotations

from typing import Any

from localpers.methods.base import Fitted, Method, Progress, RewriteOptions
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope_method import storage_line
from localpers.methods.exact import check_bundle, index_exact, index_path, load_index, rewrite_exact
from localpers.users.store import User


class ExactMethod(Method):
    name = "exact"
    summary = "the style attributes of your closest earlier inputs, written into the prompt"

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
        head = (
            f"user {user.name}: EXACT index of {report['n_indexed']} inputs from {report['n_pairs']} pairs"
            f" (cluster {report['cluster']}, k={report['k']}; {report['n_filtered_negative_gain']} pairs with"
            f" negative gain left out)"
        )
        return Fitted(report, head + "\n" + storage_line(report))

    def rewrite(
        self, personalizer: Personalizer, user: User | None, text: str, options: RewriteOptions
    ) -> dict[str, Any]:
        assert user is not None  # needs_user
        index = load_index(user)
        check_bundle(index, personalizer, user.name)
        result, retrieval = rewrite_exact(
            personalizer,
            index,
            text,
            task=options.task,
            max_tokens=options.max_tokens,
            on_text=options.on_text,
            sampling=options.sampling,
        )
        return {"user": user.name, **result.to_json(), "attributes": retrieval.to_json()}

    def stored_bytes(self, user: User) -> int:
        path = index_path(user)
        return path.stat().st_size if path.exists() else 0
