"""CoPe as a registry method: `fit` trains the user's LoRA on the device, `rewrite` decodes contrastively.

The training is `localpers.methods.cope_train`, the fit and its stored state `localpers.methods.cope`, the
contrastive decoder `localpers.methods.cope_decode`.
`CopeUserDecoder` keeps the user's two contexts open, so `localpers api` loads them once per fit.
"""

from __future__ import annotations

from typing import Any

from localpers.errors import LocalpersError
from localpers.methods.base import (
    Fitted,
    Method,
    Progress,
    RewriteOptions,
    UserDecoder,
    given_alone_note,
    gives_text_alone,
    note_cut_text,
)
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope import CopeState, fit_cope, load_state, stored_bytes
from localpers.methods.cope_decode import DEFAULT_ALPHA, CopeDecoder, rewrite_cope
from localpers.methods.reports import RewriteResult
from localpers.methods.stored_files import is_current_fit
from localpers.tasks import get_task
from localpers.users.history import history_digest
from localpers.users.store import User


class CopeUserDecoder(UserDecoder):
    """The user model and its base model for one user's CoPe fit (two llama.cpp contexts)."""

    def __init__(self, personalizer: Personalizer, user: User) -> None:
        self.user = user
        self.user_name = user.name
        self.prompt_format = personalizer.prompt_format
        self.state: CopeState = load_state(user)
        self.decoder = CopeDecoder.for_user(personalizer, user, self.state)

    def rewrite(self, text: str, options: RewriteOptions) -> RewriteResult:
        alone = gives_text_alone(text, options)
        history = self.user.history_index(get_task(options.task)) if self.state.conditioned else None
        if alone and history is not None and history.pool:
            options.note(given_alone_note())
        return rewrite_cope(
            self.decoder,
            self.state,
            text,
            task=options.task,
            alpha=DEFAULT_ALPHA if options.strength is None else options.strength,
            max_tokens=options.max_tokens,
            on_text=options.on_text,
            sampling=options.sampling,
            history=history,
            prompt_format=self.prompt_format,
            show_examples=True,
            stop=options.stop,
            alone=alone,
        )

    def serves(self, user: User) -> bool:
        """The same user with the same adapter (their stored state is read afresh, as a new decoder would)."""
        if user.name != self.user_name:
            return False
        state = load_state(user)
        if state.adapter_sha256 != self.state.adapter_sha256:
            return False
        self.state = state
        return True

    def close(self) -> None:
        self.decoder.close()


class CopeMethod(Method):
    name = "cope"
    summary = "a LoRA trained on your history here, decoded contrastively against its base adapter"
    own_decoder = True
    takes_strength = True  # its contrastive α

    def fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None, progress: Progress | None
    ) -> Fitted:
        return _fitted(user, fit_cope(personalizer, user, history_limit=history_limit, progress=progress))

    def current_fit(
        self, personalizer: Personalizer, user: User, *, history_limit: int | None
    ) -> Fitted | None:
        try:
            state = load_state(user)  # its adapter checked against its sha256
            history = user.history()
        except LocalpersError:
            return None  # none, or damaged: the fit makes a new one
        window = len(history) if history_limit is None else min(history_limit, len(history))
        if (
            not is_current_fit(state.fitted_by)
            or state.bundle_sha256 != personalizer.bundle_sha256
            or state.history_sha256 != history_digest(history)
            or state.n_items != window
        ):
            return None
        return _fitted(user, state)

    def rewrite(
        self, personalizer: Personalizer, user: User | None, text: str, options: RewriteOptions
    ) -> dict[str, Any]:
        assert user is not None  # needs_user
        decoder = self.open_decoder(personalizer, user)
        try:
            result = decoder.rewrite(text, options)
        finally:
            decoder.close()
        note_cut_text(text, result, options)
        return {"user": user.name, **result.to_json()}

    def open_decoder(self, personalizer: Personalizer, user: User) -> CopeUserDecoder:
        return CopeUserDecoder(personalizer, user)

    def stored_bytes(self, user: User) -> int:
        return stored_bytes(user)


def _fitted(user: User, state: CopeState) -> Fitted:
    """A CoPe fit's report (`fit --json`) and summary."""
    report = {"user": user.name, "method": "cope", **state.to_json(), "stored_bytes": stored_bytes(user)}
    head = (
        f"user {user.name}: CoPe LoRA (rank {report['rank']}) on {report['base_adapter']},"
        f" {'your history in the prompt' if state.conditioned else 'plain prompt'},"
        f" {counted(report['n_items'], 'item')}, {counted(report['steps'], 'step')}, final loss {report['final_loss']}"
    )
    return Fitted(report, head + "\n" + storage_line(report))


def counted(number: int, noun: str) -> str:
    """ "1 pair", "3 pairs" (the fit summaries of CoPe and EXACT)."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def storage_line(report: dict[str, Any]) -> str:
    """`N MB stored; fit took T s (stage s, ...)`: the cost line of a CoPe or EXACT fit."""
    total = sum(report["seconds"].values())
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in report["seconds"].items())
    return f"{report['stored_bytes'] / 1e6:.2f} MB stored; fit took {total:.1f} s ({timing})"
