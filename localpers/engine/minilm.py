"""A BERT sentence encoder (all-MiniLM-L6-v2) in plain numpy: tokenise, forward pass, mean pooling.

`MiniLM.load(directory)` reads a sentence-transformers model directory (config.json, modules.json,
sentence_bert_config.json, the pooling config, tokenizer.json, model.safetensors) with the `tokenizers`
and `safetensors.numpy` packages, and `MiniLM.encode` runs the BERT encoder in float32 on padded batches:
absolute position embeddings, token type 0, post-LayerNorm layers with exact (erf) GELU, then the mean of
the unmasked token states, L2-normalised. It is inference only (no dropout, no gradients) and supports
only what that model uses: a BERT with absolute positions and mean pooling; anything else is refused
with a `LocalpersError` that names the file, as is a missing or unreadable file. It needs no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.errors import LocalpersError

_LAYER_TENSORS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _read_json(path: Path, kind: type = dict) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"{path}: unreadable sentence-encoder file ({_one_line(exc)})") from exc
    if not isinstance(value, kind):
        raise LocalpersError(f"{path}: expected a JSON {'list' if kind is list else 'object'}")
    return value


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), computed in place in one new array."""
    from scipy.special import erf

    out = x * np.float32(1.0 / np.sqrt(2.0))
    erf(out, out=out)
    out += 1.0
    out *= x
    out *= 0.5
    return out


@dataclass(frozen=True)
class _Layer:
    qkv_weight: np.ndarray  # (hidden, 3 * hidden): query, key, value side by side, transposed for x @ W
    qkv_bias: np.ndarray
    attention_out_weight: np.ndarray
    attention_out_bias: np.ndarray
    attention_norm: tuple[np.ndarray, np.ndarray]
    intermediate_weight: np.ndarray
    intermediate_bias: np.ndarray
    output_weight: np.ndarray
    output_bias: np.ndarray
    output_norm: tuple[np.ndarray, np.ndarray]


class MiniLM:
    """The loaded encoder: a tokenizer, the embedding tables and the transformer layers (read-only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        config_path = directory / "config.json"
        config = _read_json(config_path)
        try:
            self.hidden = int(config["hidden_size"])
            self.heads = int(config["num_attention_heads"])
            n_layers = int(config["num_hidden_layers"])
            self.eps = float(config["layer_norm_eps"])
            activation = config["hidden_act"]
            positions = config.get("position_embedding_type", "absolute")
            max_positions = int(config["max_position_embeddings"])
        except (KeyError, TypeError, ValueError) as exc:
            raise LocalpersError(f"{config_path}: missing or bad field {_one_line(exc)}") from exc
        if config.get("model_type") != "bert" or activation != "gelu" or positions != "absolute":
            raise LocalpersError(
                f"{config_path}: only a BERT with exact GELU and absolute positions is supported "
                f"(model_type={config.get('model_type')!r}, hidden_act={activation!r}, positions={positions!r})"
            )
        if self.hidden % self.heads:
            raise LocalpersError(f"{config_path}: hidden_size {self.hidden} is not a multiple of the heads")
        self.max_length, self.lower_case = self._read_sentence_config(directory, max_positions)
        self._check_pipeline(directory)
        self.tokenizer = self._read_tokenizer(directory / "tokenizer.json")
        self._read_weights(directory / "model.safetensors", n_layers)

    @classmethod
    def load(cls, directory: str | Path) -> MiniLM:
        return cls(Path(directory))

    # ------------------------------------------------------------------ loading
    @staticmethod
    def _read_sentence_config(directory: Path, max_positions: int) -> tuple[int, bool]:
        path = directory / "sentence_bert_config.json"
        config = _read_json(path)
        try:
            max_length = int(config.get("max_seq_length") or max_positions)
        except (TypeError, ValueError) as exc:
            raise LocalpersError(f"{path}: bad max_seq_length ({_one_line(exc)})") from exc
        return min(max_length, max_positions), bool(config.get("do_lower_case", False))

    @staticmethod
    def _check_pipeline(directory: Path) -> None:
        """modules.json must be Transformer -> mean Pooling (-> Normalize, which `encode` always does)."""
        path = directory / "modules.json"
        modules = _read_json(path, list)
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else "?" for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or not set(kinds[2:]) <= {"Normalize"}:
            raise LocalpersError(
                f"{path}: unsupported module pipeline {kinds}; expected Transformer, Pooling"
            )
        pooling_path = directory / str(modules[1].get("path", "1_Pooling")) / "config.json"
        pooling = _read_json(pooling_path)
        modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v)
        if modes != ["pooling_mode_mean_tokens"]:
            raise LocalpersError(f"{pooling_path}: only mean pooling is supported, found {modes}")

    def _read_tokenizer(self, path: Path) -> Any:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise LocalpersError(f"{path}: unreadable tokenizer ({_one_line(exc)})") from exc
        # The file's own settings (truncate and pad to 128) are not what sentence-transformers uses.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_length, strategy="longest_first")
        return tokenizer

    def _read_weights(self, path: Path, n_layers: int) -> None:
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(path))
        except Exception as exc:  # safetensors raises several types for a bad file
            raise LocalpersError(f"{path}: unreadable weights ({_one_line(exc)})") from exc
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def get(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
            tensor = tensors.get(prefix + name)
            if tensor is None:
                raise LocalpersError(f"{path}: tensor {prefix + name} is missing")
            if shape is not None and tensor.shape != shape:
                raise LocalpersError(f"{path}: tensor {prefix + name} has shape {tensor.shape}, not {shape}")
            return np.ascontiguousarray(tensor, dtype=np.float32)

        h = self.hidden
        self.word_embeddings = get("embeddings.word_embeddings.weight")
        if self.word_embeddings.ndim != 2 or self.word_embeddings.shape[1] != h:
            raise LocalpersError(f"{path}: word embeddings have shape {self.word_embeddings.shape}")
        # Token type ids are always 0 for a single sentence: fold that row into the positions.
        self.position_embeddings = (
            get("embeddings.position_embeddings.weight")[: self.max_length]
            + get("embeddings.token_type_embeddings.weight")[0]
        )
        if self.position_embeddings.shape != (self.max_length, h):
            raise LocalpersError(f"{path}: position embeddings are shorter than {self.max_length}")
        self.embedding_norm = (
            get("embeddings.LayerNorm.weight", (h,)),
            get("embeddings.LayerNorm.bias", (h,)),
        )
        self.layers = []
        for index in range(n_layers):

            def w(key: str, shape: tuple[int, ...] | None = None, index: int = index) -> np.ndarray:
                return get(f"encoder.layer.{index}.{_LAYER_TENSORS[key]}.weight", shape)

            def b(key: str, size: int | None = None, index: int = index) -> np.ndarray:
                return get(f"encoder.layer.{index}.{_LAYER_TENSORS[key]}.bias", (size or h,))

            inner = w("intermediate").shape[0]
            self.layers.append(
                _Layer(
                    qkv_weight=np.ascontiguousarray(
                        np.concatenate([w(k, (h, h)) for k in ("query", "key", "value")]).T
                    ),
                    qkv_bias=np.concatenate([b(k) for k in ("query", "key", "value")]),
                    attention_out_weight=np.ascontiguousarray(w("attention_out", (h, h)).T),
                    attention_out_bias=b("attention_out"),
                    attention_norm=(w("attention_norm", (h,)), b("attention_norm")),
                    intermediate_weight=np.ascontiguousarray(w("intermediate", (inner, h)).T),
                    intermediate_bias=b("intermediate", inner),
                    output_weight=np.ascontiguousarray(w("output", (h, inner)).T),
                    output_bias=b("output"),
                    output_norm=(w("output_norm", (h,)), b("output_norm")),
                )
            )

    # ------------------------------------------------------------------ inference
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text: stripped, [CLS] ... [SEP], truncated to `max_length`."""
        prepared = [str(t).strip() for t in texts]
        if self.lower_case:
            prepared = [t.lower() for t in prepared]
        return [encoding.ids for encoding in self.tokenizer.encode_batch(prepared)]

    @staticmethod
    def pad(token_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, mask)`, both `(n, longest)`, padded on the right with id 0 and mask 0."""
        longest = max(len(row) for row in token_ids)
        ids = np.zeros((len(token_ids), longest), dtype=np.int64)
        mask = np.zeros((len(token_ids), longest), dtype=np.float32)
        for index, row in enumerate(token_ids):
            ids[index, : len(row)] = row
            mask[index, : len(row)] = 1.0
        return ids, mask

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled (not yet normalised) last hidden states, float32 `(batch, hidden)`."""
        batch, length = ids.shape
        heads, head_dim = self.heads, self.hidden // self.heads
        # Token states stay a 2-D (batch * length, hidden) array: numpy's matmul of a 3-D array by a
        # matrix does not use one BLAS call and is many times slower.
        x = (self.word_embeddings[ids] + self.position_embeddings[:length]).reshape(batch * length, -1)
        x = _layer_norm(x, *self.embedding_norm, self.eps)
        # Padding keys get a large negative score, so they take no attention weight.
        key_bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(head_dim))
        for layer in self.layers:
            qkv = (x @ layer.qkv_weight + layer.qkv_bias).reshape(batch, length, 3, heads, head_dim)
            query = qkv[:, :, 0].transpose(0, 2, 1, 3)  # (batch, heads, length, head_dim)
            key = qkv[:, :, 1].transpose(0, 2, 3, 1)  # (batch, heads, head_dim, length)
            value = qkv[:, :, 2].transpose(0, 2, 1, 3)
            scores = (query * scale) @ key + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            context = (weights @ value).transpose(0, 2, 1, 3).reshape(batch * length, self.hidden)
            attended = context @ layer.attention_out_weight + layer.attention_out_bias
            x = _layer_norm(attended + x, *layer.attention_norm, self.eps)
            inner = _gelu(x @ layer.intermediate_weight + layer.intermediate_bias)
            x = _layer_norm(inner @ layer.output_weight + layer.output_bias + x, *layer.output_norm, self.eps)
        x = x.reshape(batch, length, self.hidden)
        counts = np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        return (np.einsum("blh,bl->bh", x, mask) / counts).astype(np.float32)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """L2-normalised embeddings `(n, hidden)`; texts are batched by length to keep padding small."""
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if len(texts) == 0:
            return out
        token_ids = self.tokenize(texts)
        order = np.argsort([-len(row) for row in token_ids], kind="stable")
        for start in range(0, len(texts), max(1, batch_size)):
            chosen = order[start : start + max(1, batch_size)]
            out[chosen] = self.forward(*self.pad([token_ids[i] for i in chosen]))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32)
