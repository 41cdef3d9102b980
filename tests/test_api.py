"""`localpers api` against a live server on a free loopback port, driven by the official `openai` client.

The server runs uvicorn in a thread over a real `Personalizer` (synthetic bundle, embedded backbone); its
answers are checked against calling the personalizer directly, so a wrong user, method or prompt shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import openai
import pytest
import uvicorn
from starlette.requests import Request
from synthetic_bundle import make_bundle
from typer.testing import CliRunner

from localpers.api.app import MAX_BODY_BYTES, create_app, read_body
from localpers.api.backend import ApiBackend
from localpers.api.requests import ApiError
from localpers.api.server import check_bind, is_loopback
from localpers.bundle.format import open_bundle
from localpers.cli import app as cli_app
from localpers.engine.backbone import Backbone
from localpers.errors import LocalpersError
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import stored_token_bias
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

ARTICLE = (
    "Generate a headline for the following article: The town hall will install solar panels on its roof."
)
SECRET = "Zorblax the seventh quietly reorganised the lighthouse archive"


def raw_request(
    url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """(status, body) of one request without any client library's interpretation."""
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def personalizer(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Personalizer]:
    bundle = make_bundle(tmp_path_factory.mktemp("bundle") / "bundle", backbone)
    loaded = Personalizer(open_bundle(bundle, backbone_sha256=backbone.sha256), backbone, n_ctx=512)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def store(personalizer: Personalizer, tmp_path_factory: pytest.TempPathFactory) -> UserStore:
    users = UserStore(root=tmp_path_factory.mktemp("users"))
    alice = users.create("alice")  # the first user becomes the active one
    vector = np.random.default_rng(3).normal(0, 30.0, personalizer.head.d).astype(np.float32)
    alice.save_fit(
        vector, {"cluster": 1, "bundle_sha256": personalizer.bundle_sha256, "fit": {"mode": "vector"}}
    )
    users.create("bob")  # never fitted
    carol = users.create(
        "carol"
    )  # fitted with a chosen correction and a token bias, as `localpers fit` stores them
    habit = personalizer.engine.tokenize(" Zorblax", add_bos=False)[0]
    carol.save_fit(
        vector,
        {
            "cluster": 1,
            "bundle_sha256": personalizer.bundle_sha256,
            "fit": {"mode": "vector"},
            "token_bias": {"first": [[habit, 10.0]], "rest": []},
            "choice": {"vector_strength": 0.5, "bias_strength": 20.0, "label": "vector 0.5 + bias 20"},
        },
    )
    dan = users.create("dan")  # fitted before it had history, then given some
    dan.save_fit(
        None, {"cluster": None, "bundle_sha256": personalizer.bundle_sha256, "fit": {"mode": "cold-start"}}
    )
    dan.save_history(
        [
            HistoryItem.create(
                "headline", "The town hall will install solar panels.", "Solar Roof For Town Hall"
            )
        ]
    )
    return users


class LiveServer:
    """uvicorn serving `app` on a free loopback port in a background thread."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)  # type: ignore[arg-type]
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture(scope="module")
def backend(personalizer: Personalizer, store: UserStore) -> ApiBackend:
    return ApiBackend(personalizer, store)


@pytest.fixture(scope="module")
def server(backend: ApiBackend) -> Iterator[LiveServer]:
    with LiveServer(create_app(backend, allow_grammar=True)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0, timeout=300)


def alice_card(personalizer: Personalizer, store: UserStore, **kwargs: object) -> str:
    alice = store.get("alice")
    return personalizer.rewrite(
        ARTICLE,
        method="card",
        cluster=1,
        vector=alice.vector(),
        history=None,
        **kwargs,  # type: ignore[arg-type]
    ).text


def test_models_lists_the_active_user_alias_and_every_user(client: openai.OpenAI) -> None:
    assert {model.id for model in client.models.list()} == {
        "localpers",
        "localpers/alice",
        "localpers/bob",
        "localpers/carol",
        "localpers/dan",
    }
    assert client.models.retrieve("localpers/bob").id == "localpers/bob"


def test_completion_uses_the_active_users_card_profile(
    client: openai.OpenAI, personalizer: Personalizer, store: UserStore
) -> None:
    response = client.completions.create(
        model="localpers", prompt=ARTICLE, max_tokens=12, extra_body={"task": "headline"}
    )
    expected = alice_card(personalizer, store, max_tokens=12)
    assert response.choices[0].text == expected and expected
    global_text = personalizer.rewrite(ARTICLE, method="global", max_tokens=12).text
    assert expected != global_text, "the test would not notice a request served without alice's profile"
    assert response.usage is not None and response.usage.completion_tokens > 0
    assert response.choices[0].finish_reason in ("stop", "length")


def test_a_users_chosen_strengths_and_token_bias_apply_as_in_rewrite(
    client: openai.OpenAI, personalizer: Personalizer, store: UserStore
) -> None:
    carol = store.get("carol")
    response = client.completions.create(
        model="localpers/carol", prompt=ARTICLE, max_tokens=10, extra_body={"task": "headline"}
    )
    common = {"method": "card", "cluster": 1, "vector": carol.vector(), "max_tokens": 10}
    expected = personalizer.rewrite(
        ARTICLE, strength=0.5, bias=stored_token_bias(carol), bias_strength=20.0, **common
    )
    assert response.choices[0].text == expected.text
    assert expected.text.startswith("Zor"), "the habit (bias 10 x 20 on the first token) should lead"
    unbiased = personalizer.rewrite(ARTICLE, strength=0.5, **common).text
    assert unbiased != expected.text, "the test would not notice a request served without the token bias"


def test_user_field_and_model_name_pick_the_user(client: openai.OpenAI) -> None:
    def global_headline(model: str, **user: str) -> Any:
        return client.completions.create(
            model=model,
            prompt=ARTICLE,
            max_tokens=8,
            extra_body={"task": "headline", "method": "global"},
            **user,
        )

    by_model = global_headline("localpers/bob")
    by_field = global_headline("localpers", user="bob")
    assert by_model.choices[0].text == by_field.choices[0].text
    with pytest.raises(openai.ConflictError, match="not fitted") as raised:  # bob has no fit for CARD
        client.completions.create(model="localpers/bob", prompt=ARTICLE, max_tokens=8)
    assert "history import" in str(raised.value), "a fit of no history fits nothing: say to add history first"
    with pytest.raises(openai.ConflictError, match="fitted before its history.*global-history needs no fit"):
        client.completions.create(
            model="localpers/dan", prompt=ARTICLE, max_tokens=8, extra_body={"task": "headline"}
        )
    needs_no_fit = client.completions.create(
        model="localpers/bob", prompt=ARTICLE, max_tokens=8, extra_body={"method": "global-history"}
    )
    assert needs_no_fit.choices[0].text
    with pytest.raises(openai.NotFoundError, match="no local user"):
        client.completions.create(model="localpers", user="nobody", prompt=ARTICLE, max_tokens=8)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4o", prompt=ARTICLE, max_tokens=8)
    with pytest.raises(openai.NotFoundError, match="does not exist"):  # `user` does not excuse a wrong model
        client.completions.create(model="card", user="bob", prompt=ARTICLE, max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="name different users"):
        client.completions.create(model="localpers/alice", user="bob", prompt=ARTICLE, max_tokens=8)
    # clients that always send OpenAI's end-user tag (an id of their own) reach a user through the model name
    tagged = global_headline("localpers/bob", user="user-4821")
    assert tagged.choices[0].text == by_model.choices[0].text and tagged.localpers["user"] == "bob"  # type: ignore[attr-defined]


def test_chat_streaming_sends_the_same_text_as_a_plain_answer(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "The town hall will install solar panels on its roof."}]
    plain = client.chat.completions.create(model="localpers/alice", messages=messages, max_tokens=16)  # type: ignore[arg-type]
    chunks = list(
        client.chat.completions.create(
            model="localpers/alice",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) >= 2, "streaming should deliver the text in several pieces"
    assert "".join(pieces) == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    )


def test_completion_streaming_with_a_task(
    client: openai.OpenAI, personalizer: Personalizer, store: UserStore
) -> None:
    stream = client.completions.create(
        model="localpers/alice", prompt=ARTICLE, max_tokens=12, stream=True, extra_body={"task": "headline"}
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text == alice_card(personalizer, store, max_tokens=12)  # no leading space the answer lacks


def test_grammar_and_sampling_options_reach_the_sampler_chain(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model="localpers/alice",
        prompt="Is the town hall getting solar panels? Answer:",
        max_tokens=6,
        temperature=0.8,
        seed=5,
        extra_body={"grammar": 'root ::= " " ("yes" | "no")', "min_p": 0.05},
    )
    assert response.choices[0].text in {" yes", " no"}
    assert response.choices[0].finish_reason == "stop"


def test_candidates_return_the_rewrites_consensus_and_refuse_sampling(
    client: openai.OpenAI, personalizer: Personalizer, store: UserStore
) -> None:
    response = client.completions.create(
        model="localpers/alice",
        prompt=ARTICLE,
        max_tokens=12,
        extra_body={"task": "headline", "candidates": 4},
    )
    expected = alice_card(personalizer, store, max_tokens=12, candidates=4)
    assert response.choices[0].text.strip() == expected
    with pytest.raises(openai.BadRequestError, match="greedy decoding") as raised:
        client.completions.create(
            model="localpers/alice", prompt=ARTICLE, temperature=0.5, extra_body={"candidates": 4}
        )
    assert raised.value.body["param"] == "candidates"  # type: ignore[index]
    assert "adapter" not in str(raised.value), "card decodes on an adapter: only the temperature is at fault"
    with pytest.raises(openai.BadRequestError, match="between 1 and"):
        client.completions.create(model="localpers/alice", prompt=ARTICLE, extra_body={"candidates": 99})


def test_bad_requests_get_a_json_4xx_without_a_traceback(client: openai.OpenAI, server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature") as raised:
        client.completions.create(model="localpers", prompt=ARTICLE, temperature=5.0)
    assert raised.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="not valid GBNF") as raised:
        client.completions.create(model="localpers", prompt=ARTICLE, extra_body={"grammar": "root ::= ("})
    assert raised.value.body["param"] == "grammar"  # type: ignore[index]
    for bias in ({"-1": 5}, {"999999999": 5}):  # not a token id; beyond the vocabulary (the engine's refusal)
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model="localpers", prompt=ARTICLE, max_tokens=2, logit_bias=bias)
        assert raised.value.body["param"] == "logit_bias", bias  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="localpers", messages=[])
    status, body = raw_request(f"{server.base_url}/completions", b"{not json")
    assert status == 400
    assert json.loads(body)["error"]["message"] == (
        "the request body is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"
    )
    assert "Traceback" not in body
    status, body = raw_request(f"{server.base_url}/embeddings")
    assert status == 404 and "error" in json.loads(body)
    # `logprobs: 0` asks a completion for the chosen tokens' log-probabilities (0 alternatives): refused too
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="localpers", prompt=ARTICLE, max_tokens=2, logprobs=0)
    client.chat.completions.create(  # a chat's `logprobs: false` asks for none, as do 0 alternatives, no echo
        model="localpers", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, logprobs=False
    )
    client.completions.create(
        model="localpers", prompt=ARTICLE, max_tokens=2, echo=False, extra_body={"echo": 0, "top_logprobs": 0}
    )


def test_text_that_is_not_unicode_gets_a_400_naming_its_field(server: LiveServer) -> None:
    for route, body, field in (
        ("completions", b'{"model": "localpers", "prompt": "\\ud800 hi", "max_tokens": 3}', "prompt"),
        (
            "chat/completions",
            b'{"model": "localpers", "messages": [{"role": "user", "content": "\\udc80"}]}',
            "messages[0].content",
        ),
    ):
        status, answer = raw_request(f"{server.base_url}/{route}", body)
        assert status == 400, answer
        assert json.loads(answer)["error"]["param"] == field


def test_a_body_over_the_limit_gets_413_before_it_is_read(server: LiveServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("content-type", "application/json")
    connection.putheader("content-length", str(MAX_BODY_BYTES + 1))
    connection.endheaders()  # the body is never sent: the declared length is enough to refuse it
    response = connection.getresponse()
    assert response.status == 413 and "at most" in json.loads(response.read())["error"]["message"]
    connection.close()


def test_a_body_without_a_declared_length_is_cut_at_the_limit() -> None:
    sent: list[int] = []

    async def receive() -> dict[str, object]:
        sent.append(1)
        return {"type": "http.request", "body": b"x" * (1 << 20), "more_body": True}  # endless

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    with pytest.raises(ApiError) as raised:
        asyncio.run(read_body(request))
    assert raised.value.status == 413
    assert (
        len(sent) == MAX_BODY_BYTES // (1 << 20) + 1
    )  # it stopped reading at the first chunk past the limit


def test_a_keyless_server_refuses_web_pages_and_foreign_host_names(server: LiveServer) -> None:
    models = f"{server.base_url}/models"
    status, answer = raw_request(models, headers={"Host": "attacker.example"})  # DNS rebinding
    assert status == 403 and "loopback" in json.loads(answer)["error"]["message"]
    assert "alice" not in answer
    for origin in (
        "http://attacker.example",
        "null",
    ):  # a page of another site, a sandboxed frame or local file
        status, answer = raw_request(
            f"{server.base_url}/completions",
            b'{"model": "localpers", "prompt": "hi", "max_tokens": 2}',
            headers={"Origin": origin, "content-type": "text/plain"},
        )
        assert status == 403, origin
    for host, origin in (
        (f"localhost:{server.port}", None),
        (f"[::1]:{server.port}", f"http://127.0.0.1:{server.port}"),
    ):
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        status, answer = raw_request(models, headers=headers)
        assert status == 200, (host, answer)


def test_a_key_protected_server_refuses_requests_without_it(backend: ApiBackend) -> None:
    with LiveServer(create_app(backend, api_key="s3cret")) as live:
        wrong = openai.OpenAI(base_url=live.base_url, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=live.base_url, api_key="s3cret", max_retries=0)
        assert "localpers" in {model.id for model in right.models.list()}
        # the key, not the address, decides who is served: a remote name behind a keyed server is fine
        status, _ = raw_request(
            f"{live.base_url}/models", headers={"Host": "box.example", "authorization": "Bearer s3cret"}
        )
        assert status == 200


def test_request_text_is_never_logged(client: openai.OpenAI, capfd: pytest.CaptureFixture[str]) -> None:
    client.completions.create(model="localpers", prompt=SECRET, max_tokens=4, extra_body={"method": "global"})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="localpers", prompt=SECRET, top_p=7)
    with pytest.raises(openai.BadRequestError):  # llama.cpp's grammar parser prints what it could not parse
        client.completions.create(
            model="localpers", prompt="hi", extra_body={"grammar": f'root ::= ("{SECRET}"'}
        )
    captured = capfd.readouterr()
    assert "Zorblax" not in captured.out + captured.err


def test_only_loopback_binds_without_a_flag_and_a_key() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    check_bind("127.0.0.1", allow_remote=False, api_key=None)
    with pytest.raises(LocalpersError, match="--allow-remote"):
        check_bind("0.0.0.0", allow_remote=False, api_key="k")
    with pytest.raises(LocalpersError, match="API key"):
        check_bind("0.0.0.0", allow_remote=True, api_key=None)
    check_bind("0.0.0.0", allow_remote=True, api_key="k")


def test_api_command_refuses_a_public_bind_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LOCALPERS_API_KEY", raising=False)
    result = CliRunner().invoke(cli_app, ["api", "--host", "0.0.0.0", "--allow-remote"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: listening on 0.0.0.0 needs an API key")
    assert len(result.output.strip().splitlines()) == 1


def test_starting_without_a_key_says_that_every_local_account_can_use_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loopback is shared by all accounts of a machine (privacy audit): the start-up says so when no key is set."""
    import localpers.api.server as server
    from localpers.methods.card.personalizer import Personalizer

    monkeypatch.setattr(server, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(server, "serve", lambda app, host, port, **options: None)
    monkeypatch.setattr(
        Personalizer, "open", classmethod(lambda cls, **kwargs: SimpleNamespace(close=lambda: None))
    )
    monkeypatch.delenv("LOCALPERS_API_KEY", raising=False)
    open_to_all = CliRunner().invoke(cli_app, ["api"])
    assert open_to_all.exit_code == 0, open_to_all.output
    assert "any program or account on this machine can use the API" in open_to_all.stderr
    assert "LOCALPERS_API_KEY" in open_to_all.stderr
    monkeypatch.setenv("LOCALPERS_API_KEY", "k")
    keyed = CliRunner().invoke(cli_app, ["api"])
    assert keyed.exit_code == 0, keyed.output
    assert "API key required" in keyed.stderr and "any program or account" not in keyed.stderr


def test_the_word_rule_is_the_tasks_unless_a_request_sets_it() -> None:
    from localpers.api.requests import parse_completion

    base = {"model": "localpers", "prompt": ARTICLE, "task": "headline"}
    assert (
        parse_completion(base).sampling.repeated_word_penalty is None
    )  # the task's default, filled in later
    assert parse_completion({**base, "repeated_word_penalty": 0}).sampling.repeated_word_penalty == 0.0
    with pytest.raises(Exception, match="repeated_word_penalty"):
        parse_completion({**base, "repeated_word_penalty": -1})


def test_a_strength_for_a_method_without_a_correction_is_refused() -> None:
    from localpers.api.requests import parse_completion

    base = {"model": "localpers", "prompt": ARTICLE, "strength": 5}
    assert parse_completion({**base, "method": "card"}).strength == 5.0
    for method in ("global", "cluster", "global-history", "exact"):
        with pytest.raises(ApiError, match=f"not to method '{method}'") as raised:
            parse_completion({**base, "method": method})
        assert raised.value.param == "strength"


def test_cards_k_is_a_request_field_for_the_methods_with_a_correction() -> None:
    """`correction_top_k` is `rewrite --top-k`: CARD's k, refused for a method without a correction."""
    from localpers.api.requests import parse_completion

    base = {"model": "localpers", "prompt": ARTICLE}
    assert parse_completion(base).correction_top_k is None  # the bundle's k
    assert parse_completion({**base, "correction_top_k": 3}).correction_top_k == 3
    assert parse_completion({**base, "correction_top_k": 3}).sampling.top_k == 0  # not the sampler's top_k
    for method in ("global", "cluster", "global-history", "exact", "cope"):
        with pytest.raises(ApiError, match=f"not to method '{method}'") as raised:
            parse_completion({**base, "method": method, "correction_top_k": 3})
        assert raised.value.param == "correction_top_k"
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(ApiError, match="correction_top_k") as raised:
            parse_completion({**base, "correction_top_k": bad})
        assert raised.value.param == "correction_top_k"


def test_a_requests_correction_k_is_the_one_applied(server: LiveServer) -> None:
    body = {"model": "localpers/alice", "prompt": ARTICLE, "max_tokens": 4, "task": "headline"}
    status, text = raw_request(
        f"{server.base_url}/completions", json.dumps({**body, "correction_top_k": 2}).encode()
    )
    assert status == 200, text
    extension = json.loads(text)["localpers"]
    assert extension["method"] == "card" and extension["top_k"] == 2, extension


def test_the_answer_lists_the_history_items_its_prompt_showed(
    backbone: Backbone, store: UserStore, tmp_path: Path
) -> None:
    """`localpers.examples` is what `rewrite --json` lists (it was always empty: the API never asked)."""
    from localpers.api.requests import parse_completion
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "bundle", backbone, prompt=PromptFormat(examples=2).to_manifest())
    personalizer = Personalizer(
        open_bundle(conditioned, backbone_sha256=backbone.sha256), backbone, n_ctx=512
    )
    try:
        backend = ApiBackend(personalizer, store)
        shown = [item.id for item in store.get("dan").history()]
        body = {"model": "localpers/dan", "prompt": ARTICLE, "max_tokens": 4, "task": "headline"}
        for method, expected in (("global-history", shown), ("global", [])):
            served = backend.run(parse_completion({**body, "method": method}))
            assert [example.id for example in served.result.examples] == expected, method
    finally:
        personalizer.close()


def test_the_answer_says_what_rewrite_json_says_beside_the_text(server: LiveServer) -> None:
    """Strength, CARD's k, the history items shown and the notes (a cut text) that `rewrite` prints."""
    long_article = (
        ARTICLE + " The council voted for it after a long debate." * 60
    )  # well past 1,500 characters
    body = {"model": "localpers/alice", "prompt": long_article, "max_tokens": 6, "task": "headline"}
    status, text = raw_request(f"{server.base_url}/completions", json.dumps(body).encode())
    assert status == 200, text
    extension = json.loads(text)["localpers"]
    assert extension["method"] == "card" and extension["strength"] is not None and extension["top_k"] >= 1
    assert "bias_strength" in extension
    carol = {
        "model": "localpers/carol",
        "prompt": ARTICLE,
        "max_tokens": 4,
        "task": "headline",
        "strength": 0,
    }
    status, text = raw_request(f"{server.base_url}/completions", json.dumps(carol).encode())
    assert status == 200, text
    applied = json.loads(text)["localpers"]
    assert (applied["strength"], applied["bias_strength"]) == (0.0, 20.0)  # strength 0 leaves her token bias
    assert isinstance(extension["examples"], list)
    assert any("task read its first 1,500" in note for note in extension["notes"]), extension
    status, text = raw_request(
        f"{server.base_url}/completions", json.dumps({**body, "stream": True, "method": "global"}).encode()
    )
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    final = [event for event in events if event["choices"] and event["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["localpers"]["method"] == "global"
    assert final[0]["localpers"]["strength"] is None and final[0]["localpers"]["notes"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_serving(url: str, expected: bytes) -> None:
    """Wait (up to 60 s) until a server started in another process answers `url` with `expected`."""
    deadline = time.monotonic() + 60
    while True:
        try:
            assert urllib.request.urlopen(url, timeout=5).read() == expected
            return
        except OSError:  # not listening yet (urllib's URLError is one)
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)


def test_half_sent_requests_neither_take_every_file_descriptor_nor_hold_their_places(tmp_path: Path) -> None:
    """300 half-sent requests took all 200 file descriptors the server had: later requests timed out and the log
    filled with tracebacks. Beyond MAX_CONNECTIONS a connection is now answered 503 as it opens, and one whose
    headers do not arrive within HEADER_SECONDS is closed."""
    import resource
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    port = _free_port()
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))\n"
        "from starlette.applications import Starlette\n"
        "from starlette.responses import PlainTextResponse\n"
        "from starlette.routing import Route\n"
        "import localpers.api.server as server\n"
        "server.HEADER_SECONDS = 2.0\n"
        "app = Starlette(routes=[Route('/', lambda request: PlainTextResponse('ok'))])\n"
        f"server.serve(app, '127.0.0.1', {port})\n"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 400:  # this test holds 300 sockets itself
        if hard != resource.RLIM_INFINITY and hard < 400:
            pytest.skip(f"this test holds 300 sockets; the hard limit of open files here is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))  # restored below
    server = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    held: list[socket.socket] = []
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_until_serving(url, b"ok")
        for _ in range(300):  # each sends half a request and waits (a full queue makes connecting wait too)
            connection = socket.create_connection(("127.0.0.1", port), timeout=30)
            connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            held.append(connection)
        try:  # answered at once: busy, or served where a place has come free; never left waiting
            assert urllib.request.urlopen(url, timeout=5).read() == b"ok"
        except urllib.error.HTTPError as refused:
            assert refused.code == 503
        time.sleep(3.0)  # past HEADER_SECONDS: no half-sent request still holds a place
        answers = {connection.recv(100)[:12] for connection in held}
        assert answers <= {b"", b"HTTP/1.1 503"} and b"HTTP/1.1 503" in answers, answers
        assert urllib.request.urlopen(url, timeout=5).read() == b"ok"  # the places came back
    finally:
        for connection in held:
            connection.close()
        server.terminate()
        _, log = server.communicate(timeout=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # no later test runs under this one's limit
    assert "Traceback" not in log and "Too many open files" not in log, log[-2000:]


def test_a_body_that_trickles_in_is_cut_off_at_its_deadline(tmp_path: Path) -> None:
    """A request whose headers came in time and whose body then came a byte at a time held its place for as long
    as the client liked (only the headers had a deadline). Since: BODY_SECONDS after the headers the connection
    is closed, the route sees a 400 rather than a traceback, and the server goes on answering. The same holds for
    a request pipelined behind another in one packet (uvicorn reads it after the first answer, past the point
    where the deadline was first set: the review found it held its place for ever), and a body the app is slow
    to take, so that uvicorn stops reading it, is not the client's delay. A client that leaves its answer unread
    for WRITE_SECONDS is dropped (the second review: one held its place for ever)."""
    import subprocess
    import sys

    port = _free_port()
    script = (
        "import sys\n"
        "from starlette.applications import Starlette\n"
        "from starlette.responses import PlainTextResponse\n"
        "from starlette.routing import Route\n"
        "import localpers.api.server as server\n"
        "from localpers.api.app import read_body\n"
        "from localpers.api.requests import ApiError\n"
        "server.BODY_SECONDS = 2.0\n"
        "server.WRITE_SECONDS = 2.0\n"
        "async def size(request):\n"
        "    try:\n"
        "        return PlainTextResponse(str(len(await read_body(request))))\n"
        "    except ApiError as refused:\n"
        "        print('refused', refused.status, file=sys.stderr, flush=True)\n"
        "        return PlainTextResponse('', status_code=refused.status)\n"
        "async def late(request):\n"
        "    import asyncio\n"
        "    await asyncio.sleep(float(request.query_params['s']))  # before the app reads the body\n"
        "    return await size(request)\n"
        "async def big(request):\n"
        "    return PlainTextResponse('x' * (16 << 20))\n"
        "app = Starlette(routes=[Route('/', size, methods=['GET', 'POST']), Route('/late', late, methods=['POST']),"
        " Route('/big', big)])\n"
        f"server.serve(app, '127.0.0.1', {port})\n"
    )
    server = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_until_serving(url, b"0")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
            started = time.monotonic()
            with contextlib.suppress(OSError):  # the server may close while a byte is on its way
                for _ in range(8):  # one byte every half second: 4 s in all, were it let
                    time.sleep(0.5)
                    slow.sendall(b"x")
            assert slow.recv(100) == b""  # closed, with no answer
            assert time.monotonic() - started < 3.5
        with socket.create_connection(("127.0.0.1", port), timeout=30) as pipelined:
            pipelined.sendall(
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\nPOST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123"
            )
            started = time.monotonic()
            answers = b""
            while chunk := pipelined.recv(4096):  # the GET's answer, then the close
                answers += chunk
            assert answers.count(b"HTTP/1.1 ") == 1 and answers.startswith(b"HTTP/1.1 200")
            assert time.monotonic() - started < 3.5
        for wait in (1.5, 3.0):  # the app takes the body late, within BODY_SECONDS (2 s) or past it
            late = urllib.request.Request(f"{url}late?s={wait}", data=b"x" * (1 << 20), method="POST")
            assert urllib.request.urlopen(late, timeout=10).read() == str(1 << 20).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as unread:
            unread.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(3.5)  # past WRITE_SECONDS without reading the answer: dropped
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := unread.recv(1 << 16):
                    received += len(chunk)
            assert 0 < received < 16 << 20
        request = urllib.request.Request(url, data=b"abc", method="POST")
        assert urllib.request.urlopen(request, timeout=5).read() == b"3"
    finally:
        server.terminate()
        _, log = server.communicate(timeout=30)
    assert "refused 400" in log and "Traceback" not in log, log[-2000:]


def test_a_closed_connection_that_cannot_send_what_is_left_is_aborted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection uvicorn had closed (its keep-alive timer, a deadline, a finished answer) waited for ever to
    send what its client never read, and kept its place: the second review held 3 of 32 that way for 90 s. It
    is aborted once it has stayed closing a whole WRITE_SECONDS."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    import localpers.api.server as server

    class StuckTransport(asyncio.Transport):
        closing = aborted = False

        def get_extra_info(self, name: str, default: object = None) -> object:
            return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)

        def is_closing(self) -> bool:
            return self.closing or self.aborted

        def close(self) -> None:
            self.closing = True  # a close waits to send its buffer, which the client does not read

        def abort(self) -> None:
            self.aborted = True

    async def watched() -> tuple[bool, bool]:
        config = Config(app=lambda scope, receive, send: None, log_level="warning")
        config.load()
        protocol = server._guarded_protocol()(config=config, server_state=ServerState(), app_state={})
        open_one, stuck = StuckTransport(), StuckTransport()
        protocol.connection_made(stuck)
        other = server._guarded_protocol()(config=config, server_state=ServerState(), app_state={})
        other.connection_made(open_one)
        stuck.close()
        # two watches of 0.2 s; a busy machine's stall must not make it look never aborted
        for _ in range(200):
            await asyncio.sleep(0.05)
            if stuck.aborted:
                break
        await asyncio.sleep(0.5)  # as long again for the open one, which no watch may abort
        return stuck.aborted, open_one.aborted

    monkeypatch.setattr(server, "WRITE_SECONDS", 0.2)
    monkeypatch.setattr(server, "HEADER_SECONDS", 60.0)
    assert asyncio.run(watched()) == (True, False)


def test_the_api_key_is_compared_stripped_and_a_blank_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, backend: ApiBackend
) -> None:
    """A key read with `$(cat key)` from a CRLF file kept its \\r and no client could match it."""
    import localpers.api.server as server
    from localpers.methods.card.personalizer import Personalizer

    served: dict[str, object] = {}
    monkeypatch.setattr(server, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(server, "serve", lambda app, host, port, **options: served.update(app=app))
    monkeypatch.setattr(Personalizer, "open", classmethod(lambda cls, **kwargs: backend.personalizer))
    monkeypatch.setattr(ApiBackend, "close", lambda self, wait=None: True)
    monkeypatch.setenv("LOCALPERS_API_KEY", "s3cret\r")
    started = CliRunner().invoke(cli_app, ["api"])
    assert started.exit_code == 0, started.output
    with LiveServer(served["app"]) as live:  # type: ignore[arg-type]
        keyed = openai.OpenAI(base_url=live.base_url, api_key="s3cret", max_retries=0)
        assert keyed.models.list().data
    monkeypatch.setenv("LOCALPERS_API_KEY", "  ")
    blank = CliRunner().invoke(cli_app, ["api", "--host", "0.0.0.0", "--allow-remote"])
    assert blank.exit_code == 2 and blank.output.strip() == (
        "error: the API key (--api-key or LOCALPERS_API_KEY) is blank; give a key, or unset it"
    )
    monkeypatch.setenv("LOCALPERS_API_KEY", "cl\u00e9-s3cret")  # a client's header could never carry it
    accented = CliRunner().invoke(cli_app, ["api"])
    assert accented.exit_code == 2 and "other than printable ASCII" in accented.output


def test_an_answer_cut_by_the_full_context_reaches_clients_as_length() -> None:
    """A generation stopped by the full context ("context") reached OpenAI clients as finish_reason "stop", which
    reads as a complete answer."""
    from localpers.api.requests import MAX_TOKENS_LIMIT
    from localpers.api.responses import FINISH_REASONS
    from localpers.engine import CONTEXT_TOKENS

    assert FINISH_REASONS["context"] == "length" and MAX_TOKENS_LIMIT == CONTEXT_TOKENS


def test_a_chat_reply_ends_where_a_base_model_would_write_the_next_turn(
    client: openai.OpenAI, personalizer: Personalizer
) -> None:
    """On a backbone without a chat template (the embedded Gemma) a chat is a "Role: text" transcript, and the
    reply ran on into invented "User:" and "Assistant:" turns until max_tokens, starting with a space."""
    from localpers.methods.card.prompting import chat_transcript

    messages = [
        ("system", "You are a helpful assistant."),
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Germany?"),
    ]
    unstopped = personalizer.rewrite(chat_transcript(messages), task="free", method="global", max_tokens=48)
    assert "\nUser:" in unstopped.text  # what this model writes on its own
    answer = client.chat.completions.create(
        model="localpers",
        messages=[{"role": role, "content": content} for role, content in messages],  # type: ignore[misc]
        max_tokens=48,
        extra_body={"method": "global"},
    )
    reply = answer.choices[0].message.content or ""
    assert reply == unstopped.text[: unstopped.text.index("\nUser:")].strip()
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="localpers",
        messages=[{"role": role, "content": content} for role, content in messages],  # type: ignore[misc]
        max_tokens=48,
        extra_body={"method": "global"},
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == reply


def test_a_chat_or_prompt_longer_than_a_rewrites_text_is_bounded_by_the_context_only(
    client: openai.OpenAI, server: LiveServer, store: UserStore
) -> None:
    """A chat whose transcript passed 1,000 characters (a long system prompt, a long conversation) got a 400 telling
    the client to "split it and rewrite the parts", the free task's limit for a text shown beside examples."""
    system = "You answer questions about the town's history, briefly and politely. " * 18  # ~1,260 characters
    chat = client.chat.completions.create(
        model="localpers",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_body={"method": "global"},
    )
    assert chat.usage is not None and chat.usage.prompt_tokens > 200 and chat.choices[0].message.content
    completion = client.completions.create(
        model="localpers", prompt=system, max_tokens=4, extra_body={"method": "global"}
    )
    assert (
        completion.usage is not None and completion.usage.prompt_tokens > 200 and completion.choices[0].text
    )
    # a user whose free-task history a short text would be shown with is told that a long one was given alone
    erin = store.create("erin")
    erin.save_history([HistoryItem.create("free", "A note about the harbour.", "The harbour opens at six.")])
    try:
        answer = client.completions.create(
            model="localpers/erin", prompt=system, max_tokens=4, extra_body={"method": "global-history"}
        )
        assert answer.localpers["notes"] == [  # type: ignore[attr-defined]
            "the text has over 1,000 characters: it was given without your examples, which would not fit beside it"
        ]
    finally:
        store.delete("erin")
    status, body = raw_request(  # the test model's context is 512 tokens
        f"{server.base_url}/completions",
        json.dumps({"model": "localpers", "prompt": "word " * 600, "method": "global"}).encode(),
    )
    assert status == 400 and "exceed the model's context of 512" in json.loads(body)["error"]["message"]
    # A text that cannot fit is refused from its beginning: tokenizing 100,000 characters of line breaks whole
    # takes llama.cpp half a minute, during which every other client waited (API audit, eighty-fourth session).
    for path, request in (
        ("completions", {"prompt": "a\n" * 50_000}),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi\n"}] * 30_000}),
    ):
        status, body = raw_request(
            f"{server.base_url}/{path}",
            json.dumps({"model": "localpers", "method": "global", **request}).encode(),
        )
        message = json.loads(body)["error"]["message"]
        assert status == 400 and "characters alone are" in message and "context of 512" in message, message


def test_an_assistant_turn_without_content_is_an_empty_turn(client: openai.OpenAI) -> None:
    """OpenAI's clients send `content: null` for an assistant turn that only called tools."""
    answer = client.chat.completions.create(
        model="localpers",
        messages=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "Hello again"},
        ],
        max_tokens=4,
        extra_body={"method": "global"},
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


class _RecordingBackend:
    """`backend` whose generations are recorded: the tokens each produced, or the exception that ended it."""

    def __init__(self, backend: ApiBackend) -> None:
        self.backend = backend
        self.outcomes: list[object] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.backend, name)

    def run(self, job: object, on_text: object = None) -> object:
        try:
            served = self.backend.run(job, on_text)  # type: ignore[arg-type]
        except BaseException as exc:
            self.outcomes.append(type(exc).__name__)
            raise
        self.outcomes.append(served.result.tokens)
        return served


def test_a_plain_answer_whose_client_left_stops_generating(
    backend: ApiBackend, personalizer: Personalizer
) -> None:
    """A stream stopped at the client's disconnect, but a plain (non-streaming) answer ran to max_tokens, holding
    the engine from every other client."""
    recording = _RecordingBackend(backend)
    end_of_text = personalizer.engine.eos_token
    body = json.dumps(
        {
            "model": "localpers",
            "prompt": "Once upon a time",
            "max_tokens": 300,
            "method": "global",
            "logit_bias": {str(end_of_text): -100},  # no early end: only the disconnect can stop it
        }
    ).encode()
    with LiveServer(create_app(recording)) as live:  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", live.port)) as connection:
            connection.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(1.0)
        deadline = time.monotonic() + 120
        while not recording.outcomes and time.monotonic() < deadline:
            time.sleep(0.05)
    assert recording.outcomes == ["ClientGone"]


def test_every_chunk_of_a_stream_carries_the_same_created_time(backend: ApiBackend) -> None:
    """The chunks carried the time the stream started and the last ones the time the generation ended."""
    from localpers.api.backend import Served

    class Slow:
        def __getattr__(self, name: str) -> object:
            return getattr(backend, name)

        def run(self, job: object, on_text: object = None) -> Served:
            served = backend.run(job, on_text)  # type: ignore[arg-type]
            return Served(served.result, served.user, served.created + 5, served.notes)  # a slow generation

    with LiveServer(create_app(Slow())) as live:  # type: ignore[arg-type]
        client = openai.OpenAI(base_url=live.base_url, api_key="x", max_retries=0, timeout=300)
        chunks = list(
            client.chat.completions.create(
                model="localpers",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4,
                extra_body={"method": "global"},
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert len(chunks) >= 3 and len({chunk.created for chunk in chunks}) == 1


def test_a_key_protected_server_answers_a_browser_apps_preflight(backend: ApiBackend) -> None:
    """API.md promised a browser app the API once the server has a key, but preflights got 405 and answers no
    Access-Control-Allow-Origin, so browsers blocked every call. Without a key pages stay refused."""
    preflight = {
        "Origin": "https://writer.example",
        "Access-Control-Request-Method": "POST",
        # OpenAI's JavaScript SDK sends its own headers on every call
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-stainless-retry-count",
    }
    with LiveServer(create_app(backend, api_key="s3cret")) as live:
        connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
        connection.request("OPTIONS", "/v1/chat/completions", headers=preflight)
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200
        assert answer.getheader("access-control-allow-origin") == "*"
        allowed = (answer.getheader("access-control-allow-headers") or "").lower()
        assert "authorization" in allowed and "x-stainless-os" in allowed
        connection.request(
            "GET",
            "/v1/models",
            headers={"Origin": "https://writer.example", "Authorization": "Bearer s3cret"},
        )
        listed = connection.getresponse()
        listed.read()
        assert listed.status == 200 and listed.getheader("access-control-allow-origin") == "*"
        connection.request("GET", "/v1/models", headers={"Origin": "https://writer.example"})
        refused = connection.getresponse()
        refused.read()
        assert refused.status == 401
        connection.close()
    with LiveServer(create_app(backend)) as live:
        connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
        connection.request("OPTIONS", "/v1/chat/completions", headers=preflight)
        answer = connection.getresponse()
        answer.read()
        assert answer.status != 200 and answer.getheader("access-control-allow-origin") is None
        connection.close()


def test_a_chat_through_exact_ends_at_the_turn_stops_and_takes_stop(
    client: openai.OpenAI, personalizer: Personalizer, store: UserStore
) -> None:
    """`cope` and `exact` run their own decoders, which were given neither a request's `stop` (a 400) nor a
    transcript's turn openings: a chat through them ran on into invented turns until max_tokens."""
    from localpers.methods.attributes import attribute_line
    from localpers.methods.card.prompting import chat_transcript, transcript_stops
    from localpers.methods.exact import index_exact, load_index
    from localpers.methods.exact_rewrite import retrieve, rewrite_exact

    messages = [
        ("system", "You are a helpful assistant."),
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Germany?"),
    ]
    user = store.create("exa")
    user.save_history(
        [
            HistoryItem.create("free", "The zoo welcomed two baby pandas.", "Two pandas, adorable!"),
            HistoryItem.create("free", "Bus fares will drop for students.", "Fares halved, great!"),
        ]
    )
    try:
        index_exact(personalizer, user, k=1, library=("Concise", "Vivid"))
        unstopped, _ = rewrite_exact(
            personalizer, load_index(user), chat_transcript(messages), task="free", max_tokens=48
        )
        assert "\nUser:" in unstopped.text  # what this model writes on its own
        chat = [{"role": role, "content": content} for role, content in messages]
        answer = client.chat.completions.create(
            model="localpers/exa",
            messages=chat,  # type: ignore[arg-type]
            max_tokens=48,
            extra_body={"method": "exact"},
        )
        reply = answer.choices[0].message.content or ""
        assert reply == unstopped.text[: unstopped.text.index("\nUser:")].strip()
        assert answer.choices[0].finish_reason == "stop"
        prompt = "The zoo welcomed two baby pandas, and the keepers said"
        plain, _ = rewrite_exact(personalizer, load_index(user), prompt, task="free", max_tokens=16)
        later_word = plain.text.split()[2]
        stopped = client.completions.create(
            model="localpers/exa",
            prompt=prompt,
            max_tokens=16,
            stop=[later_word],
            extra_body={"method": "exact"},
        )
        assert stopped.choices[0].text == plain.text[: plain.text.index(later_word)]
        assert stopped.choices[0].finish_reason == "stop"
        # a chat over the 1,000 characters a prompt carries beside the attribute line is given whole, as the
        # methods on the adapters give it (it was a 400 naming `messages` until the seventy-ninth session)
        too_long = chat + [{"role": "user", "content": "And of Spain? " * 80}]
        transcript = chat_transcript([*messages, ("user", "And of Spain? " * 80)])
        index = load_index(user)
        attributes = retrieve(index, transcript, "free").attributes
        whole, _ = rewrite_exact(
            personalizer,
            index,
            transcript,
            task="free",
            max_tokens=4,
            stop=transcript_stops([*messages, ("user", "And of Spain? " * 80)]),
            alone_over=lambda room: True,
        )
        expected = transcript.strip() + (f"\n{attribute_line(attributes)}" if attributes else "")
        assert (
            whole.prompt_tokens == len(personalizer.engine.tokenize(expected))
            and whole.text_chars_read is None
        )
        long_answer = client.chat.completions.create(
            model="localpers/exa",
            messages=too_long,  # type: ignore[arg-type]
            max_tokens=4,
            extra_body={"method": "exact"},
        )
        assert long_answer.choices[0].message.content == whole.text.strip()
        assert long_answer.usage is not None and long_answer.usage.prompt_tokens == whole.prompt_tokens
    finally:
        store.delete("exa")


def test_a_history_that_cannot_be_read_does_not_stop_the_global_adapter(
    personalizer: Personalizer, store: UserStore, backend: ApiBackend
) -> None:
    """The global adapter's plain prompt shows no history, but `rewrite --method global` and the API read it first
    and refused the request (the API with a 400, as if the client had sent something wrong)."""
    from localpers.api.requests import parse_completion
    from localpers.methods.base import RewriteOptions
    from localpers.methods.registry import get_method

    user = store.create("frank")
    user.history_path.write_text('{"input": "An article.", "output": ""}\n')  # edited by hand
    try:
        expected = personalizer.rewrite(ARTICLE, task="headline", method="global", max_tokens=4).text
        options = RewriteOptions(task="headline", max_tokens=4)
        rewritten = get_method("global").rewrite(personalizer, user, ARTICLE, options)
        assert rewritten["text"] == expected
        body = {
            "model": "localpers/frank",
            "prompt": ARTICLE,
            "max_tokens": 4,
            "method": "global",
            "task": "headline",
        }
        assert backend.run(parse_completion(body)).result.text == expected
        with pytest.raises(ApiError, match="history.jsonl line 1"):  # a method that shows the history says so
            backend.run(parse_completion({**body, "method": "global-history"}))
    finally:
        store.delete("frank")


def test_a_grammar_is_refused_unless_the_server_allows_it(backend: ApiBackend) -> None:
    """An ambiguous grammar (a row of `[a-z]*`) kept llama.cpp inside one sampling call for minutes, so a 218-byte
    request stalled every other client and the server's stop (eighty-first session's API audit)."""
    body = {"model": "localpers", "prompt": "Hi", "max_tokens": 2, "grammar": 'root ::= "yes"'}
    with LiveServer(create_app(backend)) as live:
        status, payload = raw_request(f"{live.base_url}/completions", json.dumps(body).encode())
    error = json.loads(payload)["error"]
    assert status == 400 and error["param"] == "grammar" and error["code"] == "grammar_not_allowed"
    assert "--allow-grammar" in error["message"]


def test_a_stopped_server_does_not_wait_forever_for_a_generation_stuck_in_llama_cpp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's lock held by a generation that never returns: closing the model under it would crash and
    waiting never ended (SIGTERM left the server running); the command now exits without it."""
    import localpers.api.server as server
    import localpers.cli.api as api_cli
    from localpers.methods.card.personalizer import Personalizer

    closed: list[bool] = []
    exits: list[int] = []
    options: dict[str, object] = {}

    def stuck_serve(app: object, host: str, port: int, **given: object) -> None:
        options.update(given)
        backend._lock.acquire()  # a generation that never returns holds it

    monkeypatch.setattr(server, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(server, "serve", stuck_serve)
    monkeypatch.setattr(
        Personalizer,
        "open",
        classmethod(lambda cls, **kwargs: SimpleNamespace(close=lambda: closed.append(True))),
    )
    monkeypatch.setattr(api_cli, "STUCK_GENERATION_SECONDS", 0.1)
    monkeypatch.setattr(os, "_exit", exits.append)
    real_backend = ApiBackend

    def remembered(personalizer: object, store: object = None) -> ApiBackend:
        nonlocal backend
        backend = real_backend(personalizer, store)  # type: ignore[arg-type]
        return backend

    backend: ApiBackend
    monkeypatch.setattr("localpers.api.backend.ApiBackend", remembered)
    result = CliRunner().invoke(cli_app, ["api"])
    assert exits == [1] and not closed, result.output
    assert "a generation was still running inside llama.cpp" in result.stderr
    assert options["shutdown_seconds"] == api_cli.SHUTDOWN_SECONDS


def test_fields_python_would_read_loosely_are_refused_by_name() -> None:
    """`"n": true` passed as 1 (`True == 1`), `include_usage: "no"` counted as true, a chat's `max_tokens` went
    unchecked beside `max_completion_tokens`, and `tool_choice: "required"` was ignored, so a client waiting for
    a tool call got text (eighty-first session's API audit)."""
    from localpers.api.requests import ApiError, parse_chat, parse_completion

    completion = {"model": "localpers", "prompt": ARTICLE}
    chat = {"model": "localpers", "messages": [{"role": "user", "content": ARTICLE}]}
    refused = [
        (parse_completion, {**completion, "n": True}, "n"),
        (parse_completion, {**completion, "best_of": True}, "best_of"),
        (
            parse_completion,
            {**completion, "stream": True, "stream_options": {"include_usage": "no"}},
            "stream_options",
        ),
        (parse_chat, {**chat, "max_completion_tokens": 8, "max_tokens": "abc"}, "max_tokens"),
        (parse_chat, {**chat, "tool_choice": "required"}, "tool_choice"),
        (parse_chat, {**chat, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ]
    for parse, body, field in refused:
        with pytest.raises(ApiError) as raised:
            parse(body)
        assert raised.value.status == 400 and raised.value.param == field, body
    assert parse_chat({**chat, "tool_choice": "none", "n": 1}).max_tokens is None
    assert (
        parse_chat({**chat, "tool_choice": "auto", "max_completion_tokens": 8, "max_tokens": 4}).max_tokens
        == 8
    )
    assert parse_completion({**completion, "stream_options": {"include_usage": True}}).include_usage is True


def test_an_unfitted_user_of_a_method_with_its_own_decoder_gets_cards_409_shape(
    client: openai.OpenAI,
) -> None:
    """CARD's 409 for an unfitted user names `user` and `user_not_fitted`; CoPe's and EXACT's had both null."""
    for method in ("cope", "exact"):
        with pytest.raises(openai.APIStatusError) as raised:
            client.completions.create(
                model="localpers/bob",
                prompt=ARTICLE,
                max_tokens=4,
                extra_body={"task": "headline", "method": method},
            )
        error = raised.value.body
        assert raised.value.status_code == 409 and error["param"] == "user", error  # type: ignore[index]
        assert error["code"] == "user_not_fitted"  # type: ignore[index]


def test_a_prompt_past_the_context_is_a_400_naming_the_field_it_came_in(client: openai.OpenAI) -> None:
    long_text = "word " * 1200
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model="localpers", prompt=long_text, max_tokens=4, extra_body={"method": "global"}
        )
    assert raised.value.body["param"] == "prompt"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="localpers",
            messages=[{"role": "user", "content": long_text}],
            max_tokens=4,
            extra_body={"method": "global"},
        )
    assert raised.value.body["param"] == "messages"  # type: ignore[index]


def test_a_host_with_anything_but_a_port_after_it_is_not_loopback(server: LiveServer) -> None:
    """`127.0.0.1:80@evil.com`, `127.0.0.1:8000, evil.com` and an origin `https://127.0.0.1:8000.evil.com` read as
    127.0.0.1 (eighty-first session's API audit); a trailing slash was redirected to the Host header's name."""
    from localpers.api.server import host_of

    assert host_of("127.0.0.1:8000") == "127.0.0.1" and host_of("[::1]:8000") == "::1"
    assert host_of("http://localhost:8000") == "localhost" and host_of("::1") == "::1"
    models = f"{server.base_url}/models"
    for host, origin in (
        ("127.0.0.1:80@evil.com", None),
        (f"127.0.0.1:{server.port}, evil.com", None),
        (f"127.0.0.1:{server.port}", "https://127.0.0.1:8000.evil.com"),
        ("[::1]x", None),
    ):
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        status, answer = raw_request(models, headers=headers)
        assert status == 403 and "forbidden_origin" in answer, (host, origin)
    status, answer = raw_request(f"{models}/", headers={"Host": f"127.0.0.1:{server.port}"})
    assert status == 404 and json.loads(answer)["error"]["message"], answer
    # an unknown path or method goes through the same guard (API audit, eighty-fourth session)
    status, answer = raw_request(f"{server.base_url}/nothere", headers={"Host": "evil.com"})
    assert status == 403 and "forbidden_origin" in answer, answer


def test_the_busy_answer_is_an_openai_error_object() -> None:
    from localpers.api.server import BUSY_RESPONSE

    head, _, body = BUSY_RESPONSE.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"content-type: application/json" in head
    assert f"content-length: {len(body)}".encode() in head
    assert json.loads(body)["error"]["code"] == "server_busy"


STUCK_SERVER = """
import json, os, signal, sys, threading, time, http.client
from types import SimpleNamespace

import localpers.cli.api as api_cli
from localpers.api.backend import ApiBackend
from localpers.cli.entry import main
from localpers.methods.card.personalizer import Personalizer

port = int(sys.argv[1])
Personalizer.open = classmethod(lambda cls, **kwargs: SimpleNamespace(close=lambda: None))
api_cli.SHUTDOWN_SECONDS, api_cli.STUCK_GENERATION_SECONDS = 1.0, 0.5

def stuck(self, job, on_text=None):  # a generation inside llama.cpp that does not return
    with self._lock:
        time.sleep(120)

ApiBackend.run = stuck

def client_then_stop():
    for _ in range(200):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = json.dumps({"model": "localpers", "prompt": "hi", "max_tokens": 2, "stream": True})
            connection.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=client_then_stop, daemon=True).start()
sys.argv = ["localpers", "api", "--port", str(port)]
main()
"""


def test_a_stopped_server_exits_past_a_streamed_generation_stuck_in_llama_cpp(tmp_path: Path) -> None:
    """A streamed request's generation ran on the event loop's executor, whose threads a stopped server's loop
    waits for: with one stuck in llama.cpp, SIGTERM never ended `localpers api` (the session's diff review)."""
    import subprocess
    import sys

    env = {**os.environ, "HOME": str(tmp_path), "LOCALPERS_HOME": str(tmp_path / "home")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", STUCK_SERVER, str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert done.returncode == 143, done.stderr
    assert "terminated: a generation was still running inside llama.cpp" in done.stderr
    assert time.monotonic() - started < 60  # the generation itself would take 120 s


SLOW_SERVER = (
    STUCK_SERVER.replace(
        """def stuck(self, job, on_text=None):  # a generation inside llama.cpp that does not return
    with self._lock:
        time.sleep(120)
""",
        """def stuck(self, job, on_text=None):  # a long generation that asks its client between tokens, sends no text
    with self._lock:
        for _ in range(2400):
            on_text("")
            time.sleep(0.05)
""",
    )
    .replace('"stream": True', '"stream": STREAM')
    .replace(  # a busy CI machine's thread gets 10 s to notice the stop: the test is about the forced exit
        "api_cli.SHUTDOWN_SECONDS, api_cli.STUCK_GENERATION_SECONDS = 1.0, 0.5",
        "api_cli.SHUTDOWN_SECONDS, api_cli.STUCK_GENERATION_SECONDS = 1.0, 10.0",
    )
    .replace(
        "    os.kill(os.getpid(), signal.SIGTERM)\n",
        "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(60)  # the client waits on, its connection open\n",
    )
)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stopped_server_tells_a_generation_without_text_yet_to_stop(tmp_path: Path, stream: bool) -> None:
    """A plain request, or a stream before its first text (queued, or a candidates decode), was never told to stop
    when the server stopped: its generation ran on, and the server always ended by the forced exit of a generation
    "still running inside llama.cpp", its model never closed (third API audit)."""
    import subprocess
    import sys

    assert (
        "for _ in range(2400)" in SLOW_SERVER and "STREAM" in SLOW_SERVER and "time.sleep(60)" in SLOW_SERVER
    )
    env = {**os.environ, "HOME": str(tmp_path), "LOCALPERS_HOME": str(tmp_path / "home")}
    script = SLOW_SERVER.replace("STREAM", str(stream))
    done = subprocess.run(
        [sys.executable, "-c", script, str(free_port())], capture_output=True, text=True, env=env, timeout=90
    )
    assert done.returncode == 143, done.stderr
    assert (
        "terminated; the API stopped" in done.stderr and "still running inside llama.cpp" not in done.stderr
    )


def test_a_request_still_waiting_for_the_engine_when_it_closes_is_refused(tmp_path: Path) -> None:
    """Requests queued on the engine's lock when the server stopped could take it after `close` freed the model
    and run on freed llama.cpp handles (the session's diff review)."""
    from localpers.api.requests import parse_completion
    from localpers.users.store import UserStore

    closed: list[bool] = []
    backend = ApiBackend(SimpleNamespace(close=lambda: closed.append(True)), UserStore(root=tmp_path))  # type: ignore[arg-type]
    assert backend.close(wait=1.0) and closed == [True]
    with pytest.raises(ApiError) as raised:
        backend.run(parse_completion({"model": "localpers", "prompt": "hi", "method": "global"}))
    assert raised.value.status == 503 and "stopping" in raised.value.message


def test_what_the_second_api_audit_found_loose_is_refused_or_shaped_as_openai(server: LiveServer) -> None:
    """The API audit of the eighty-fourth session: a list as a message's role was a 500; `NaN` (not JSON) was
    accepted; `logit_bias` keys were read as Python reads numbers ("1_0" biased token 10); a 1 MB `task` came back
    whole in its 400; a 405 called an endpoint no endpoint and dropped `Allow`; streamed chunks lacked the
    `"usage": null` OpenAI sends on each with `include_usage`."""
    from localpers.api.requests import parse_chat, parse_completion

    def refused(parse, body: dict[str, object]) -> ApiError:  # type: ignore[no-untyped-def]
        with pytest.raises(ApiError) as raised:
            parse(body)
        assert raised.value.status == 400
        return raised.value

    for role in (["user"], {"a": 1}):
        error = refused(parse_chat, {"model": "localpers", "messages": [{"role": role, "content": "hi"}]})
        assert error.param == "messages"
    completion = {"model": "localpers", "prompt": "An article."}
    for key in ("1_0", "+5", " 5 ", "\u0663", "12345678901"):
        assert refused(parse_completion, {**completion, "logit_bias": {key: 5}}).param == "logit_bias"
    assert parse_completion({**completion, "logit_bias": {"10": 5}}).sampling.logit_bias == ((10, 5.0),)
    assert len(refused(parse_completion, {**completion, "task": "t" * 1_000_000}).message) < 300

    status, body = raw_request(
        f"{server.base_url}/completions", b'{"model": "localpers", "prompt": "hi", "x": NaN}'
    )
    assert status == 400 and "NaN is not a JSON value" in json.loads(body)["error"]["message"]
    request = urllib.request.Request(f"{server.base_url}/completions")
    with pytest.raises(urllib.error.HTTPError) as wrong_method:
        urllib.request.urlopen(request, timeout=60)
    assert wrong_method.value.code == 405 and wrong_method.value.headers["Allow"] == "POST"
    assert "takes POST, not GET" in json.loads(wrong_method.value.read())["error"]["message"]

    streamed = {**completion, "max_tokens": 3, "method": "global", "stream": True}
    status, body = raw_request(
        f"{server.base_url}/completions",
        json.dumps({**streamed, "stream_options": {"include_usage": True}}).encode(),
    )
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert status == 200 and len(chunks) >= 2 and all("usage" in chunk for chunk in chunks)
    assert [chunk["usage"] is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]
    status, body = raw_request(f"{server.base_url}/completions", json.dumps(streamed).encode())
    assert not any(
        "usage" in json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")
    )


def test_a_users_damaged_files_are_the_servers_409_naming_the_file_within_the_user(
    server: LiveServer, store: UserStore
) -> None:
    """A damaged history was a 400 (the client blamed) and a damaged state.json `user_not_fitted`, each quoting
    the server's absolute path to the user's folder (API audit, eighty-fourth session)."""
    dave = store.create("dave")
    try:
        dave.save_history([HistoryItem.create("headline", "A note about the harbour.", "The harbour opens.")])
        dave.state_path.write_text("{", encoding="utf-8")
        for damage in ("state", "history"):
            if damage == "history":
                dave.history_path.write_text("garbage\n", encoding="utf-8")
            status, body = raw_request(
                f"{server.base_url}/completions",
                json.dumps({"model": "localpers/dave", "prompt": "An article.", "task": "headline"}).encode(),
            )
            error = json.loads(body)["error"]
            assert status == 409 and error["code"] == "user_data_damaged" and error["param"] == "user", body
            assert str(dave.dir) not in error["message"] and "user 'dave''s " in error["message"], body
    finally:
        store.delete("dave")


@pytest.mark.parametrize("streamed", [False, True])
def test_a_request_whose_client_left_while_queued_is_never_run(
    server: LiveServer, backend: ApiBackend, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    """A request queued behind a busy engine ran its tokenization and decode once the engine was free, though its
    client had left long before (API audit, eighty-fourth session)."""
    import time
    import urllib.parse

    ran: list[str] = []
    generate = backend._generate
    monkeypatch.setattr(backend, "_generate", lambda job, *rest: ran.append(job.text) or generate(job, *rest))
    body = json.dumps(
        {"model": "localpers", "prompt": "queued", "method": "global", "max_tokens": 2, "stream": streamed}
    )
    address = urllib.parse.urlsplit(server.base_url)
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.hostname}:{address.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with backend._lock:  # another request holds the engine
        with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
            connection.sendall(request)
            time.sleep(0.5)  # queued
        time.sleep(1.0)  # the client has gone; the server notices while the engine is still held
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not ran:
        time.sleep(0.1)
    assert ran == []
    assert client_still_served(server)


def client_still_served(server: LiveServer) -> bool:
    status, body = raw_request(
        f"{server.base_url}/completions",
        json.dumps({"model": "localpers", "prompt": "after", "method": "global", "max_tokens": 2}).encode(),
    )
    return status == 200 and bool(json.loads(body)["choices"])


def test_cope_refusing_a_damaged_user_file_does_not_quote_the_servers_path(store: UserStore) -> None:
    """CoPe's (and EXACT's) own decoder refused a damaged cope.json as user_not_fitted with the server's absolute path
    to it (the session's review)."""
    from types import SimpleNamespace

    from localpers.methods.cope import STATE_FILE
    from localpers.methods.registry import get_method

    ann = store.create("cope-damaged")
    try:
        (ann.dir / STATE_FILE).write_text("[1]", encoding="utf-8")  # not a JSON object
        backend = ApiBackend(SimpleNamespace(prompt_format=None), store)  # type: ignore[arg-type]
        job = SimpleNamespace(strength=None, correction_top_k=None, max_tokens=8, sampling=None)
        with pytest.raises(ApiError) as refused:
            backend._own_decoder(get_method("cope"), ann, "text", "headline", job, None, (), [])  # type: ignore[arg-type]
        assert refused.value.status == 409 and refused.value.code == "user_data_damaged"
        assert str(ann.dir) not in refused.value.message and "cope-damaged" in refused.value.message
    finally:
        store.delete("cope-damaged")


def test_a_port_another_program_holds_is_refused_as_serve_refuses_it() -> None:
    """`api` exited 2 with a shorter line where `serve` exits 1 and says what to do (audit85)."""
    import socket

    from localpers.api.server import check_port_free

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(LocalpersError) as refused:
            check_port_free("127.0.0.1", port)
    assert refused.value.exit_code == 1 and str(refused.value).endswith("pick another --port or --host")
    with pytest.raises(LocalpersError) as elsewhere:  # a --host not on this machine: the argument's fault
        check_port_free("192.0.2.123", port)
    assert elsewhere.value.exit_code == 2


def test_a_damaged_active_pointer_is_a_409_naming_it_within_the_store(
    server: LiveServer, store: UserStore
) -> None:
    """Every request for the active user (model `localpers`, even with method global) was a 500 saying only
    "internal error (InputError)" when active.json was damaged (third API audit)."""
    kept = store.active_path.read_bytes() if store.active_path.exists() else None
    try:
        store.active_path.write_text("{", encoding="utf-8")
        status, body = raw_request(
            f"{server.base_url}/completions",
            json.dumps({"model": "localpers", "prompt": "Hi", "max_tokens": 2, "method": "global"}).encode(),
        )
        error = json.loads(body)["error"]
        assert status == 409 and error["code"] == "user_data_damaged" and error["param"] == "model", body
        assert (
            str(store.root) not in error["message"] and "the user store's active.json" in error["message"]
        ), body
    finally:
        if kept is None:
            store.active_path.unlink()
        else:
            store.active_path.write_bytes(kept)


def test_a_long_key_holding_a_surrogate_is_not_echoed_whole_and_a_null_stream_is_no_stream(
    server: LiveServer,
) -> None:
    """A 100,000-character key holding a lone surrogate came back twice in its 400 (200 KB; ~8 MB for a body near
    the limit); OpenAI's nullable `stream` and `stream_options.include_usage` were refused when null."""
    key = "k" * 100_000
    body = '{"model": "localpers", "prompt": "x", "' + key + '": "\\ud800"}'
    status, answer = raw_request(f"{server.base_url}/completions", body.encode())
    assert status == 400 and len(answer) < 1_000, len(answer)
    for extra in ({"stream": None}, {"stream": True, "stream_options": {"include_usage": None}}):
        request = {"model": "localpers", "prompt": "Hi", "max_tokens": 2, "method": "global", **extra}
        status, answer = raw_request(f"{server.base_url}/completions", json.dumps(request).encode())
        assert status == 200, answer
    status, answer = raw_request(f"{server.base_url}/models/" + "m" * 5_000)  # a GET
    assert status == 404 and len(answer) < 1_000, len(answer)


def test_a_page_on_another_port_of_this_machine_is_refused(server: LiveServer) -> None:
    """A page at http://localhost:3000 (a dev server, a notebook) is another site to the browser: its text/plain
    POST needs no preflight, and a loopback Origin was served, so any local page had the server generate for it
    (eighty-eighth session's API audit). The server's own origin is still served."""
    from localpers.api.server import origin_port

    assert origin_port("http://localhost") == 80 and origin_port("https://[::1]:8443") == 8443
    assert origin_port("http://localhost:99999") is None
    body = b'{"model": "localpers", "prompt": "hi", "max_tokens": 2}'
    for origin in ("http://localhost:3000", "http://127.0.0.1", f"https://localhost:{server.port + 1}"):
        status, answer = raw_request(
            f"{server.base_url}/completions", body, headers={"Origin": origin, "content-type": "text/plain"}
        )
        assert status == 403 and "another port of this machine" in answer, (origin, answer)
    status, answer = raw_request(
        f"{server.base_url}/models", headers={"Origin": f"http://localhost:{server.port}"}
    )
    assert status == 200, answer


def test_an_open_decoder_whose_fit_is_gone_is_refused_as_a_first_request_is(store: UserStore) -> None:
    """The CoPe decoder a request left open re-reads the fit to say whether it still serves the user; with the fit
    gone that refusal got `param` and `code` null, where a first request gets `user` and `user_not_fitted`
    (eighty-eighth session's API audit)."""
    from localpers.methods.base import UserDecoder
    from localpers.methods.cope import load_state
    from localpers.methods.registry import get_method

    class LeftOpen(UserDecoder):  # what CopeUserDecoder.serves does: the user's state read afresh
        closed = False

        def rewrite(self, text: str, options: object) -> Any:  # type: ignore[override]
            raise AssertionError("not reached")

        def serves(self, user: Any) -> bool:
            load_state(user)
            return True

        def close(self) -> None:
            LeftOpen.closed = True

    ann = store.create("cope-gone")
    try:
        backend = ApiBackend(SimpleNamespace(prompt_format=None), store)  # type: ignore[arg-type]
        job = SimpleNamespace(strength=None, correction_top_k=None, max_tokens=8, sampling=None)
        backend._decoders["cope"] = LeftOpen()
        with pytest.raises(ApiError) as refused:
            backend._own_decoder(get_method("cope"), ann, "text", "headline", job, None, (), [])  # type: ignore[arg-type]
        assert refused.value.status == 409
        assert (refused.value.param, refused.value.code) == ("user", "user_not_fitted")
        assert LeftOpen.closed and "cope" not in backend._decoders
    finally:
        store.delete("cope-gone")
