"""The publisher's reproducibility and integrity (a second audit of `localpers publish`).

Each test is a case that failed before: a resumed SFT run whose dropout masks restarted from step 0's random
state (other weights than an uninterrupted run); stage keys that hashed the corpus file after it was parsed, and
tasks in other processes that read it again unchecked (an edit during a publish mixed two corpora); a cached
fresh LoRA start that kept the first seed's for a second publish in one process; stage JSON files renamed into
place unsynced, and an empty per-user pairs file or adapter record that failed its stage instead of being redone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from file_events import record_fsyncs_and_renames
from rich.console import Console

from localpers.publish.corpus import Corpus
from localpers.publish.options import PublishOptions
from localpers.publish.runner import PublishContext


def _context(root: Path, **changes: object) -> PublishContext:
    options = PublishOptions(
        corpus=root / "corpus.jsonl",
        out=root / "out",
        lr=1e-2,
        batch_size=4,
        checkpoint_every=2,
        seed=0,
        **changes,  # type: ignore[arg-type]
    )
    return PublishContext(
        options=options,
        corpus=Corpus(root / "corpus.jsonl", ()),
        backbone_path=root / "backbone.gguf",
        backbone_sha256="0" * 64,
        console=Console(stderr=True, quiet=True),
        log_file=root / "publish.log",
    )


def _tiny_llama_config(transformers: Any, layers: int) -> Any:
    """A random Llama's config small enough to train in a test: vocabulary 64, width 32, 2 heads."""
    return transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def _tiny_lora_model(dropout: float) -> tuple[Any, dict[str, Any], list[Any]]:
    """A 2-layer random Llama with a LoRA of `dropout`, its fresh LoRA state, and 24 random examples."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from localpers.engine import torch_model
    from localpers.engine.torch_model import Example

    torch.manual_seed(0)
    config = _tiny_llama_config(transformers, layers=2)
    model = torch_model.wrap_lora(
        transformers.LlamaForCausalLM(config), 4, 8.0, dropout, ("attn_q", "attn_v", "ffn_up")
    )
    generator = torch.Generator().manual_seed(1)
    examples = [
        Example(
            prompt=tuple(torch.randint(1, 64, (6,), generator=generator).tolist()),
            target=tuple(torch.randint(1, 64, (3,), generator=generator).tolist()),
            user=i % 3,
        )
        for i in range(24)
    ]
    return model, torch_model.lora_state(model), examples


class _Killed(BaseException):
    """A kill right after a checkpoint was written."""


def _train_killed_after_step(
    monkeypatch: pytest.MonkeyPatch, kill_step: int, train: Any, *, drop_rng: bool = False
) -> None:
    from localpers.publish import sft

    real_save = sft._save_checkpoint

    def save_then_die(path: Path, model: Any, *rest: Any) -> None:
        real_save(path, model, *rest)
        if rest[2] == kill_step:  # (optimizer, scheduler, step, ...)
            if drop_rng:  # as a checkpoint written before the random states were saved
                import torch

                saved = torch.load(path, weights_only=False)
                del saved["rng"]
                torch.save(saved, path)
            raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(sft, "_save_checkpoint", save_then_die)
        with pytest.raises(_Killed):
            train()


@pytest.mark.slow
def test_a_resumed_sft_run_with_dropout_trains_the_weights_of_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from localpers.publish import sft

    model, fresh, examples = _tiny_lora_model(dropout=0.05)
    context = _context(tmp_path)
    steps = 6

    def train(folder: str) -> dict[str, Any]:
        return sft.train_adapter(context, model, "global", examples, steps, fresh, "fp32", tmp_path / folder)

    train("whole")
    _train_killed_after_step(monkeypatch, 2, lambda: train("resumed"))
    train("resumed")
    whole = torch.load(tmp_path / "whole" / "lora.pt")
    resumed = torch.load(tmp_path / "resumed" / "lora.pt")
    assert "global: resuming at step 2/6" in context.log_file.read_text()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)

    # a checkpoint from before the random states were saved still resumes, and the log says what differs
    _train_killed_after_step(monkeypatch, 4, lambda: train("old"), drop_rng=True)
    record = train("old")
    assert record["steps"] == steps and len(record["train_loss"]) == steps
    assert "predates saved random states" in context.log_file.read_text()


def _write_users(path: Path, tag: str) -> Path:
    rows = [{"user_id": user, "history": [{"input": "x", "output": f"{tag} {user}"}]} for user in "ab"]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_stage_keys_hash_the_corpus_bytes_that_were_parsed(tmp_path: Path) -> None:
    from localpers.publish.corpus import load_corpus
    from localpers.publish.runner import run_stages, stage_key

    path = _write_users(tmp_path / "corpus.jsonl", "v1")
    parsed = hashlib.sha256(path.read_bytes()).hexdigest()
    context = _context(tmp_path)
    context.corpus = load_corpus(path, min_users=2)
    _write_users(path, "v2-edited")  # edited after the parse, before the stages are keyed
    run_stages(context, {"clusters": lambda *_: {}}, until="clusters")
    expected = stage_key(context.options, "clusters", {"corpus": parsed, "backbone": context.backbone_sha256})
    assert context.keys["clusters"] == expected


def test_a_task_refuses_a_corpus_that_changed_during_the_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.errors import LocalpersError
    from localpers.publish import runner
    from localpers.publish.corpus import load_corpus

    monkeypatch.setattr(runner, "threadpool_limits", lambda **_: None)  # not this test process's BLAS threads
    monkeypatch.setattr(runner, "_corpora", {})
    path = _write_users(tmp_path / "corpus.jsonl", "v1")
    context = _context(tmp_path)
    context.corpus = load_corpus(path, min_users=2)
    spec = context.spec()
    runner._local_contexts.clear()  # as in another process (a Ray worker), which reads the corpus itself
    assert runner.task_context(spec).corpus.users[0].history[0].output == "v1 a"

    monkeypatch.setattr(runner, "_corpora", {})
    _write_users(path, "v2-edited")
    with pytest.raises(LocalpersError) as refused:
        runner.task_context(spec)
    message = str(refused.value)
    assert str(path) in message and "the corpus changed during the publish; run it again" in message
    assert "\n" not in message


def test_the_fresh_lora_start_follows_the_seed_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from localpers.engine import torch_model

    monkeypatch.setattr(torch_model, "_cache", {})
    monkeypatch.setattr(torch_model, "_fresh_states", {})
    config = _tiny_llama_config(transformers, layers=1)
    backbones: dict[str, Any] = {}

    def load_backbone(path: Path, device: str = "cpu") -> Any:
        if str(path) not in backbones:  # drawn from the global generator, as a first load does
            backbones[str(path)] = transformers.LlamaForCausalLM(config)
        return backbones[str(path)]

    monkeypatch.setattr(torch_model, "load_backbone", load_backbone)
    shape = (4, 8.0, 0.05, ("attn_q",))
    backbone = Path("backbone.gguf")

    def fresh(seed: int) -> dict[str, Any]:
        torch.manual_seed(
            1000 + seed
        )  # whatever the global generator held before: not what the start is drawn from
        torch_model.shared_lora_model(backbone, *shape, seed=seed)
        return torch_model.fresh_lora_state(backbone, *shape, seed=seed)

    first, second, first_again = (
        fresh(0),
        fresh(1),
        fresh(0),
    )  # two publishes in one process, then the first again
    a_matrices = [name for name in first if "lora_A" in name]
    assert a_matrices
    assert not any(torch.equal(first[name], second[name]) for name in a_matrices)
    assert all(torch.equal(first[name], first_again[name]) for name in first)


def test_stage_json_files_are_on_disk_before_they_are_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from localpers.publish.runner import write_json_atomic

    events = record_fsyncs_and_renames(monkeypatch)
    target = tmp_path / "sft" / "record.json"
    write_json_atomic(target, {"steps": 2})
    assert json.loads(target.read_text()) == {"steps": 2}
    assert "replace" in events and "fsync" in events[: events.index("replace")]
    assert [path.name for path in target.parent.iterdir()] == ["record.json"]  # no temp file left


def test_a_damaged_pairs_user_file_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.publish import pairs
    from localpers.publish.corpus import load_corpus

    context = _context(tmp_path)
    context.corpus = load_corpus(_write_users(tmp_path / "corpus.jsonl", "v1"), min_users=2)
    monkeypatch.setattr(pairs, "load_assignment", lambda _: {"users": [{"cluster": 0, "val": []}] * 2})
    directory = context.stage_dir("pairs")
    directory.mkdir(parents=True)
    done = {"user": 0, "user_id": "a", "cluster": 0, "pairs": [{"item": 0, "chosen": "y", "rejected": "n"}]}
    pairs.user_file(directory, 0).write_text(json.dumps(done))
    pairs.user_file(directory, 1).write_text(
        ""
    )  # as a power cut could leave a file renamed before it was synced
    made: list[int] = []

    def shard(spec: Any, rows: list[tuple[int, int, list[int]]]) -> dict[str, float]:
        for index, cluster, _ in rows:
            made.append(index)
            pairs.write_json_atomic(
                pairs.user_file(directory, index),
                {"user": index, "user_id": "b", "cluster": cluster, "pairs": []},
            )
        return {"generated": 1, "skipped": 1, "new_tokens": 0, "decode_seconds": 0.0}

    monkeypatch.setattr(pairs, "pairs_shard", shard)
    summary = pairs.run(context, directory)
    assert made == [1] and summary["users"] == 2 and summary["pairs"] == 1
    assert f"{pairs.user_file(directory, 1)}: damaged" in context.log_file.read_text()


def test_a_damaged_adapter_record_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.engine import torch_model
    from localpers.publish import sft_stage

    context = _context(tmp_path)
    directory = context.stage_dir("sft")
    (directory / "global").mkdir(parents=True)
    (directory / "val_backbone.json").write_text("{}")
    (directory / "global" / "record.json").write_text('{"steps": 2, "train_lo')  # cut short
    monkeypatch.setattr(sft_stage, "prepared", lambda _: (None, {}, [], [], [0, 0]))
    trained: list[str] = []

    def train_adapter(context: Any, model: Any, name: str, *rest: Any) -> dict[str, Any]:
        trained.append(name)
        return {"steps": 1, "examples": 0, "train_loss": [0.5], "tokens": 0, "tokens_per_second": 0.0}

    monkeypatch.setattr(sft_stage, "train_adapter", train_adapter)
    monkeypatch.setattr(sft_stage, "evaluate", lambda *_: {})
    monkeypatch.setattr(torch_model, "model_device", lambda _: "cpu")
    record = sft_stage.adapter_task(context.spec(), "global", "fp32")
    assert trained == ["global"] and record["train_loss"] == [0.5]
    assert json.loads((directory / "global" / "record.json").read_text())["train_loss"] == [0.5]
    assert "record.json: damaged" in context.log_file.read_text()
    again = sft_stage.adapter_task(context.spec(), "global", "fp32")  # a whole record: not trained again
    assert again["train_loss"] == [0.5] and trained == ["global"]
