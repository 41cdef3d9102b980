"""The `localpers api` command: serve the device's personalized generation as a local OpenAI-compatible API.

It checks the bind address (loopback unless `--allow-remote` and an API key), loads the backbone and bundle
once, and serves until Ctrl+C. Requests pick their user with `user` or the model name `localpers/<user>`.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated

import typer

from localpers.cli.common import BundleOption, ModelOption, echo
from localpers.engine.threads import MAX_THREADS

# How long a stopped server waits for the requests still open, then for the generation in progress, before it
# exits without it: a generation sees its client leave at its next token, which a stuck one never reaches.
SHUTDOWN_SECONDS = 10.0
STUCK_GENERATION_SECONDS = 2.0

# Loopback is not private to one account: any local program or user can connect to the port.
NO_KEY_NOTE = (
    "note: without a key, any program or account on this machine can use the API and the outputs your history "
    "shapes; to require one, set LOCALPERS_API_KEY in your shell first (a key given as --api-key shows in `ps`)"
)


def api_command(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="LOCALPERS_API_KEY",
            help="Require `Authorization: Bearer KEY` (needed off loopback); prefer the variable, which `ps` "
            "does not show.",
        ),
    ] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a non-loopback --host (needs --api-key).")
    ] = False,
    allow_grammar: Annotated[
        bool,
        typer.Option(
            "--allow-grammar",
            help="Serve requests' `grammar` (GBNF): an ambiguous one can keep llama.cpp busy without end,"
            " stalling every client; only for clients you trust with that.",
        ),
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            min=1, max=MAX_THREADS, help="llama.cpp threads (default: LOCALPERS_THREADS, else all CPUs)."
        ),
    ] = None,
    bundle: BundleOption = None,
    model: ModelOption = None,
) -> None:
    """Serve /v1/completions, /v1/chat/completions and /v1/models for any OpenAI client, on this machine."""
    from localpers import interrupts
    from localpers.api.app import create_app
    from localpers.api.backend import ApiBackend
    from localpers.api.server import check_bind, check_port_free, serve
    from localpers.cli.common import stopped_exit
    from localpers.errors import InputError
    from localpers.methods.card.personalizer import Personalizer
    from localpers.users.store import UserStore

    if api_key is not None:
        # what a client sends is compared stripped: so is the key (one read with `$(cat key)` may end in \r)
        api_key = api_key.strip()
        if not api_key:
            raise InputError("the API key (--api-key or LOCALPERS_API_KEY) is blank; give a key, or unset it")
        if not (api_key.isascii() and api_key.isprintable()):
            # HTTP headers carry bytes a server reads as Latin-1: no client's header could ever match such a key
            raise InputError(
                "the API key (--api-key or LOCALPERS_API_KEY) holds characters other than printable ASCII, which"
                " no client can send in a header; use letters, digits and punctuation (e.g. `openssl rand -hex 24`)"
            )
    check_bind(host, allow_remote=allow_remote, api_key=api_key)
    check_port_free(host, port)
    store = UserStore()
    backend = ApiBackend(Personalizer.open(model=model, bundle=bundle, n_threads=threads), store)
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    active = store.active_name()
    echo(
        f"localpers api on http://{shown}:{port}/v1 (model `localpers` = active user {active or '(none)'},"
        f" `localpers/<user>` for another; {'API key required' if api_key else 'no API key'}); Ctrl+C stops",
        err=True,
    )
    if not api_key:
        echo(NO_KEY_NOTE, err=True)
    try:
        with interrupts.hangup_as_terminate():
            serve(
                create_app(backend, api_key=api_key, allow_grammar=allow_grammar),
                host,
                port,
                shutdown_seconds=SHUTDOWN_SECONDS,
            )
    finally:
        if not backend.close(wait=STUCK_GENERATION_SECONDS):
            _exit_leaving_a_stuck_generation()
    stop = interrupts.take_pending()  # uvicorn stops on the signal, then swallows the stop we raise for it
    if isinstance(stop, interrupts.Terminated):  # kill or a closed terminal: 143 or 129, as other commands
        raise stopped_exit(stop, "the API stopped; it keeps no state of its own")


def _exit_leaving_a_stuck_generation() -> None:
    """End the process now: a generation is still inside llama.cpp, which no Python code can stop, and closing
    the model under it would crash; waiting (as interpreter exit waits for worker threads) could be forever."""
    import os

    from localpers import interrupts

    stop = interrupts.take_pending()
    word = interrupts.stopped_word(stop) if isinstance(stop, interrupts.Terminated) else "stopped"
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            f"{word}: a generation was still running inside llama.cpp;"
            " the API exits without waiting for it (it keeps no state of its own)\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
    # as the server's other ends: Ctrl-C 0, a stop signal 128 + its number, anything else 1
    if isinstance(stop, interrupts.Terminated):
        os._exit(interrupts.exit_code(stop))
    os._exit(0 if stop is not None else 1)


def register(app: typer.Typer) -> None:
    """Add `api` to the main app with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("api")(one_line_errors(api_command))
