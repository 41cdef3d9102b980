"""Property-based tests (hypothesis) of every parser of outside input: zero tracebacks.

History files, user archives, bundle manifests, TUF metadata, HTTP request lines to `serve`, OpenAI request
bodies to `localpers api`, bench data files, publish corpus files, GGUF headers (a backbone given with --model)
and CLI arguments get generated input, structured and random. The property is always the same: the input is accepted, or refused
with a `LocalpersError` (one line, naming the file or field; exit code 2 for bad content; the API: a 4xx with a
JSON error) and no partial state; never another exception. Profiles are in conftest.py: `ci` (default, fast)
and `long` (HYPOTHESIS_PROFILE=long).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_serve_pull import BACKBONE_SHA, make_bundle, publish
from typer.testing import CliRunner

from localpers.bench.data import read_bench_file
from localpers.bundle.format import parse_manifest, validate_manifest
from localpers.bundle.locations import bundles_root, installed_bundle_dir
from localpers.bundle.pull import pull_bundle
from localpers.bundle.serve import BundleServer, start_background_server
from localpers.bundle.trust import root_fingerprint
from localpers.cli import app
from localpers.engine.gguf_layout import gguf_layout
from localpers.errors import InputError, LocalpersError
from localpers.users.history_import import parse_history
from localpers.users.store import UserStore

runner = CliRunner()
T = TypeVar("T")

# JSON values, nested a few levels, with awkward scalars (odd floats, control text); hostile raw JSON
# (integers past Python's 4300-digit limit, nesting far too deep) comes from `hostile_json`.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
hostile_json = st.integers(4301, 6000).map(lambda n: '{"input": ' + "9" * n + "}") | st.integers(
    500, 200_000
).map(lambda n: "[" * n + "]" * n)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
awkward_text = st.lists(
    st.text(max_size=12)
    | st.sampled_from(["\x1b[2J", "\x1b]0;x\x07", "\u2028", "\x00", "\r", "\n", "\ufeff", "\x9b"]),
    max_size=6,
).map("".join)


def assert_one_line(exc: LocalpersError) -> None:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text


def read_or_refused(path: Path, content: str, read: Callable[[Path], T]) -> T | None:
    """`read(path)` of a file holding `content`; None when it was refused in one line naming the file."""
    path.write_bytes(content.encode("utf-8", "surrogatepass"))
    try:
        return read(path)
    except LocalpersError as exc:
        assert_one_line(exc)
        assert path.name in str(exc)
        return None


def jsonl_files(records: st.SearchStrategy[dict], max_lines: int) -> st.SearchStrategy[str]:
    """Files of JSON lines: mostly `records`, mixed with other JSON, awkward text and hostile JSON."""
    line = (
        records.map(lambda d: json.dumps(d, ensure_ascii=False))
        | json_values.map(json.dumps)
        | awkward_text
        | hostile_json
    )
    return st.lists(line, max_size=max_lines).map("\n".join)


# -- history files --------------------------------------------------------------------------------------


def history_lines() -> st.SearchStrategy[str]:
    item = st.fixed_dictionaries(
        {},
        optional={
            "input": awkward_text | json_values,
            "output": awkward_text | json_values,
            "task": st.sampled_from(["headline", "title", "free", "nope"]) | json_values,
            "user_id": st.text(max_size=5) | json_values,
            "history": st.lists(
                st.dictionaries(st.sampled_from(["input", "output"]), awkward_text), max_size=3
            )
            | json_values,
        },
    )
    return jsonl_files(item, max_lines=6)


@given(content=history_lines() | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_history_files_parse_or_fail_in_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(content.encode("utf-8", "surrogatepass"))
    try:
        parsed = parse_history(path)
    except LocalpersError as exc:
        assert_one_line(exc)
        assert "history.jsonl" in str(exc)
        return
    for item in parsed.items:
        assert item.input and item.output and "\x1b" not in item.output


# -- benchmark data files (`localpers bench --data`) ---------------------------------------------------------


def bench_lines() -> st.SearchStrategy[str]:
    item = st.fixed_dictionaries(
        {},
        optional={
            "id": st.text(max_size=4) | json_values,
            "input": awkward_text | json_values,
            "output": awkward_text | json_values,
            "date": st.sampled_from(["2021-01-02", "2020-12-31T10:00", "yesterday", ""]) | json_values,
        },
    )
    user = st.fixed_dictionaries(
        {},
        optional={
            "user_id": st.text(max_size=6) | json_values,
            "history": st.lists(item, max_size=4) | json_values,
            "queries": st.lists(item, max_size=3) | json_values,
        },
    )
    return jsonl_files(user, max_lines=5)


@given(
    content=bench_lines() | st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    dev_split=st.booleans(),
)
def test_bench_data_files_read_or_fail_in_one_line(tmp_path: Path, content: str, dev_split: bool) -> None:
    read = read_or_refused(
        tmp_path / "users.jsonl", content, lambda path: read_bench_file(path, dev_split=dev_split)
    )
    if read is None:
        return
    assert read.users and all(user.queries for user in read.users)
    assert all(user.store_name and len(user.store_name) <= 32 for user in read.users)
    assert len({user.store_name for user in read.users}) == len(read.users)
    assert all("\n" not in note for note in read.notes)


@given(
    content=bench_lines() | hostile_json | st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    min_users=st.integers(1, 3),
)
def test_publish_corpus_files_load_or_fail_in_one_line(tmp_path: Path, content: str, min_users: int) -> None:
    from localpers.publish.corpus import load_corpus

    corpus = read_or_refused(
        tmp_path / "corpus.jsonl", content, lambda path: load_corpus(path, min_users=min_users)
    )
    if corpus is None:
        return
    assert len(corpus.users) >= min_users and all(user.history for user in corpus.users)
    assert len({user.user_id for user in corpus.users}) == len(corpus.users)
    assert all(item.input.strip() and item.output.strip() for user in corpus.users for item in user.history)


@given(content=history_lines())
def test_history_import_is_all_or_nothing(tmp_path: Path, content: str) -> None:
    store = UserStore(tmp_path / f"data-{os.urandom(4).hex()}")
    user = store.create("ann")
    before = user.history_path.read_bytes() if user.history_path.exists() else None
    path = tmp_path / "h.jsonl"
    path.write_text(content, encoding="utf-8", errors="surrogatepass")
    try:
        parsed = parse_history(path)
    except LocalpersError:
        after = user.history_path.read_bytes() if user.history_path.exists() else None
        assert after == before
        return
    user.save_history(parsed.items)
    assert [item.id for item in user.history()] == [item.id for item in parsed.items]


# -- user archives ----------------------------------------------------------------------------------------


member_names = st.sampled_from(
    [
        "manifest.json",
        "state.json",
        "history.jsonl",
        "vector-0123456789abcdef.safetensors",
        "evil/../x",
        "a" * 300,
    ]
)


@st.composite
def archives(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    members = draw(
        st.dictionaries(member_names, json_values.map(json.dumps) | st.binary(max_size=100), max_size=5)
    )
    if draw(st.booleans()):
        members["manifest.json"] = json.dumps(
            {
                "format": draw(st.sampled_from(["localpers-user", "other"])),
                "format_version": draw(st.sampled_from([1, 2, "1"])),
                "name": draw(st.sampled_from(["bob", None, "Bad Name", 5, "x" * 40])),
                "files": draw(json_values),
            }
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


@given(data=archives())
def test_user_archives_import_or_fail_in_one_line_leaving_nothing(tmp_path: Path, data: bytes) -> None:
    store = UserStore(tmp_path / f"data-{os.urandom(4).hex()}")
    archive = tmp_path / "user.zip"
    archive.write_bytes(data)
    try:
        store.import_(archive)
    except LocalpersError as exc:
        assert_one_line(exc)
        assert store.list() == []
        assert not [p for p in store.users_dir.glob(".*")] if store.users_dir.exists() else True
        return
    assert len(store.list()) == 1


# -- bundle manifests --------------------------------------------------------------------------------------


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=300) | hostile_json.map(str.encode))
    path = st.sampled_from(
        ["a", "adapters/global.gguf", "../x", "/etc/passwd", "a/", "A", "a\\b", "c:d", "x\x00"]
    )
    entry = st.fixed_dictionaries(
        {},
        optional={
            "sha256": st.sampled_from(["0" * 64, "A" * 64, "xyz"]) | json_values,
            "size": st.integers(min_value=-5, max_value=10**31) | json_values,
        },
    )
    document = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "format": st.sampled_from(["localpers-bundle", "x"]) | json_values,
                "format_version": st.sampled_from([1, 2, True, "1"]) | json_values,
                "backbone": st.fixed_dictionaries(
                    {}, optional={"sha256": st.sampled_from([BACKBONE_SHA, "z"])}
                )
                | json_values,
                "files": st.dictionaries(path, entry | json_values, max_size=4) | json_values,
                "adapters": st.dictionaries(st.text(max_size=5), path | json_values, max_size=3)
                | json_values,
                "head": json_values,
                "clusters": json_values,
            },
        )
    )
    return json.dumps(document).encode()


@given(data=manifests())
def test_bundle_manifests_validate_or_fail_in_one_line(data: bytes) -> None:
    try:
        manifest = parse_manifest(data, "fuzz/manifest.json")
        validate_manifest(manifest, origin="fuzz/manifest.json", backbone_sha256=BACKBONE_SHA)
    except LocalpersError as exc:
        assert_one_line(exc)
        assert "fuzz/manifest.json" in str(exc)


# -- TUF metadata ----------------------------------------------------------------------------------------


_REPOSITORY: dict[str, object] = {}


def signed_repository(tmp_root: Path) -> tuple[Path, str]:
    """One signed repository for all examples (building one per example would dominate the run)."""
    if "dir" not in _REPOSITORY:
        base = tmp_root / "fuzz-repository-source"
        fingerprint = publish(make_bundle(base / "bundle"), base / "repo", base / "keys")
        _REPOSITORY.update(dir=base / "repo", fingerprint=fingerprint)
    return _REPOSITORY["dir"], str(_REPOSITORY["fingerprint"])  # type: ignore[return-value]


def mutate(document: object, data: st.DataObject) -> object:
    """Replace one randomly chosen value somewhere inside `document` with generated JSON."""
    if isinstance(document, dict) and document and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(document)))
        return {**document, key: mutate(document[key], data)}
    if isinstance(document, list) and document and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(document) - 1))
        return [*document[:index], mutate(document[index], data), *document[index + 1 :]]
    return data.draw(json_values)


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-tuf")


@given(
    role=st.sampled_from(["timestamp.json", "1.root.json", "2.root.json", "snapshot", "targets"]),
    raw=st.none() | st.binary(max_size=200),
    data=st.data(),
)
def test_tuf_metadata_is_verified_or_refused_before_anything_is_installed(
    module_tmp: Path, monkeypatch: pytest.MonkeyPatch, role: str, raw: bytes | None, data: st.DataObject
) -> None:
    source, fingerprint = signed_repository(module_tmp)
    repo = module_tmp / f"repo-{os.urandom(4).hex()}"
    shutil.copytree(source, repo)
    metadata = repo / "metadata"
    if role in ("snapshot", "targets"):
        role = max(metadata.glob(f"*.{role}.json"), key=lambda p: int(p.name.split(".")[0])).name
    target = metadata / role
    original = json.loads(target.read_text()) if target.exists() else {}
    target.write_bytes(raw if raw is not None else json.dumps(mutate(original, data)).encode())
    monkeypatch.setenv("LOCALPERS_HOME", str(module_tmp / f"home-{os.urandom(4).hex()}"))
    try:
        pull_bundle(str(repo), backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    except LocalpersError as exc:
        assert_one_line(exc)
        assert installed_bundle_dir() is None
        assert not [p for p in bundles_root().iterdir() if p.name.startswith(".staging-")]
    finally:
        shutil.rmtree(repo, ignore_errors=True)


@given(raw=st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
def test_root_fingerprint_of_garbage_is_an_input_error(raw: bytes) -> None:
    try:
        root_fingerprint(raw, "fuzz/1.root.json")
    except InputError as exc:
        assert_one_line(exc)


# -- HTTP request lines to serve -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BundleServer, str]]:
    server, url = start_background_server(make_bundle(tmp_path_factory.mktemp("fuzz-serve") / "b"))
    server.request_deadline_s = 1.0
    try:
        yield server, url
    finally:
        server.close()


request_lines = st.binary(max_size=200) | st.builds(
    lambda method, target, version: method + b" " + target + b" " + version,
    st.sampled_from([b"GET", b"HEAD", b"POST", b"G\x1bT", b"", b"PRI"]) | st.binary(max_size=8),
    st.sampled_from([b"/manifest.json", b"/../x", b"*", b"/%00", b"//x"]) | st.binary(max_size=30),
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1 x"])
    | st.binary(max_size=10),
)


@given(line=request_lines, headers=st.lists(st.binary(max_size=40), max_size=4))
def test_request_lines_get_a_status_and_the_server_keeps_serving(
    fuzz_server: tuple[BundleServer, str], caplog: pytest.LogCaptureFixture, line: bytes, headers: list[bytes]
) -> None:
    _, url = fuzz_server
    parsed = urllib.parse.urlsplit(url)
    with (
        caplog.at_level(logging.INFO, logger="localpers.bundle.serve"),
        socket.create_connection((parsed.hostname, parsed.port), timeout=5) as connection,
    ):
        connection.sendall(
            line.replace(b"\n", b"")
            + b"\r\n"
            + b"".join(h.replace(b"\n", b"") + b"\r\n" for h in headers)
            + b"\r\n"
        )
        connection.shutdown(socket.SHUT_WR)
        response = b""
        while chunk := connection.recv(65536):
            response += chunk
    assert response == b"" or response.startswith(b"HTTP/1.1 ")
    for record in caplog.records:
        message = record.getMessage()
        assert "request failed" not in message and message.isprintable() and "127.0.0.1" not in message
    with socket.create_connection((parsed.hostname, parsed.port), timeout=5) as connection:
        connection.sendall(b"HEAD /manifest.json HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert connection.recv(12) == b"HTTP/1.1 200"


# -- CLI arguments -----------------------------------------------------------------------------------------


commands = st.sampled_from(
    [
        ["user", "create"],
        ["user", "use"],
        ["user", "show"],
        ["user", "delete", "-y"],
        ["user", "export", "-o"],
        ["user", "import"],
        ["history", "import"],
        ["history", "add", "-i"],
        ["history", "list", "--user"],
        ["history", "remove"],
        ["bundle", "info"],
        ["bundle", "verify", "--skip-backbone"],
        ["repo", "fingerprint"],
        ["repo", "init", "--keys"],
    ]
)
arguments = st.lists(
    # Never a real device path: a bug here must not be able to replace anything outside tmp_path.
    awkward_text.filter(lambda t: "\x00" not in t and not t.startswith("/"))
    | st.sampled_from(["--json", "-", ".", "--force", "x.zip"]),
    max_size=3,
)


@given(command=commands, extra=arguments)
def test_cli_arguments_never_end_in_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], extra: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*command, *extra])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code not in (0, 2) or result.stderr.startswith("error: "):
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.exit_code in (0, 1, 2)


def _small_gguf(tmp_path: Path) -> bytes:
    import gguf
    import numpy as np

    path = tmp_path / "seed.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    writer.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
    writer.add_uint32("gemma3.block_count", 1)
    writer.add_tensor("token_embd.weight", np.ones((3, 4), dtype=np.float32))
    writer.add_tensor(
        "blk.0.attn_q.weight", np.zeros((2, 68), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0
    )
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    return path.read_bytes()


def _write_edited(raw: bytes, edits: list[tuple[int, int]], cut: int | None, path: Path) -> Path:
    """`raw` with each (position, byte) edit applied inside it, cut to `cut` bytes, written to `path`."""
    edited = bytearray(raw)
    for position, value in edits:
        if position < len(edited):
            edited[position] = value
    path.write_bytes(bytes(edited[:cut] if cut is not None else edited))
    return path


@given(
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(min_value=0, max_value=600),
)
def test_gguf_headers_read_or_fail_in_one_line(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int | None
) -> None:
    pytest.importorskip("gguf")
    path = _write_edited(_small_gguf(tmp_path), edits, cut, tmp_path / "edited.gguf")
    try:
        layout = gguf_layout(path)
    except LocalpersError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    for tensor in layout.tensors:
        assert tensor.offset + tensor.n_bytes <= path.stat().st_size


def _small_lora(tmp_path: Path) -> bytes:
    import numpy as np

    from localpers.engine.adapters import write_lora_gguf

    path = tmp_path / "seed-lora.gguf"
    write_lora_gguf(path, {"blk.0.attn_q.weight": (np.ones((2, 64)), np.ones((2, 2)))}, alpha=4.0)
    return path.read_bytes()


@given(
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=500), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(min_value=0, max_value=700),
)
def test_lora_adapters_pass_or_are_refused_in_one_line(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int | None
) -> None:
    pytest.importorskip("gguf")
    from localpers.engine.adapters import check_lora_adapter

    backbone = tmp_path / "backbone.gguf"
    backbone.write_bytes(_small_gguf(tmp_path))
    raw = _small_lora(tmp_path)  # written to seed-lora.gguf
    check_lora_adapter(tmp_path / "seed-lora.gguf", gguf_layout(backbone))  # the unedited file passes
    path = _write_edited(raw, edits, cut, tmp_path / "edited-lora.gguf")
    try:
        check_lora_adapter(path, gguf_layout(backbone))
    except LocalpersError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)


# -- OpenAI-style request bodies to `localpers api` ----------------------------------------------------------

API_FIELDS = [
    "model", "prompt", "messages", "user", "n", "logprobs", "best_of", "response_format", "task", "method",
    "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "strength", "logit_bias", "seed",
    "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
    "grammar", "repeated_word_penalty", "candidates",
]  # fmt: skip
# Numbers JSON carries that Python's float cannot: integers past 1.8e308 (json.loads keeps them exact).
huge_numbers = st.integers(min_value=10**308, max_value=10**400) | st.integers(
    min_value=-(10**400), max_value=-(10**308)
)
api_values = (
    json_values
    | huge_numbers
    | st.dictionaries(st.text(max_size=6) | huge_numbers.map(str), json_scalars | huge_numbers, max_size=3)
    | st.sampled_from(["localpers", "localpers/ann", "headline", "card", "", " ", "text"])
    | st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool"]), "content": json_values}),
        max_size=3,
    )
)
VALID_BODY = {
    "model": "localpers",
    "prompt": "A town opens a library.",
    "messages": [{"role": "user", "content": "hi"}],
}
api_bodies = (
    st.dictionaries(st.sampled_from(API_FIELDS) | st.text(max_size=8), api_values, max_size=6).map(
        lambda fields: {**VALID_BODY, **fields}
    )
    | json_values
)


@given(body=api_bodies)
def test_api_request_bodies_become_a_job_or_a_4xx(body: object) -> None:
    from localpers.api.requests import ApiError, GenerationJob, parse_chat, parse_completion

    for parse in (parse_completion, parse_chat):
        try:
            job = parse(body)
        except ApiError as refused:
            assert 400 <= refused.status < 500 and "\n" not in refused.message
            assert refused.body()["error"]["message"] == refused.message
            continue
        assert isinstance(job, GenerationJob) and job.text and job.text.strip()


@given(
    raw=hostile_json.map(str.encode) | st.binary(max_size=200) | api_bodies.map(json.dumps).map(str.encode)
)
def test_api_request_bytes_that_are_not_a_request_get_a_json_400(raw: bytes) -> None:
    from starlette.testclient import TestClient

    from localpers.api.app import create_app

    class NoBackend:  # every body here is refused before a backend is asked for anything
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the backend was asked for {name}")

    from localpers.api.requests import ApiError, parse_completion

    try:
        parse_completion(json.loads(raw))
    except (ValueError, RecursionError, ApiError):
        pass  # refused here, so the app must refuse it too
    else:
        return  # a valid request: generating is test_api.py's business
    with TestClient(create_app(NoBackend())) as client:  # type: ignore[arg-type]
        response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert "Traceback" not in response.text and "message" in response.json()["error"]


def test_a_served_path_with_invisible_characters_is_logged_escaped() -> None:
    from localpers.bundle.serve_handler import _printable

    # a soft hyphen, a joiner and a bidi override
    assert _printable("/a\u00adb\u200dc\u202e") == "/a\\xadb\\u200dc\\u202e"
