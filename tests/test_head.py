"""CARD head maths on hand-made tensors (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from file_events import record_fsyncs_and_renames
from safetensors.numpy import save_file

from localpers.errors import LocalpersError
from localpers.methods.card.cluster_assignment import read_centroids
from localpers.methods.card.head import CardHead, normalise_features, top_k_indices
from localpers.methods.card.head_spec import HeadConfig


class TableEmbeddings:
    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.n_vocab, self.n_embd = table.shape
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
    """g(y) = alpha * sum_t (E[y_t] Q) * (P rms(f_t)), written out here without the head's helpers."""
    rng = np.random.default_rng(0)
    P, Q, table = rng.normal(size=(2, 6)), rng.normal(size=(3, 2)), rng.normal(size=(6, 3)).astype(np.float32)
    head = CardHead(
        HeadConfig(d=2, layers=(0, 1), alpha=0.7, top_k=2),
        P,
        np.zeros((2, 2)),
        factor_q=Q,
        embeddings=TableEmbeddings(table),
    )
    features = np.random.default_rng(1).normal(size=(3, 2, 3))
    tokens = [1, 4, 2]
    expected = np.zeros(2)
    for t, token in enumerate(tokens):
        layers = [features[t, layer] / np.sqrt(np.mean(features[t, layer] ** 2)) for layer in range(2)]
        expected += (table[token] @ Q) * (P @ np.concatenate(layers))
    np.testing.assert_allclose(head.sequence_feature(tokens, features), 0.7 * expected, rtol=1e-4)


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


def test_reward_is_linear_in_the_user_vector_and_the_sum_of_the_per_step_corrections() -> None:
    """lambda . g(y) is what CARD's decoding adds up token by token: the pairs' reward and the logit correction
    are the same function of the user vector."""
    head = small_head()
    features = np.random.default_rng(2).normal(size=(4, 2, 3))
    tokens = [0, 1, 2, 3]
    g = head.sequence_feature(tokens, features)
    a, b = np.array([1.0, -2.0]), np.array([0.5, 3.0])
    per_step = [
        float(head.correction(np.array([token]), features[t], a + b, strength=head.config.alpha)[0])
        for t, token in enumerate(tokens)
    ]
    assert np.isclose((a + b) @ g, sum(per_step), rtol=1e-5)
    for t, token in enumerate(tokens):
        step_a = head.correction(np.array([token]), features[t], a, strength=1.0)
        step_b = head.correction(np.array([token]), features[t], b, strength=1.0)
        both = head.correction(np.array([token]), features[t], a + b, strength=1.0)
        np.testing.assert_allclose(both, step_a + step_b, rtol=1e-5, atol=1e-6)


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


def test_a_head_flag_written_as_text_and_a_normalisation_the_device_lacks_are_refused() -> None:
    # bool("false") was True: every g(y) was divided by its length; any layer_norm passed while the device only
    # RMS-normalises (eighty-seventh session's methods audit)
    entry = HeadConfig(d=8).to_manifest()
    assert HeadConfig.from_manifest({**entry, "length_normalised": True}).length_normalised is True
    with pytest.raises(
        LocalpersError, match=r"'head.length_normalised' is 'false'; it must be true or false"
    ):
        HeadConfig.from_manifest({**entry, "length_normalised": "false"})
    with pytest.raises(LocalpersError, match=r"'head.layer_norm' is 'none'"):
        HeadConfig.from_manifest({**entry, "layer_norm": "none"})


def test_a_saved_head_is_synced_before_it_replaces_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    events = record_fsyncs_and_renames(monkeypatch)
    head = small_head()
    path = head.save(tmp_path / "head.safetensors")
    assert "replace" in events and "fsync" in events[: events.index("replace")]
    assert not [p for p in tmp_path.iterdir() if p.name != "head.safetensors"]
    np.testing.assert_array_equal(CardHead.load(path, head.config, head.embeddings).P, head.P)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"P": np.full((2, 6), np.nan, np.float32)}, r"tensor 'P' holds values that are not finite numbers"),
        ({"P": np.zeros((2, 4), np.float32)}, r"tensor 'P' has shape \(2, 4\), D=2 needs \(2, 6\)"),
        ({"Q": np.zeros((3, 5), np.float32)}, r"tensor 'Q' has shape \(3, 5\), D=2 needs \(3, 2\)"),
        ({"default_vectors": np.zeros(2, np.float32)}, r"tensor 'default_vectors' has shape \(2,\)"),
        ({"default_vectors": np.zeros((0, 2), np.float32)}, r"tensor 'default_vectors' has shape \(0, 2\)"),
        ({"Q": np.full((3, 2), np.inf, np.float32)}, r"tensor 'Q' holds values that are not finite"),
    ],
)
def test_a_head_file_that_cannot_serve_the_config_is_one_line_naming_it(
    tmp_path: Path, change: dict[str, np.ndarray], message: str
) -> None:
    head = small_head()
    path = head.save(tmp_path / "head.safetensors")
    assert CardHead.load(path, head.config, head.embeddings).P.shape == (2, 6)  # the file as saved loads
    tensors = {"P": head.P, "default_vectors": head.default_vectors, "Q": head.Q, **change}
    save_file({name: np.ascontiguousarray(t) for name, t in tensors.items()}, str(path))
    with pytest.raises(LocalpersError, match=f"head.safetensors: {message}"):
        CardHead.load(path, head.config, head.embeddings)


def test_a_full_u_head_with_bad_token_ids_is_one_line(tmp_path: Path) -> None:
    config = HeadConfig(d=2, layers=(0,), u="full")
    path = tmp_path / "head.safetensors"
    rows = np.ones((3, 2), np.float32)
    good = {"P": np.ones((2, 4), np.float32), "default_vectors": np.zeros((2, 2), np.float32), "U_rows": rows}
    save_file({**good, "U_ids": np.array([0, 5, 9])}, str(path))
    assert CardHead.load(path, config, None).u_rows([5]).tolist() == [[1.0, 1.0]]
    for ids, message in (([0, -5, 9], "negative token id"), ([0, 5], "one token id per row")):
        save_file({**good, "U_ids": np.array(ids)}, str(path))
        with pytest.raises(LocalpersError, match=f"'U_ids'.*{message}"):
            CardHead.load(path, config, None)


@pytest.mark.parametrize(
    ("centroids", "message"),
    [
        (np.zeros((3, 7), np.float32), r"centroids have shape \(3, 7\), the bundle needs \(3, 384\)"),
        (np.zeros((2, 384), np.float32), r"centroids have shape \(2, 384\), the bundle needs \(3, 384\)"),
        (np.zeros(384, np.float32), r"centroids have shape \(384,\), the bundle needs \(3, 384\)"),
        (np.full((3, 384), np.nan, np.float32), "centroids hold values that are not finite numbers"),
    ],
)
def test_centroids_that_cannot_assign_a_cluster_are_one_line_naming_the_file(
    tmp_path: Path, centroids: np.ndarray, message: str
) -> None:
    path = tmp_path / "centroids.safetensors"
    save_file({"centroids": np.ones((3, 384), np.float32)}, str(path))
    assert read_centroids(path, k=3).shape == (3, 384)
    save_file({"centroids": centroids}, str(path))
    with pytest.raises(LocalpersError, match=f"centroids.safetensors: {message}"):
        read_centroids(path, k=3)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("d", 0, r"'head.d' is 0; it must be from 1 to 4096"),
        ("d", 1e400, r"'head' is malformed"),
        ("layers", [], r"'head.layers' is \[\]"),
        (
            "layers",
            [15, 14],
            r"'head.layers' is \[15, 14\]; it must list layer numbers >= 0 in increasing order",
        ),
        ("layers", [-1, 3], r"'head.layers' is \[-1, 3\]"),
        ("layers", [3, 3], r"'head.layers' is \[3, 3\]"),
        ("top_k", 10**9, r"'head.top_k' is 1000000000; it must be from 1 to 1000"),
        ("top_k", 0, r"'head.top_k' is 0"),
        ("alpha", 1e308, r"'head.alpha' is 1e\+308; it must be from 0 to 100\b"),
        ("alpha", float("nan"), r"'head.alpha' is nan"),
        ("strength", -0.5, r"'head.strength' is -0.5"),
    ],
)
def test_head_fields_no_head_can_serve_are_refused_in_one_line(
    field: str, value: object, message: str
) -> None:
    entry = {**HeadConfig(d=8, layers=(14, 15, 16, 17), alpha=0.07).to_manifest(), field: value}
    with pytest.raises(LocalpersError, match=f"bundle manifest field {message}"):
        HeadConfig.from_manifest(entry)


def test_a_head_strength_a_stored_choice_could_not_hold_is_refused_with_the_bundle() -> None:
    """`head.strength` and `head.alpha` went up to 1000 while a stored choice's vector strength over 100 is damaged:
    with such a bundle every rewrite called the user's fit damaged, and a refit stored the same strength again
    (eighty-ninth session's methods audit, L1). One bound now: the bundle is refused where it is checked."""
    import json

    from localpers.methods.bounds import MAX_STRENGTH
    from localpers.methods.card.choice import CANDIDATES, Choice, stored_choice

    entry = HeadConfig(d=8, layers=(14, 15, 16, 17), alpha=0.07).to_manifest()
    for field in ("strength", "alpha"):
        with pytest.raises(LocalpersError, match=rf"'head.{field}' is 150.0; it must be from 0 to 100\b"):
            HeadConfig.from_manifest({**entry, field: MAX_STRENGTH * 1.5})
    config = HeadConfig.from_manifest({**entry, "strength": MAX_STRENGTH})  # the largest a bundle may state
    for candidate in CANDIDATES:  # every choice a fit on it can store reads back
        strength = candidate.vector_scale * config.default_strength
        choice = Choice(candidate.label, strength, candidate.bias_strength, {}, 3, "it scored best")
        assert stored_choice({"choice": choice.to_json()}) == (
            strength,
            candidate.bias_strength,
            candidate.label,
        )
    shipped = Path(__file__).resolve().parents[1] / "models" / "demo-bundle" / "manifest.json"
    assert (
        HeadConfig.from_manifest(json.loads(shipped.read_text(encoding="utf-8"))["head"]).default_strength < 1
    )


def test_a_head_tapping_layers_the_backbone_lacks_is_refused() -> None:
    config = HeadConfig.from_manifest(HeadConfig(d=8, layers=(14, 15, 16, 40)).to_manifest())
    config.check_backbone(41)
    with pytest.raises(
        LocalpersError, match=r"'head.layers' names layer 40, but the backbone has 18 \(0-17\)"
    ):
        config.check_backbone(18)


def test_publish_refuses_a_calibrated_alpha_over_what_a_bundle_may_state() -> None:
    """A head whose mean token correction is tiny calibrated to an alpha over MAX_STRENGTH: the publish went on
    through SFT and the head, and the bundle it wrote was refused by every device (and by its own last stage)."""
    from localpers.errors import InputError
    from localpers.publish.head_training import calibrated_alpha

    assert calibrated_alpha(1.0, 0.5) == 2.0
    assert calibrated_alpha(1.0, 0.01) == 100.0  # exactly the bound is what a bundle may state
    with pytest.raises(InputError, match=r"alpha would be 200 .*--head-target-correction 0\.5 or less"):
        calibrated_alpha(1.0, 0.005)
