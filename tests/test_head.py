"""CARD head maths on hand-made tensors (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from localpers.errors import LocalpersError
from localpers.methods.card.head import CardHead, HeadConfig, normalise_features, top_k_indices


class TableEmbeddings:
    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.n_vocab = len(table)
        self.calls = 0

    def rows(self, ids: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self.table[np.asarray(ids)]


def small_head(d: int = 2, vocab: int = 6, width: int = 3, taps: int = 2) -> CardHead:
    rng = np.random.default_rng(0)
    return CardHead(
        HeadConfig(d=d, layers=tuple(range(taps)), alpha=1.0, top_k=2),
        rng.normal(size=(d, taps * width)),
        np.zeros((2, d)),
        factor_q=rng.normal(size=(width, d)),
        embeddings=TableEmbeddings(rng.normal(size=(vocab, width)).astype(np.float32)),
    )


def test_rms_normalisation_per_layer() -> None:
    features = np.array([[[3.0, 4.0]], [[1.0, 1.0]]]).reshape(1, 2, 2)  # two layers of width 2
    out = normalise_features(features)
    np.testing.assert_allclose(out, [[3 / np.sqrt(12.5), 4 / np.sqrt(12.5), 1.0, 1.0]], rtol=1e-5)


def test_top_k_indices_match_a_full_sort() -> None:
    logits = np.random.default_rng(3).normal(0, 10, 5000).astype(np.float32)
    for k in (1, 5, 40):
        assert sorted(top_k_indices(logits, k)) == sorted(np.argsort(-logits)[:k])


def test_sequence_feature_is_the_sum_of_u_times_z() -> None:
    head = small_head()
    features = np.random.default_rng(1).normal(size=(3, 2, 3))
    tokens = [1, 4, 2]
    expected = sum(head.u_rows([t])[0] * head.project(features[i]) for i, t in enumerate(tokens))
    np.testing.assert_allclose(head.sequence_feature(tokens, features), expected, rtol=1e-5)


def test_u_rows_are_remembered_and_equal_to_e_q(monkeypatch: pytest.MonkeyPatch) -> None:
    import localpers.methods.card.head as head_module

    monkeypatch.setattr(head_module, "U_CACHE_ROWS", 4)  # small, so the cache fills and starts again
    head = small_head(vocab=6)
    table = head.embeddings.table
    expected = table @ head.Q
    for ids in ([1, 3, 1], [3, 1], [0, 2, 5], [4, 5, 0, 4], [0, 1, 2, 3, 4, 5], [2]):
        np.testing.assert_allclose(head.u_rows(np.array(ids)), expected[ids], rtol=1e-6, atol=1e-6)
    calls = head.embeddings.calls
    head.u_rows(np.array([2]))
    assert head.embeddings.calls == calls  # a remembered row is not read again


def test_reward_is_linear_in_the_user_vector() -> None:
    head = small_head()
    features = np.random.default_rng(2).normal(size=(4, 2, 3))
    g = head.sequence_feature([0, 1, 2, 3], features)
    a, b = np.array([1.0, -2.0]), np.array([0.5, 3.0])
    assert np.isclose((a + b) @ g, a @ g + b @ g)


def test_correction_moves_only_top_k_and_masks_the_rest() -> None:
    head = small_head()
    logits = np.array([5.0, 1.0, 4.0, 0.0, -1.0, 2.0], dtype=np.float32)
    features = np.ones((2, 3))
    corrected, candidates, delta = head.correct(logits, features, np.array([100.0, -100.0]), strength=1.0)
    assert sorted(candidates) == [0, 2]
    np.testing.assert_allclose(corrected[candidates], logits[candidates] + delta, rtol=1e-5)
    assert np.all(np.isneginf(np.delete(corrected, candidates)))


def test_strength_zero_keeps_the_cluster_ranking() -> None:
    head = small_head()
    logits = np.array([5.0, 1.0, 4.0, 0.0, -1.0, 2.0], dtype=np.float32)
    corrected, _, delta = head.correct(logits, np.ones((2, 3)), np.array([3.0, 3.0]), strength=0.0)
    assert np.all(delta == 0) and int(np.argmax(corrected)) == 0


def test_head_base_is_read_from_the_manifest_and_checked() -> None:
    entry = HeadConfig(d=8).to_manifest()
    assert "base" not in entry and HeadConfig.from_manifest(entry).base == "cluster"  # older bundles
    entry = HeadConfig(d=8, base="global").to_manifest()
    assert entry["base"] == "global" and HeadConfig.from_manifest(entry).base == "global"
    with pytest.raises(LocalpersError, match="head.base"):
        HeadConfig.from_manifest({**entry, "base": "user"})
