"""The ASGI app of `localpers api`: OpenAI-compatible `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

Routes parse the body (`localpers.api.requests`), run the generation in a worker thread through
`ApiBackend` and answer in OpenAI's shapes (`localpers.api.responses`); `"stream": true` answers with server-sent events, one chunk per
text piece, then `data: [DONE]`. Every failure is a JSON error object with a 4xx/5xx status, never a
traceback; a client that disconnects mid-stream stops its generation. With an API key configured, every
route needs `Authorization: Bearer <key>`. Without one, only this machine's own clients are served: a request
whose `Host` is not a loopback name or address (DNS rebinding: a web page whose name an attacker points at
127.0.0.1) or that a web page of another origin sends (`Origin` not loopback) is refused with 403, since a page in
the user's browser could otherwise read outputs shaped by their private history. Bodies over MAX_BODY_BYTES get
413 before they are read whole. Nothing here logs request or generated text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localpers.api import responses
from localpers.api.backend import ApiBackend, Served
from localpers.api.requests import (
    ApiError,
    GenerationJob,
    parse_chat,
    parse_completion,
    server_stopping,
    shown_value,
)
from localpers.api.server import foreign_request
from localpers.untrusted import JSONProblem, parse_json, unencodable_field

# A request is a prompt of at most the context's few thousand tokens: 4 MB is far beyond any real one, and keeps
# a client from making the server hold gigabytes (it read whole bodies before this limit).
MAX_BODY_BYTES = 4 << 20
SHOWN_FIELD_CHARS = 200  # a field path longer than this is not echoed back as `param`
_DONE = object()


class ClientGone(Exception):
    """Raised inside a generation's text callback once the client has disconnected."""


# llama.cpp matches a grammar against every token of the vocabulary, and an ambiguous one (a row of `[a-z]*`)
# costs it time exponential in a token's length inside one C call that nothing can stop: one short request
# would hold the only engine, so every other client, and the server's own stop, waited for it.
GRAMMAR_OFF = (
    "`grammar` is off on this server: an ambiguous grammar can keep llama.cpp busy without end, stalling every"
    " client; start it with `localpers api --allow-grammar` if its clients are trusted with that"
)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def read_body(request: Request) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed MAX_BODY_BYTES; a 400 (which no one
    reads) when the connection closes before it has all arrived."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(
            413, f"the request body is {int(declared)} bytes; localpers api takes at most {MAX_BODY_BYTES}"
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ApiError(
                    413, f"the request body is over {MAX_BODY_BYTES} bytes, the most localpers api takes"
                )
            chunks.append(chunk)
    except ClientDisconnect:  # the client left, or its body took longer than the server's BODY_SECONDS
        raise ApiError(400, "the connection closed before the request body had arrived") from None
    return b"".join(chunks)


def create_app(backend: ApiBackend, *, api_key: str | None = None, allow_grammar: bool = False) -> Starlette:
    """The Starlette app serving `backend`; `api_key` (if any) is required on every request, and without one
    only loopback clients that are not web pages of another origin are served (`foreign_request`). A request's
    `grammar` is served only with `allow_grammar` (GRAMMAR_OFF says why)."""

    def authorised(request: Request) -> bool:
        if not api_key:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            refusal = None if api_key else foreign_request(request)
            if refusal is not None:
                return error_response(
                    ApiError(
                        403,
                        f"{refusal}: without an API key localpers api serves only clients on this machine"
                        " (use http://127.0.0.1, or start it with --api-key)",
                        code="forbidden_origin",
                    )
                )
            if not authorised(request):
                return error_response(
                    ApiError(
                        401,
                        "missing or wrong API key (send `Authorization: Bearer <key>`)",
                        code="invalid_api_key",
                    )
                )
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc)
            except asyncio.CancelledError:  # the server stopped before the answer was ready: no traceback
                return error_response(server_stopping())
            except Exception as exc:  # report the type only: messages may quote request text
                print(f"localpers api: internal error {type(exc).__name__}", file=sys.stderr)
                return error_response(ApiError(500, f"internal error ({type(exc).__name__})"))

        return route

    async def read_json(request: Request) -> Any:
        try:
            body = parse_json(await read_body(request), allow_nan=False)
        except JSONProblem as problem:
            raise ApiError(400, f"the request body is not valid JSON: {problem}") from None
        field = unencodable_field(body)
        if field is not None:
            shown = shown_value(field)  # a 100,000-character key came back twice, whole
            raise ApiError(
                400,
                f"field {shown} holds a lone UTF-16 surrogate (such as \\ud800), which is not text; send valid Unicode",
                # a key is no field a client can name, nor is a path too long to quote
                param=None if field.endswith("(a key)") or len(field) > SHOWN_FIELD_CHARS else field,
            )
        return body

    async def models(request: Request) -> Response:
        data = [
            {"id": ident, "object": "model", "created": 0, "owned_by": "local"}
            for ident in backend.model_ids()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def model(request: Request) -> Response:
        ident = request.path_params["model"]
        if ident not in backend.model_ids():
            raise ApiError(
                404,
                f"model {shown_value(ident)} does not exist; see /v1/models",
                param="model",
                code="model_not_found",
            )
        return JSONResponse({"id": ident, "object": "model", "created": 0, "owned_by": "local"})

    async def generate(request: Request, parse: Callable[[Any], GenerationJob]) -> Response:
        job = parse(await read_json(request))
        if job.sampling.grammar is not None and not allow_grammar:
            raise ApiError(400, GRAMMAR_OFF, param="grammar", code="grammar_not_allowed")
        ident = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if not job.stream:
            return await answer(request, job, ident)
        return await stream(request, job, ident)

    async def answer(request: Request, job: GenerationJob, ident: str) -> Response:
        """The whole answer at once; a client that disconnects before it stops its generation, as a stream's does."""
        gone = threading.Event()

        def on_text(piece: str) -> None:
            if gone.is_set():
                raise ClientGone()

        async def watch_for_disconnect() -> None:
            # the body has been read: what the connection says next is that the client left (or nothing)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        outcome: Served | Exception
        try:
            async with anyio.create_task_group() as watching:
                watching.start_soon(watch_for_disconnect)
                try:
                    # abandoned on cancel: a stopping server cancels this handler, and a shielded wait held it
                    # (and the generation, never told) until the forced exit of a "stuck" generation
                    outcome = await anyio.to_thread.run_sync(
                        backend.run, job, on_text, abandon_on_cancel=True
                    )
                except Exception as exc:  # raised below, outside the group (which would wrap it)
                    outcome = exc
                watching.cancel_scope.cancel()
        finally:
            gone.set()  # after an answer, nothing; after a cancel, the generation stops at its next token
        if isinstance(outcome, ClientGone):
            return Response(status_code=499)  # nobody reads it
        if isinstance(outcome, Exception):
            raise outcome
        return JSONResponse(responses.completion_body(job, outcome, ident))

    async def stream(request: Request, job: GenerationJob, ident: str) -> Response:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        gone = False

        def on_text(piece: str) -> None:
            if gone:
                raise ClientGone()
            if piece:  # an empty piece only asks whether the client is still there
                loop.call_soon_threadsafe(queue.put_nowait, piece)

        def work() -> None:
            try:
                outcome: object = backend.run(job, on_text)
            except BaseException as exc:  # handed to the event loop, reported as an SSE error event
                outcome = exc
            with contextlib.suppress(RuntimeError):  # the server stopped, and its loop closed, meanwhile
                loop.call_soon_threadsafe(queue.put_nowait, outcome)
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        # A daemon thread, not the loop's executor: a stopped server's loop waits for its executor's threads,
        # and a generation stuck inside llama.cpp never ends (`localpers api` exits without it).
        threading.Thread(target=work, name="localpers-api-stream", daemon=True).start()

        async def watch_for_disconnect() -> None:  # while queued for the engine, before any text
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True

        # Errors found before any text (unknown user, bad grammar, unfitted user) still get a 4xx status.
        try:
            async with anyio.create_task_group() as watching:
                watching.start_soon(watch_for_disconnect)
                first = await queue.get()
                watching.cancel_scope.cancel()
        # the server stopping cancelled the wait: the generation stops at its next token
        except BaseException:
            gone = True
            raise
        if isinstance(first, ClientGone):
            return Response(status_code=499)  # nobody reads it
        if isinstance(first, BaseException):
            if isinstance(first, ApiError):
                return error_response(first)
            print(f"localpers api: internal error {type(first).__name__}", file=sys.stderr)
            return error_response(ApiError(500, f"internal error ({type(first).__name__})"))

        async def events() -> AsyncIterator[str]:
            nonlocal gone
            created = int(time.time())
            item = first
            try:
                if job.kind == "chat":
                    yield responses.event(responses.chunk(job, ident, created, "", None))
                while item is not _DONE:
                    if isinstance(item, str):
                        yield responses.event(responses.chunk(job, ident, created, item, None))
                    elif isinstance(item, Served):
                        finish = responses.FINISH_REASONS.get(item.result.stop_reason, "stop")
                        yield responses.event(
                            {
                                **responses.chunk(job, ident, created, None, finish),
                                "localpers": responses.extension(item),
                            }
                        )
                        if job.include_usage:
                            yield responses.event(
                                {
                                    **responses.chunk(job, ident, created, None, None),
                                    "choices": [],
                                    "usage": responses.usage(item),
                                }
                            )
                    elif isinstance(item, ApiError):
                        yield responses.event(item.body())
                    elif isinstance(item, BaseException):
                        print(f"localpers api: internal error {type(item).__name__}", file=sys.stderr)
                        yield responses.event(ApiError(500, f"internal error ({type(item).__name__})").body())
                    item = await queue.get()
                yield responses.event("[DONE]")
            finally:
                gone = True  # the generation stops at its next piece if the client left early

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat)

    routes = [
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(model), methods=["GET"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        # through the guard, as every route: a foreign page or a client without the key learns no more here
        return await guarded(lambda request: _not_routed(request, exc))(request)

    async def _not_routed(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == 405:  # the path is an endpoint, for other methods: say which, and keep Starlette's Allow
            allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
            response = error_response(
                ApiError(405, f"{request.url.path} takes {allowed or 'other methods'}, not {request.method}")
            )
            if allowed:
                response.headers["Allow"] = allowed
            return response
        return error_response(
            ApiError(status, f"{request.method} {request.url.path} is not an endpoint of localpers api")
        )

    # With a key, a web page that holds it may call the API from the browser: answer its preflight and let it
    # read the answers (the key, sent as a header, is what guards every route). Without one no page is served.
    middleware = (
        [
            Middleware(
                CORSMiddleware,
                allow_origins=["*"],
                allow_methods=["GET", "POST"],
                allow_headers=["*"],  # OpenAI's JavaScript SDK sends its own x-stainless-* headers
                max_age=600,
            )
        ]
        if api_key
        else []
    )
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={404: not_found, 405: not_found})
    # Starlette answers `/v1/models/` with a redirect to the Host header's name, outside the guard: a 404 here
    app.router.redirect_slashes = False
    return app
