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
