"""The OpenAI shapes of `localpers api`'s answers: a whole completion or chat completion, a streamed chunk, the
server-sent event that carries one, the token usage, and the `localpers` extension (who and how, the history
items shown) that `localpers rewrite --json` also reports.

Pure functions of a finished or streaming generation: nothing here reads requests, runs the engine or writes.
"""

from __future__ import annotations

import json
from typing import Any

from localpers.api.backend import Served
from localpers.api.requests import GenerationJob

FINISH_REASONS = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
    "context": "length",
}  # cut short: "length"


def usage(served: Served) -> dict[str, int]:
    """OpenAI's `usage`: the prompt's and the completion's tokens."""
    prompt, completion = served.result.prompt_tokens, served.result.tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(job: GenerationJob, served: Served, ident: str) -> dict[str, Any]:
    """The answer to a request without `stream`: a `text_completion` or a `chat.completion`."""
    finish = FINISH_REASONS.get(served.result.stop_reason, "stop")
    if job.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": served.result.text},
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": served.result.text, "finish_reason": finish, "logprobs": None}
    return {
        "id": ident,
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "created": served.created,
        "model": job.model,
        "choices": [choice],
        "usage": usage(served),
        "localpers": extension(served),
    }


def extension(served: Served) -> dict[str, Any]:
    """What `localpers rewrite --json` says beside the text: who and how, the history items shown, notes."""
    result = served.result
    return {
        "user": served.user,
        "method": result.method,
        "adapter": result.adapter,
        "strength": result.strength,
        "bias_strength": result.bias_strength,
        "top_k": result.top_k,
        "examples": [example.id for example in result.examples],
        "notes": list(served.notes),
    }


def chunk(
    job: GenerationJob, ident: str, created: int, piece: str | None, finish: str | None
) -> dict[str, Any]:
    """One streamed chunk: a text `piece` (an empty one opens a chat's assistant message), or none with `finish`."""
    if job.kind == "chat":
        delta: dict[str, Any] = {} if piece is None else {"content": piece}
        if piece is not None and not piece and finish is None:
            delta = {"role": "assistant", "content": ""}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": None}
    body = {
        "id": ident,
        "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
        "created": created,
        "model": job.model,
        "choices": [choice],
    }
    if job.include_usage:  # as OpenAI: every chunk carries `usage`, null until the last one's
        body["usage"] = None
    return body


def event(payload: dict[str, Any] | str) -> str:
    """One server-sent event carrying `payload` (an object as JSON, or a bare word such as `[DONE]`)."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"
