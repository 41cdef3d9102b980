"""OpenAI request bodies -> what localpers should generate: parsing and validation, nothing else.

`parse_completion` and `parse_chat` check the fields of `/v1/completions` and `/v1/chat/completions`
bodies and return a `GenerationJob`; anything wrong is an `ApiError` (HTTP status + OpenAI-style error
object) naming the field, never an exception with a traceback. Fields OpenAI defines but localpers cannot
honour (`n` > 1, `logprobs`, `echo`, tools, ...) are refused by name; unknown fields are ignored, as OpenAI
clients send many. Extensions: `task`, `method`, `strength`, `correction_top_k`, `top_k`, `min_p`, `repeat_penalty`,
`grammar`.
This module neither resolves users nor generates.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from localpers.engine import CONTEXT_TOKENS
from localpers.engine.decoding import SamplerSettings
from localpers.errors import LocalpersError
from localpers.methods.bounds import MAX_STRENGTH, MAX_TOP_K
from localpers.methods.consensus import MAX_CANDIDATES
from localpers.methods.registry import DEFAULT_METHOD, method_names, methods_taking
from localpers.tasks import TASKS
from localpers.untrusted import one_line

MODEL_PREFIX = "localpers"
METHODS = method_names()  # what `method` may name: the registry's methods
MAX_TOKENS_LIMIT = CONTEXT_TOKENS  # the prompt and the output share the context
MAX_STOP_STRINGS = 4
_TOKEN_ID = re.compile(
    r"[0-9]{1,10}"
)  # a `logit_bias` key; past the vocabulary it is refused where that is known
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An error the client caused (or a refusal), as an HTTP status and an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def server_stopping() -> ApiError:
    """The 503 for a request the stopping server will not serve (cancelled, or still queued for the engine)."""
    return ApiError(503, "localpers api is stopping; try again when it is back")


@dataclass(frozen=True)
class GenerationJob:
    """One generation asked for by a request, before the user is resolved."""

    kind: str  # "completion" or "chat"
    model: str
    user: str | None  # the local user named by the model name or by `user`; None = the active user
    # a `user` beside a model that names another user: OpenAI's end-user tag, unless it names a local user
    user_tag: str | None
    text: str | None  # completion prompt, or the last user message of a chat with a task
    messages: tuple[tuple[str, str], ...]  # chat only
    task: str | None  # None: completions use "free", chats use the chat prompt
    method: str
    strength: float | None
    correction_top_k: int | None  # CARD's k (`rewrite --top-k`); None: the bundle's
    max_tokens: int | None
    stop: tuple[str, ...]
    sampling: SamplerSettings
    candidates: int  # > 1: outputs decoded side by side, the consensus one returned (greedy adapter methods)
    stream: bool
    include_usage: bool


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def shown_value(value: object) -> str:
    """A client's value as a refusal quotes it: its repr, on one line, at most 80 characters (a 1 MB `task` came back
    whole in its 400)."""
    return one_line(repr(value), limit=80)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise _bad(f"`{name}` must be a number", name)
    if not low <= value <= high:  # compared before float(): an integer past float's range is refused here
        raise _bad(f"`{name}` must be between {low} and {high}, got {shown_value(value)}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"`{name}` must be an integer", name)
    if not low <= value <= high:
        raise _bad(f"`{name}` must be between {low} and {high}, got {shown_value(value)}", name)
    return value


def _string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"`{name}` must be a non-empty string", name)
    return value


def user_from_model(model: str) -> str | None:
    """`localpers` -> None (the active user); `localpers/<user>` -> that user; anything else is refused."""
    if model == MODEL_PREFIX:
        return None
    prefix = MODEL_PREFIX + "/"
    if model.startswith(prefix) and len(model) > len(prefix) and "/" not in model[len(prefix) :]:
        return model[len(prefix) :]
    raise ApiError(
        404,
        f"model {shown_value(model)} does not exist: use `localpers` (the active user) or `localpers/<user>`; see /v1/models",
        param="model",
        code="model_not_found",
    )


def _common(body: dict[str, Any], kind: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("`model` is required: `localpers` or `localpers/<user>`", "model")
    model_user = user_from_model(model)  # the model name is checked even when `user` names the user
    user_field = _string(body, "user")
    user = model_user or user_field
    # With the user in the model name, a different `user` may be OpenAI's end-user tag, which some clients
    # always send: the backend refuses it only where it names another local user.
    user_tag = user_field if model_user is not None and user_field not in (None, model_user) else None
    if _integer(body, "n", 1, 1_000_000) not in (None, 1):  # an integer first: `true == 1` in Python
        raise _bad("only `n` = 1 is supported", "n")
    for unsupported in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "functions"):
        value = body.get(unsupported)
        # 0 asks for nothing, except a completion's `logprobs: 0` (the chosen tokens' log-probabilities)
        asks_nothing = value is None or value is False or (value == 0 and unsupported != "logprobs")
        if not asks_nothing:
            raise _bad(f"`{unsupported}` is not supported by localpers", unsupported)
    if _integer(body, "best_of", 1, 1_000_000) not in (None, 1):
        raise _bad("only `best_of` = 1 is supported", "best_of")
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice != "none" and tool_choice != "auto":
        # "required" or a named function asks for a tool call, which this server never makes
        raise _bad("`tool_choice` other than `none` or `auto` is not supported by localpers", "tool_choice")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        raise _bad(
            'only `response_format` {"type": "text"} is supported; use `grammar` (GBNF) for structure',
            "response_format",
        )
    task = _string(body, "task")
    if task is not None and task not in TASKS:
        raise _bad(f"unknown task {shown_value(task)}; choose one of: {', '.join(TASKS)}", "task")
    method = _string(body, "method") or DEFAULT_METHOD
    if method not in METHODS:
        raise _bad(f"unknown method {shown_value(method)}; choose one of: {', '.join(METHODS)}", "method")
    if body.get("strength") is not None and method not in methods_taking("strength"):
        takers = ", ".join(methods_taking("strength"))
        raise _bad(f"`strength` applies to {takers}, not to method {method!r}; drop it", "strength")
    if body.get("correction_top_k") is not None and method not in methods_taking("top_k"):
        takers = ", ".join(methods_taking("top_k"))
        raise _bad(
            f"`correction_top_k` applies to {takers}, not to method {method!r}; drop it", "correction_top_k"
        )
    limit_name = (
        "max_completion_tokens"
        if kind == "chat" and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    if limit_name != "max_tokens":
        _integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)  # checked too, though the newer field wins
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and len(stop) <= MAX_STOP_STRINGS and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise _bad(f"`stop` must be a string or a list of at most {MAX_STOP_STRINGS} strings", "stop")
    stream = False if body.get("stream") is None else body["stream"]  # OpenAI's `stream` is nullable
    if not isinstance(stream, bool):
        raise _bad("`stream` must be true or false", "stream")
    options = body.get("stream_options") or {}  # ignored without `stream`, as some clients always send it
    if not isinstance(options, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    include_usage = False if options.get("include_usage") is None else options["include_usage"]
    if not isinstance(include_usage, bool):
        raise _bad("`stream_options.include_usage` must be true or false", "stream_options")
    return {
        "model": model,
        "user": user,
        "user_tag": user_tag,
        "task": task,
        "method": method,
        "strength": None
        if body.get("strength") is None
        else _number(body, "strength", 0.0, 0.0, MAX_STRENGTH),
        "correction_top_k": _integer(body, "correction_top_k", 1, MAX_TOP_K),
        "max_tokens": _integer(body, limit_name, 1, MAX_TOKENS_LIMIT),
        "stop": tuple(s for s in stops if s),
        "sampling": _sampling(body),
        "candidates": _integer(body, "candidates", 1, MAX_CANDIDATES) or 1,
        "stream": stream,
        "include_usage": include_usage,
    }


def _sampling(body: dict[str, Any]) -> SamplerSettings:
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise _bad("`logit_bias` must map token ids to numbers", "logit_bias")
    pairs = []
    for token, value in bias.items():
        # digits only, as OpenAI's ids are written: Python's int() also reads "1_0", "+5", " 5 " and other scripts' digits
        if not isinstance(token, str) or not _TOKEN_ID.fullmatch(token):
            raise _bad(
                f"`logit_bias` key {shown_value(token)} is not a token id (up to 10 digits 0-9)", "logit_bias"
            )
        token_id = int(token)
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise _bad("`logit_bias` values must be numbers between -100 and 100", "logit_bias")
        pairs.append((token_id, float(value) if value > -100 else float("-inf")))
    seed = _integer(body, "seed", 0, 2**32 - 2)
    try:
        return SamplerSettings(
            temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
            top_p=max(_number(body, "top_p", 1.0, 0.0, 1.0), 1e-6),  # 0 keeps only the best token
            top_k=_integer(body, "top_k", 0, 1_000_000) or 0,
            min_p=_number(body, "min_p", 0.0, 0.0, 0.99),
            repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.01, 10.0),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            logit_bias=tuple(pairs),
            seed=seed,
            grammar=_string(body, "grammar"),
            # None: the task's default (on for headline and title); 0 turns the rule off
            repeated_word_penalty=(
                None
                if body.get("repeated_word_penalty") is None
                else _number(body, "repeated_word_penalty", 0.0, 0.0, 100.0)
            ),
        ).validated()
    except LocalpersError as exc:
        raise _bad(str(exc)) from None


def parse_completion(body: Any) -> GenerationJob:
    """A `/v1/completions` body as a job (the prompt is one string)."""
    common = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise _bad("`prompt` must be one non-empty string", "prompt")
    return GenerationJob(kind="completion", text=unicodedata.normalize("NFC", prompt), messages=(), **common)


def _content(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":  # OpenAI's turn that only called tools
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _bad(f"message {index}: only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"message {index} has no text `content`", "messages")


def parse_chat(body: Any) -> GenerationJob:
    """A `/v1/chat/completions` body as a job; with a `task`, the last user message is the text."""
    common = _common(body, "chat")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("`messages` must be a non-empty list", "messages")
    messages = []
    for index, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if (
            not isinstance(role, str) or role not in CHAT_ROLES
        ):  # a list or object role is no key of the table
            raise _bad(f"message {index} needs a `role` of: {', '.join(CHAT_ROLES)}", "messages")
        messages.append((CHAT_ROLES[role], unicodedata.normalize("NFC", _content(message, index))))
    user_messages = [content for role, content in messages if role == "user"]
    if not user_messages or not user_messages[-1].strip():
        raise _bad("the chat needs a non-empty user message", "messages")
    return GenerationJob(kind="chat", text=user_messages[-1], messages=tuple(messages), **common)
