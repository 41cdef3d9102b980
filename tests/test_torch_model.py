"""The torch backbone's config is read from the GGUF once per backbone and transformers version, then cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localpers.engine.backbone import Backbone
from localpers.paths import cache_dir


def test_backbone_config_is_read_once_then_served_from_the_cache(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from localpers.engine import torch_model

    first = torch_model.backbone_config(backbone.path)  # reads the GGUF's metadata (seconds)
    cached = cache_dir() / "backbones" / f"{backbone.sha256[:32]}.transformers-config.json"
    assert json.loads(cached.read_text())["transformers"] == transformers.__version__

    reads: list[Path] = []

    def read_gguf(*args: object, **kwargs: object) -> object:
        reads.append(Path(str(args[0])))
        return first

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", read_gguf)
    again = torch_model.backbone_config(backbone.path)
    assert reads == []
    assert type(again) is type(first) and again.to_dict() == first.to_dict()
    assert again.vocab_size == 262144 and again.num_hidden_layers == 18

    # a config written by another transformers version, or a damaged file, is read again and rewritten
    saved = json.loads(cached.read_text())
    cached.write_text(json.dumps({**saved, "transformers": "0.0.1"}))
    torch_model.backbone_config(backbone.path)
    cached.write_text("{not json")
    torch_model.backbone_config(backbone.path)
    assert len(reads) == 2
    assert json.loads(cached.read_text())["transformers"] == transformers.__version__


def test_the_backbone_read_past_transformers_loader_is_the_model_transformers_loads(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from localpers.engine import torch_model

    config = torch_model.backbone_config(backbone.path)

    # with the config cached, nothing parses the GGUF header with gguf's reader (~10 s for this vocabulary)
    def no_header_walk(*args: object, **kwargs: object) -> object:
        raise AssertionError("GGUFReader built by the load from the layout")

    monkeypatch.setattr(gguf, "GGUFReader", no_header_walk)
    random_state = torch.get_rng_state()
    fast = torch_model._load_from_layout(backbone.path, config)
    monkeypatch.undo()
    assert fast is not None
    # the publisher seeds its LoRA initialisation after the load: loading must not draw random numbers
    assert torch.equal(torch.get_rng_state(), random_state)
    reference = torch_model._load_with_transformers(backbone.path, config)
    assert type(fast) is type(reference) and fast.training == reference.training
    fast_state, reference_state = fast.state_dict(), reference.state_dict()
    assert fast_state.keys() == reference_state.keys()
    assert all(torch.equal(fast_state[name], reference_state[name]) for name in fast_state)
    fast_buffers, reference_buffers = dict(fast.named_buffers()), dict(reference.named_buffers())
    assert fast_buffers.keys() == reference_buffers.keys()
    assert all(torch.equal(fast_buffers[name], reference_buffers[name]) for name in fast_buffers)
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()  # tied, as Gemma's are
    ids = torch.tensor([[2, 651, 3433, 1322, 236761, 1401]])
    with torch.no_grad():
        assert torch.equal(fast(ids).logits, reference(ids).logits)
