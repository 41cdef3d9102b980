"""What the endpoint does with a parsed request: pick the local user, run the method, stream the text.

`ApiBackend` holds one `Personalizer` (backbone + bundle) and the user store. `run` resolves the user
(the request's `user`, else the one in the model name, else the active user), refuses what cannot be
served (unknown or unfitted user, a method without its fit) with an `ApiError`, and generates under one
lock, because the engine serves one generation at a time. It is called from a worker thread; `on_text`
may raise to abandon the generation (a client that went away). It never logs request text and opens no
outgoing connection.

What a method needs is asked of the registry's `Method`, never of its name: methods that decode through the
Personalizer's adapters take the user's stored fit and a chat template; a method with its own decoder
(`own_decoder`) is served by the `UserDecoder` it opens, kept open while it `serves` the user. Both take the
request's stop strings and a transcript's turn openings, and a `free` text too long to carry beside the user's
examples alone, bounded by the context only.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localpers.api.requests import MODEL_PREFIX, ApiError, GenerationJob, server_stopping, shown_value
from localpers.engine.context_bound import tokens_within_context
from localpers.errors import LocalpersError, TextTooLong, UserBusy
from localpers.methods.base import (
    Method,
    RewriteOptions,
    UserDecoder,
    cut_text_note,
    given_alone_note,
    too_long_beside_examples,
)
from localpers.methods.card.choice import chosen_bias, stored_choice
from localpers.methods.card.decoding_runs import check_candidates
from localpers.methods.card.method import profile_for_rewrite
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.prompting import chat_transcript, transcript_stops
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.registry import get_method
from localpers.methods.reports import RewriteResult
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex
from localpers.users.store import User, UserStore

TextSink = Callable[[str], None]
QUEUE_POLL_SECONDS = 0.2  # how often a request waiting for the engine checks that its client is still there


@dataclass(frozen=True)
class Served:
    """A finished generation and who it was for."""

    result: RewriteResult
    user: str | None
    created: int
    # the remarks `localpers rewrite` prints as `note:` lines (a cut text, a fallback)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    """The method a request is served with and what it needs of the user (Nones: not personalized)."""

    method: str
    cluster: int | None = None
    vector: np.ndarray | None = None
    bias: TokenBias | None = None
    strength: float | None = None  # the vector strength the user's fit chose
    bias_strength: float | None = None  # the token bias strength the user's fit chose


class ApiBackend:
    """The device side of `localpers api`: one personalizer, the user store, one generation at a time."""

    def __init__(self, personalizer: Personalizer, store: UserStore | None = None) -> None:
        self.personalizer = personalizer
        self.store = store or UserStore()
        self._lock = threading.Lock()
        self._closing = False  # set by `close`: a request still waiting for the lock is refused, not run
        self._decoders: dict[str, UserDecoder] = {}  # the last decoder each own-decoder method opened

    def model_ids(self) -> list[str]:
        """`localpers` (the active user) and `localpers/<user>` for every local user."""
        return [MODEL_PREFIX, *(f"{MODEL_PREFIX}/{name}" for name in self.store.list())]

    def close(self, wait: float | None = None) -> bool:
        """Close the engine once no generation runs; with `wait`, give up after that many seconds and return
        False, leaving it open (a generation inside llama.cpp cannot be stopped, and closing under it crashes)."""
        self._closing = (
            True  # requests queued on the lock must not reach a closed engine, whoever gets it next
        )
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return False
        try:
            for decoder in self._decoders.values():
                decoder.close()
            self._decoders.clear()
            self.personalizer.close()
        finally:
            self._lock.release()
        return True

    # ------------------------------------------------------------------ users
    def resolve_user(self, name: str | None) -> User | None:
        """The named user, else the active one, else None (only the global method works then)."""
        if name is not None:
            if name not in self.store.list():
                raise ApiError(
                    404,
                    f"no local user {shown_value(name)}; see /v1/models",
                    param="user",
                    code="user_not_found",
                )
            return self.store.get(name)
        active = self.store.active_name()
        return self.store.get(active) if active else None

    def _profile(
        self, user: User | None, method: Method, history: HistoryIndex | None, notes: list[str]
    ) -> Profile:
        """What `method` needs of `user`; an unfitted or stale user is refused for CARD's methods.

        The fit is read by `profile_for_rewrite`, as `localpers rewrite` reads it but strictly: a client
        that asks for CARD gets it or an error, never a quiet fallback (a user fitted with no history and
        still without any gets the global adapter, as everywhere). For methods that use the fit's choice
        (`card`), its strengths apply, with the user's token bias.
        """
        if not method.needs_user or method.own_decoder:
            return Profile(method.name)
        if user is None:
            raise ApiError(
                400,
                f"no user: name one with `user` or `localpers/<user>` for method {method.name!r}",
                param="user",
            )
        try:  # the same reading of the user's fit as `localpers rewrite`
            found = profile_for_rewrite(user, method.name, self.personalizer, history, strict=True)
        except LocalpersError as exc:
            raise _damaged_user_data(exc, user) or ApiError(
                409, str(exc), param="user", code="user_not_fitted"
            ) from None
        if found.note:
            notes.append(found.note)
        uses_choice = method.uses_choice and found.method == method.name
        vector_strength, bias_strength, _ = (
            stored_choice(found.state, str(user.state_path), user.refit_advice)
            if uses_choice
            else (None, None, None)
        )
        bias = chosen_bias(found.state, found.bias) if uses_choice else found.bias
        return Profile(found.method, found.cluster, found.vector, bias, vector_strength, bias_strength)

    # ------------------------------------------------------------------ generation
    def run(self, job: GenerationJob, on_text: TextSink | None = None) -> Served:
        """Generate for `job` (blocking; call from a worker thread).

        While another request holds the engine, `on_text("")` is asked every `QUEUE_POLL_SECONDS` whether to go
        on waiting: a client that left while queued raises there, before its text is tokenized or evaluated.
        """
        while not self._lock.acquire(timeout=QUEUE_POLL_SECONDS):
            if on_text is not None:
                on_text("")
        try:
            if self._closing:
                raise server_stopping()
            if job.user_tag is not None and job.user_tag in self.store.list():
                raise ApiError(
                    400,
                    f"`user` {job.user_tag!r} and model {job.model!r} name different users; give one of them",
                    param="user",
                )
            try:
                user = self.resolve_user(job.user)
            except LocalpersError as exc:  # a damaged active.json: a 500 that said only "InputError" before
                raise _damaged_store(exc, self.store.root, "model" if job.user is None else "user") from None
            notes: list[str] = []
            try:
                result = self._generate(job, user, on_text, notes)
            except LocalpersError as exc:
                damaged = _damaged_user_data(exc, user)
                if damaged is not None:
                    raise damaged from None
                message = str(exc)
                param = _field_named(message)
                if param is None and isinstance(exc, TextTooLong):  # the text the client sent
                    param = "messages" if job.kind == "chat" else "prompt"
                raise ApiError(400 if exc.exit_code == 2 else 409, message, param=param) from None
            return Served(result, user.name if user else None, int(time.time()), tuple(notes))
        finally:
            self._lock.release()

    def _generate(
        self, job: GenerationJob, user: User | None, on_text: TextSink | None, notes: list[str]
    ) -> RewriteResult:
        chosen = get_method(job.method)
        if job.candidates > 1 and not job.sampling.greedy:
            raise ApiError(
                400,
                "`candidates` needs greedy decoding: drop `temperature` or set it to 0",
                param="candidates",
            )
        if job.candidates > 1 and chosen.own_decoder:
            raise ApiError(
                400,
                f"`candidates` needs a method that decodes on an adapter, not {chosen.name!r} (it runs its own"
                " decoder)",
                param="candidates",
            )
        try:  # what the candidates' own chains do not carry (a grammar, a logit bias, penalties)
            check_candidates(job.candidates, job.sampling)
        except LocalpersError as exc:
            raise ApiError(400, str(exc), param="candidates") from None
        task = job.task or "free"
        # the global adapter's plain prompt shows no history: a history it cannot read does not stop it
        history = user.history_index(get_task(task)) if user is not None and chosen.needs_user else None
        profile = self._profile(user, chosen, history, notes)
        method = profile.method
        personal = {
            "cluster": profile.cluster,
            "vector": profile.vector,
            "strength": profile.strength if job.strength is None else job.strength,
            "top_k": job.correction_top_k,
            "bias": profile.bias,
            "bias_strength": profile.bias_strength,
        }
        use_chat_prompt = job.kind == "chat" and job.task is None
        if use_chat_prompt and self.personalizer.engine.has_chat_template:
            if chosen.own_decoder:
                raise ApiError(400, f"method {method!r} needs a `task` in a chat request", param="task")
            return self.personalizer.rewrite(
                "",
                task="free",
                method=method,
                **personal,
                max_tokens=job.max_tokens,
                sampling=job.sampling,
                on_text=on_text,
                prompt=self.personalizer.chat_prompt_tokens(job.messages),
                stop=job.stop,
                candidates=job.candidates,
            )
        text = chat_transcript(job.messages) if use_chat_prompt else job.text
        assert text is not None
        stop = (*job.stop, *transcript_stops(job.messages)) if use_chat_prompt else job.stop
        # a one-line task's answer is stripped, and a reply after "Assistant:" starts with the space that followed
        # it: the streamed pieces lose their leading whitespace too
        strips_start = use_chat_prompt or get_task(task).one_line
        if strips_start:
            on_text = _without_leading_space(on_text)
        if chosen.own_decoder:
            if user is None:
                raise ApiError(
                    400,
                    f"no user: name one with `user` or `localpers/<user>` for method {method!r}",
                    param="user",
                )
            result = self._own_decoder(chosen, user, text, task, job, on_text, stop, notes)
        else:
            free = get_task("free")
            # A text longer than the free task's prompt carries with the user's examples (a long chat, a
            # document to continue) is given alone, as a chat template's prompt is: the context bounds it.
            alone = too_long_beside_examples(text, task)
            if alone and history is not None and history.pool:
                notes.append(given_alone_note())
            result = self.personalizer.rewrite(
                text,
                task=task,
                method=method,
                **personal,
                max_tokens=job.max_tokens,
                sampling=job.sampling,
                on_text=on_text,
                history=history,
                prompt=tokens_within_context(self.personalizer.engine, free.content(text)) if alone else None,
                stop=stop,
                candidates=job.candidates,
                show_examples=True,  # the answer's `localpers.examples`, as `rewrite --json` lists them
            )
        if strips_start:
            result = dataclasses.replace(result, text=result.text.lstrip())
        cut = cut_text_note(text, result)
        if cut is not None:
            notes.append(cut)
        return result

    def _own_decoder(
        self,
        method: Method,
        user: User,
        text: str,
        task: str,
        job: GenerationJob,
        on_text: TextSink | None,
        stop: tuple[str, ...],
        notes: list[str],
    ) -> RewriteResult:
        """Rewrite with the method's own decoder for `user`, reusing the open one while it serves them. A `free`
        text too long to carry beside the user's examples is given alone, as to the other methods."""
        decoder = self._decoders.get(method.name)
        if decoder is None or not _still_serves(decoder, user):
            if decoder is not None:
                self._decoders.pop(method.name).close()
            try:  # what it refuses is the user's fit (none for this method, another bundle's), as for CARD
                decoder = method.open_decoder(self.personalizer, user)
            except LocalpersError as exc:
                raise _damaged_user_data(exc, user) or ApiError(
                    409, str(exc), param="user", code="user_not_fitted"
                ) from None
            self._decoders[method.name] = decoder
        options = RewriteOptions(
            task=task,
            strength=job.strength,
            top_k=job.correction_top_k,
            max_tokens=job.max_tokens,
            sampling=job.sampling,
            on_text=on_text,
            stop=stop,
            note=notes.append,
            long_text_alone=True,
        )
        return decoder.rewrite(text, options)


def _without_leading_space(on_text: TextSink | None) -> TextSink | None:
    """`on_text` that drops the whitespace a reply opens with (its first pieces may be only that)."""
    if on_text is None:
        return None
    started = False

    def forward(piece: str) -> None:
        nonlocal started
        if not piece:  # no text: the sink is asked whether to go on
            on_text(piece)
            return
        if not started:
            piece = piece.lstrip()
            started = bool(piece)
        if piece:
            on_text(piece)

    return forward


# The engine's refusals of a request's own settings, by how their messages open: the field they are about.
_ENGINE_REFUSALS = {"the grammar": "grammar", "logit bias": "logit_bias"}


def _field_named(message: str) -> str | None:
    """The request field an engine refusal is about (OpenAI's `param`), None when it is about none."""
    return next((field for opening, field in _ENGINE_REFUSALS.items() if message.startswith(opening)), None)


def _damaged_store(exc: LocalpersError, root: Path, param: str) -> ApiError:
    """A 409 `user_data_damaged` for the store's own files (active.json) or a user's folder met while finding the
    user, naming them within the store, not by the server's path."""
    shown = str(exc).replace(str(root) + os.sep, "the user store's ")
    return ApiError(409, shown, param=param, code="user_data_damaged")


def _damaged_user_data(exc: LocalpersError, user: User | None) -> ApiError | None:
    """A 409 `user_data_damaged` for an error about a file in the user's folder (a damaged history or state: the
    request is fine, the server's data is not), naming the file within the folder, not the server's path to it;
    None for any other error."""
    if user is None or isinstance(exc, UserBusy):  # busy names the lock file: not damage
        return None
    message, folder = str(exc), str(user.dir)
    if folder not in message:
        return None
    shown = message.replace(folder + os.sep, f"user {user.name!r}'s ").replace(
        folder, f"user {user.name!r}'s folder"
    )
    return ApiError(409, shown, param="user", code="user_data_damaged")


def _still_serves(decoder: UserDecoder, user: User) -> bool:
    """Whether the open decoder still serves `user`; False when asking re-reads a fit that is gone or damaged, so
    the decoder is opened again and refuses it as for a first request (409 `user_not_fitted`, API audit s88)."""
    try:
        return decoder.serves(user)
    except LocalpersError:
        return False
