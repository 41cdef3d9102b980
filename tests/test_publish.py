"""The publisher end to end on a tiny synthetic corpus, its resume behaviour, and the head maths.

One module-scoped publish (the fp32 backbone takes ~40 s to load in transformers; it is loaded once):
6 users in 2 styles, K=2, rank-2 LoRA, 2 SFT steps per adapter, 2 pairs per user, a D=16 head.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("gguf")

from localpers.bundle.format import sha256_of_file  # noqa: E402
from localpers.engine.backbone import resolve_backbone  # noqa: E402
from localpers.engine.token_embeddings import TokenEmbeddings  # noqa: E402
from localpers.methods.card.head import CardHead, normalise_features  # noqa: E402
from localpers.methods.card.head_spec import HeadConfig  # noqa: E402
from localpers.publish.options import STAGES, PublishOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_corpus import write_corpus  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backbone_path() -> Path:
    return Path(resolve_backbone().path)


def _tiny_options(root: Path, backbone_path: Path, **settings: object) -> PublishOptions:
    """A publish of the synthetic corpus small enough for a test (2 clusters, rank 2, a 16-wide head)."""
    return PublishOptions(
        corpus=write_corpus(root / "corpus.jsonl"),
        out=root / "bundle",
        model=str(backbone_path),
        k=2,
        rank=2,
        lora_alpha=4.0,
        batch_size=4,
        precision="fp32",
        pairs_per_user=2,
        head_d=16,
        threads=2,
        engine_threads=2,
        **settings,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, backbone_path: Path) -> dict:
    """Publish in two goes (up to `pairs`, then the rest) and record what the first go left behind."""
    import os

    from localpers.publish.pipeline import publish

    root = tmp_path_factory.mktemp("publish")
    previous_home = os.environ.get("LOCALPERS_HOME")
    os.environ["LOCALPERS_HOME"] = str(root / "home")
    try:
        options = _tiny_options(root, backbone_path, max_steps=2, checkpoint_every=1, head_steps=15)
        first = publish(options, until="pairs")
        manifest_after_first = (options.out / "manifest.json").exists()
        markers = {s: (options.work_dir / s / "done.json").stat().st_mtime_ns for s in first["stages"]}
        log_before = (options.work_dir / "publish.log").read_text()
        second = publish(options)
        log = (options.work_dir / "publish.log").read_text()[len(log_before) :]
        yield {
            "options": options,
            "first": first,
            "second": second,
            "markers": markers,
            "manifest_after_first": manifest_after_first,
            "log": log,
        }
    finally:
        if previous_home is None:
            os.environ.pop("LOCALPERS_HOME", None)
        else:
            os.environ["LOCALPERS_HOME"] = previous_home


def test_first_go_stops_after_pairs_and_has_no_manifest(published: dict) -> None:
    assert list(published["first"]["stages"]) == list(STAGES[: STAGES.index("pairs") + 1])
    assert not published["manifest_after_first"]
    assert list(published["second"]["stages"]) == list(STAGES)


def test_resume_reuses_finished_stages(published: dict) -> None:
    work = published["options"].work_dir
    for stage, mtime in published["markers"].items():
        assert (work / stage / "done.json").stat().st_mtime_ns == mtime, stage
        assert f"stage {stage}: cached" in published["log"]
    for stage in ("features", "head", "bundle"):
        assert f"stage {stage}: done in" in published["log"]


def test_a_rerun_with_another_out_installs_the_bundle_there_and_out_inside_work_is_refused(
    published: dict, tmp_path: Path
) -> None:
    # the bundle stage was cached: the run said "wrote B" and B did not exist (publish audit)
    import dataclasses

    from localpers.bundle.format import verify_bundle
    from localpers.errors import InputError
    from localpers.publish.pipeline import publish

    options = published["options"]
    elsewhere = dataclasses.replace(options, out=tmp_path / "B", work=options.work_dir)
    result = publish(elsewhere)
    assert verify_bundle(tmp_path / "B") is not None
    assert result["stages"]["bundle"]["manifest_sha256"] == sha256_of_file(tmp_path / "B" / "manifest.json")
    log = (options.work_dir / "publish.log").read_text()
    assert "stage bundle: what it made is no longer where it put it" in log
    # an --out among the stage folders was removed by a rerun whose inputs changed, before the new bundle's check
    for inside in (options.work_dir / "bundle", options.work_dir):
        with pytest.raises(InputError, match="is inside --work"):
            publish(dataclasses.replace(options, out=inside, work=options.work_dir))


def test_manifest_lists_every_bundle_file_with_its_hash(published: dict) -> None:
    out = published["options"].out
    manifest = json.loads((out / "manifest.json").read_text())
    on_disk = {
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.is_file() and ".work" not in p.parts and p.name != "manifest.json"
    }
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_of_file(out / name)
        assert entry["size"] == (out / name).stat().st_size
    assert manifest["format"] == "localpers-bundle" and manifest["format_version"] == 1
    assert set(manifest["adapters"]) == {"global", "cluster-0", "cluster-1"}
    assert all(path in manifest["files"] for path in manifest["adapters"].values())
    assert manifest["clusters"]["k"] == 2 and sum(manifest["clusters"]["sizes"]) == 6
    assert manifest["data_card"]["users"] == 6 and manifest["data_card"]["items"] == 36
    # a corpus nobody described is not claimed to be the demo's (every bundle said HuffPost, CC BY 4.0)
    assert manifest["data_card"]["source"] == "corpus.jsonl (not described: --data-source)"
    assert manifest["data_card"]["licence"] == "not stated (--data-licence)"
    assert manifest["backbone"]["sha256"] == resolve_backbone(published["options"].model).sha256
    assert {"plots/sft_loss.png", "plots/head_accuracy.png"} <= on_disk
    assert set(manifest["training"]["stage_seconds"]) >= set(STAGES[:-1])
    accuracy = manifest["training"]["head_pair_accuracy"]
    assert set(accuracy) >= {"own_lambda", "cluster_default", "global_default", "device_refit"}


def test_sft_lowered_validation_loss_and_export_matches_torch(published: dict) -> None:
    manifest = json.loads((published["options"].out / "manifest.json").read_text())
    val = manifest["training"]["val_loss"]
    assert val["global"]["val_loss"] < val["global"]["val_loss_backbone"]
    for name, check in manifest["training"]["export_check"].items():
        assert check["logprob_correlation"] > 0.9, name
        assert check["mean_abs_logprob_shift"] > 0.01, name


def test_head_and_centroids_load(published: dict, backbone_path: Path) -> None:
    from safetensors.numpy import load_file

    out = published["options"].out
    manifest = json.loads((out / "manifest.json").read_text())
    head = CardHead.load(
        out / "head.safetensors", HeadConfig.from_manifest(manifest["head"]), TokenEmbeddings(backbone_path)
    )
    assert head.P.shape == (16, 4 * 640) and head.Q.shape == (640, 16)
    assert head.default_vectors.shape == (3, 16)
    centroids = load_file(str(out / "centroids.safetensors"))["centroids"]
    assert centroids.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, rtol=1e-5)


def test_bundle_adapters_change_engine_outputs(published: dict, backbone_path: Path) -> None:
    from localpers.engine import Engine
    from localpers.tasks import get_task

    out = published["options"].out
    manifest = json.loads((out / "manifest.json").read_text())
    engine = Engine(backbone_path, tap_layers=None, n_ctx=256, n_threads=2)
    try:
        prompt = engine.tokenize(
            get_task("headline").prompt_for("Reporter 0 says heavy rain flooded streets.")
        )
        target = engine.tokenize(" BREAKING: HEAVY RAIN FLOODS STREETS!", add_bos=False)
        base = engine.score(prompt, [target])[0].logprobs
        for name, path in manifest["adapters"].items():
            engine.load_adapter(out / path, name)
            engine.set_adapter(name)
            adapted = engine.score(prompt, [target])[0].logprobs
            assert np.abs(adapted - base).mean() > 0.01, name
            engine.set_adapter(None)
    finally:
        engine.close()


def test_from_stage_recomputes_only_that_stage_and_later(published: dict) -> None:
    from localpers.publish.pipeline import publish

    options = published["options"]
    work = options.work_dir
    before = {s: (work / s / "done.json").stat().st_mtime_ns for s in STAGES}
    publish(options, from_stage="head")
    after = {s: (work / s / "done.json").stat().st_mtime_ns for s in STAGES}
    for stage in STAGES[: STAGES.index("head")]:
        assert after[stage] == before[stage], stage
    for stage in ("head", "bundle"):
        assert after[stage] != before[stage], stage
    assert (options.out / "manifest.json").exists()


def test_from_stage_with_until_discards_the_stages_after_until_and_no_pairs_is_one_line(
    published: dict, tmp_path: Path
) -> None:
    # the stages after --until kept their caches, made from the old stages, and the next run reused them
    import dataclasses
    import shutil

    from localpers.errors import LocalpersError
    from localpers.publish.pipeline import publish

    options = published["options"]
    work = tmp_path / "work"
    shutil.copytree(options.work_dir, work)
    copy = dataclasses.replace(options, work=work, out=tmp_path / "out")
    publish(copy, from_stage="head", until="head")
    assert (work / "head" / "done.json").exists() and not (work / "bundle").exists()
    # every pair skipped (each y- empty or the author's own headline): the head's stage ended in a numpy traceback
    for path in (work / "pairs").glob("user-*.json"):
        record = json.loads(path.read_text())
        record["pairs"] = []
        path.write_text(json.dumps(record))
    with pytest.raises(LocalpersError, match="no preference pairs to train the head on"):
        publish(copy, from_stage="features")


def test_a_bundle_devices_would_refuse_is_not_installed(published: dict) -> None:
    """A head stage that left NaN in the head: the bundle stage refuses to install it, OUT keeps its bundle."""
    from safetensors.numpy import load_file, save_file

    from localpers.errors import LocalpersError
    from localpers.publish.head_training import HEAD_FILE
    from localpers.publish.pipeline import publish

    options = published["options"]
    head = options.work_dir / "head" / HEAD_FILE
    manifest_before = (options.out / "manifest.json").read_bytes()
    original = head.read_bytes()
    tensors = load_file(str(head))
    tensors["P"][0, 0] = np.nan
    save_file(tensors, str(head))
    try:
        with pytest.raises(LocalpersError, match="devices would refuse") as refused:
            publish(options, from_stage="bundle")
    finally:
        head.write_bytes(original)
    message = str(refused.value)
    assert "head.safetensors" in message and "not finite" in message and "--from-stage" in message
    assert "re-pull" not in message and "\n" not in message
    assert (options.out / "manifest.json").read_bytes() == manifest_before


def test_interrupted_sft_resumes_from_its_checkpoint(published: dict) -> None:
    """Drop the last adapter's final weights and the stage marker, as a kill after a checkpoint would."""
    from localpers.publish.pipeline import publish

    options = published["options"]
    sft_dir = options.work_dir / "sft"
    adapter = sft_dir / "cluster-1"
    saved = (adapter / "lora.pt").read_bytes()
    (adapter / "lora.pt").unlink()
    (adapter / "record.json").unlink()
    (sft_dir / "done.json").unlink()
    global_mtime = (sft_dir / "global" / "lora.pt").stat().st_mtime_ns
    log_file = options.work_dir / "publish.log"
    offset = len(log_file.read_text())
    publish(options, until="sft")
    log = log_file.read_text()[offset:]
    assert "stage sft: resuming an interrupted run" in log
    assert "cluster-1: resuming at step 2/2" in log
    assert (sft_dir / "global" / "lora.pt").stat().st_mtime_ns == global_mtime
    assert (adapter / "lora.pt").exists() and (sft_dir / "done.json").exists()
    # resumed at its last step from the checkpoint: the same weights as the run that was not interrupted
    import io

    import torch

    before = torch.load(io.BytesIO(saved), map_location="cpu", weights_only=False)
    after = torch.load(adapter / "lora.pt", map_location="cpu", weights_only=False)
    flat_before, flat_after = _tensors(before), _tensors(after)
    assert flat_before.keys() == flat_after.keys() and flat_before
    assert all(torch.equal(flat_before[name], flat_after[name]) for name in flat_before)


def test_a_publish_without_validation_items_checks_its_adapters_on_training_items(
    tmp_path: Path, backbone_path: Path
) -> None:
    """`--val-fraction 0` (an allowed value) printed "val loss nan" for every adapter, then the export's check of
    each adapter against torch ended in a traceback: it had no held-out item to score."""
    from localpers.publish.pipeline import publish

    options = _tiny_options(tmp_path, backbone_path, max_steps=1, head_steps=2, val_fraction=0.0)
    publish(options, until="export")
    log = (options.work_dir / "publish.log").read_text()
    assert "no validation items" in log and "val loss nan" not in log
    check = json.loads((options.work_dir / "export" / "global.check.json").read_text())
    assert check["mean_abs_logprob_shift"] > 0


def test_torch_sequence_feature_equals_card_head(backbone_path: Path) -> None:
    import torch

    from localpers.publish.head_training import sequence_features

    rng = np.random.default_rng(0)
    embeddings = TokenEmbeddings(backbone_path)
    tokens = np.array([2, 1000, 5000, 42, 262000])
    raw = (
        rng.normal(0, 3, size=(len(tokens), 4, 640)).astype(np.float32)
        * np.array([1, 10, 100, 1000])[None, :, None]
    )
    P = rng.normal(0, 0.02, size=(8, 4 * 640)).astype(np.float32)
    Q = rng.normal(0, 0.5, size=(640, 8)).astype(np.float32)
    for length_normalised in (False, True):
        config = HeadConfig(d=8, alpha=0.7, length_normalised=length_normalised)
        head = CardHead(config, P, np.zeros((2, 8), np.float32), factor_q=Q, embeddings=embeddings)
        expected = head.sequence_feature(tokens, raw)
        got = sequence_features(
            torch.from_numpy(P),
            torch.from_numpy(Q),
            torch.from_numpy(normalise_features(raw)),
            torch.from_numpy(embeddings.rows(tokens)),
            torch.zeros(len(tokens), dtype=torch.long),
            1,
            torch.tensor([len(tokens)]),
            config.alpha,
            length_normalised,
        )[0].numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_peft_names_map_to_gguf_names() -> None:
    import torch

    from localpers.errors import LocalpersError
    from localpers.publish.export import gguf_tensors

    state = {
        "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight": torch.ones(2, 640),
        "base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight": torch.ones(1024, 2),
        "base_model.model.model.layers.17.mlp.down_proj.lora_A.weight": torch.ones(2, 2048),
        "base_model.model.model.layers.17.mlp.down_proj.lora_B.weight": torch.ones(640, 2),
    }
    tensors = gguf_tensors(state, 18)
    assert set(tensors) == {"blk.3.attn_q.weight", "blk.17.ffn_down.weight"}
    assert tensors["blk.3.attn_q.weight"][0].shape == (2, 640)
    assert tensors["blk.3.attn_q.weight"][1].shape == (1024, 2)
    with pytest.raises(LocalpersError, match="lacks A or B"):
        gguf_tensors({k: v for k, v in state.items() if "lora_B" not in k or "layers.3" not in k}, 18)


def test_cli_reports_a_bad_corpus_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"user_id": "a", "history": [{"input": "x", "output": "y"}]}\n{"user_id": "b"}\n')
    result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(tmp_path / "b"), "--k", "2"])
    assert result.exit_code == 2  # a malformed file from outside
    assert "bad.jsonl:2: user 'b' has no 'history' field" in result.output
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_cli_passes_the_data_card_a_publisher_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bundle's data card said "HuffPost News Category Dataset v3 ... (CC BY 4.0)" whatever the corpus,
    and no option changed it (publisher audit, eightieth session)."""
    from typer.testing import CliRunner

    from localpers.cli import app
    from localpers.publish import pipeline

    given: list[PublishOptions] = []
    monkeypatch.setattr(
        pipeline, "publish", lambda options, **_: given.append(options) or {"stages": {}, "stage_seconds": {}}
    )
    corpus = write_corpus(tmp_path / "mine.jsonl")
    command = ["publish", str(corpus), "--out", str(tmp_path / "b"), "--executor", "sequential"]
    described = ["--data-source", "My newsroom's headlines, 2024", "--data-licence", "proprietary"]
    assert CliRunner().invoke(app, [*command, *described]).exit_code == 0
    assert (given[-1].data_source, given[-1].data_licence) == ("My newsroom's headlines, 2024", "proprietary")
    assert CliRunner().invoke(app, command).exit_code == 0
    assert given[-1].data_source is None and given[-1].data_licence is None


def test_publish_json_with_a_repository_gives_its_expiry_dates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SECURITY.md says every signing command gives each role's expiry date; `publish --repo --json` gave only
    the repository's path and targets version (publisher audit, eightieth session)."""
    from test_serve_pull import make_bundle
    from typer.testing import CliRunner

    from localpers.bundle.keys import generate_keys
    from localpers.bundle.repository import init_repository
    from localpers.cli import app
    from localpers.publish import pipeline

    out = make_bundle(tmp_path / "bundle")  # what the stages would have written
    monkeypatch.setattr(
        pipeline, "publish", lambda options, **_: {"stages": {"bundle": {}}, "stage_seconds": {}}
    )
    generate_keys(tmp_path / "keys")
    init_repository(tmp_path / "repo", tmp_path / "keys")
    command = [
        "publish",
        str(write_corpus(tmp_path / "c.jsonl")),
        "--out",
        str(out),
        "--executor",
        "sequential",
    ]
    signing = ["--repo", str(tmp_path / "repo"), "--keys", str(tmp_path / "keys"), "--json"]
    result = CliRunner().invoke(app, [*command, *signing])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["ok"] is True  # as every other --json verdict (audit85)
    repository = shown["repository"]
    assert repository["targets_version"] == 2
    assert set(repository["expires"]) == {"root", "targets", "snapshot", "timestamp"}
    assert all(date.endswith("Z") for date in repository["expires"].values())


def test_cli_refuses_an_out_directory_a_publish_did_not_write(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app
    from localpers.errors import LocalpersError
    from localpers.publish.bundle_stage import check_output_directory

    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus)
    home = tmp_path / "home"
    (home / "plots").mkdir(parents=True)
    (home / "plots" / "holiday.png").write_bytes(b"a user's own plot")
    result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(home)])
    assert result.exit_code == 1
    assert f"--out {home} already holds files a publish did not write (plots)" in result.output
    assert (home / "plots" / "holiday.png").read_bytes() == b"a user's own plot" and not (
        home / ".work"
    ).exists()
    a_file = tmp_path / "c.jsonl"
    result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(a_file)])
    assert result.exit_code == 1 and "exists and is not a directory" in result.output
    # a new OUT that cannot be made was refused only at the end, when the trained bundle was installed
    absent_model = str(tmp_path / "absent.gguf")  # refused later, so the OUT check must come first
    result = CliRunner().invoke(
        app, ["publish", str(corpus), "--out", str(a_file / "bundle"), "--model", absent_model]
    )
    assert result.exit_code == 1, result.output
    assert f"--out {a_file / 'bundle'} cannot be made: {a_file} is a file, not a directory" in result.output
    for made in ("empty", "bundle", "interrupted"):
        (tmp_path / made).mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text('{"format": "localpers-bundle"}')
    (tmp_path / "interrupted" / ".work").mkdir()
    (tmp_path / "interrupted" / ".work" / "publish.log").write_text("earlier run\n")
    for fine in ("new", "empty", "bundle", "interrupted"):
        check_output_directory(tmp_path / fine)  # a rerun into its own directory, or a fresh one
    # A folder with a manifest.json of its own (a web app's) or an empty .work is not a publish's.
    webapp = tmp_path / "webapp"
    (webapp / "plots").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name": "My app", "start_url": "/"}')
    (webapp / "plots" / "chart.png").write_bytes(b"mine")
    result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(webapp)])
    assert result.exit_code == 1 and "already holds files a publish did not write" in result.output
    (tmp_path / "bare" / ".work").mkdir(parents=True)
    (tmp_path / "bare" / "plots").mkdir()
    with pytest.raises(LocalpersError, match="did not write"):
        check_output_directory(tmp_path / "bare")


def test_cli_refuses_a_work_directory_a_publish_did_not_write(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app
    from localpers.publish.runner import LOG_NAME, check_work_directory

    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus)
    projects = tmp_path / "projects"
    (projects / "export").mkdir(parents=True)  # a stage's name: its folder would be replaced
    (projects / "export" / "slides.pdf").write_bytes(b"the user's own file")
    result = CliRunner().invoke(
        app, ["publish", str(corpus), "--out", str(tmp_path / "b"), "--work", str(projects)]
    )
    assert result.exit_code == 1
    assert f"--work {projects} already holds files a publish did not write (export)" in result.output
    assert (projects / "export" / "slides.pdf").read_bytes() == b"the user's own file"
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / LOG_NAME).write_text("earlier run\n")
    (ours / "export").mkdir()
    check_work_directory(ours)  # an earlier publish's cache: a rerun resumes there
    check_work_directory(tmp_path / "new")


def test_cli_refuses_an_unknown_head_u_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app

    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus)
    out = tmp_path / "b"
    result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(out), "--head-u", "sparse"])
    assert result.exit_code == 2
    assert "--head-u must be 'factored' or 'full', not 'sparse'" in result.output
    assert not (out / ".work").exists()


def test_cli_refuses_bad_history_prompt_options_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from localpers.cli import app

    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus)
    out = tmp_path / "b"
    for flags, name in (
        (["--recent-examples", "4"], "--recent-examples 4 is more than --history-examples 0"),
        (["--history-examples", "3", "--described-examples", "5"], "--described-examples 5 is more than"),
        (["--example-pool", "later"], "--example-pool 'later': use 'earlier' or 'others'"),
    ):
        result = CliRunner().invoke(app, ["publish", str(corpus), "--out", str(out), *flags])
        assert result.exit_code == 2
        assert name in result.output
        assert not (out / ".work").exists()


def test_publish_options_refuse_more_recent_or_described_examples_than_history_examples(
    tmp_path: Path,
) -> None:
    from localpers.errors import LocalpersError
    from localpers.publish.options import PublishOptions

    PublishOptions(corpus=tmp_path / "c.jsonl", out=tmp_path, history_examples=5, recent_examples=4)
    for field in ("recent_examples", "described_examples"):
        with pytest.raises(
            LocalpersError, match=f"--{field.replace('_', '-')} 6 is more than --history-examples 5"
        ):
            PublishOptions(corpus=tmp_path / "c.jsonl", out=tmp_path, history_examples=5, **{field: 6})


def test_author_negative_pairs_stay_in_cluster_and_eligible_set() -> None:
    from localpers.publish.head_data import PairData, author_negative_pairs

    # users 0,1 in cluster 0; user 2 alone in cluster 1; 3 pairs each; pair 1 is held out
    pair_user = np.repeat([0, 1, 2], 3)
    data = PairData(
        features=np.zeros((0, 1), np.float16),
        tokens=np.zeros(0, np.int64),
        sequence=np.zeros(0, np.int64),
        lengths=np.zeros(18, np.int64),
        pair_user=pair_user,
        pair_cluster=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1]),
        user_ids=["a", "b", "c"],
        user_cluster=np.array([0, 0, 1]),
    )
    eligible = np.ones(9, dtype=bool)
    eligible[1] = False
    rows = author_negative_pairs(data, eligible, per_pair=2, seed=0)
    assert len(rows) == 5 * 2  # pairs 0,2 (user 0) and 3,4,5 (user 1); user 2 has no same-cluster peer
    for own, other in rows:
        assert eligible[own] and eligible[other]
        assert data.pair_cluster[own] == data.pair_cluster[other]
        assert pair_user[own] != pair_user[other]
    assert {int(p) for p in rows[:, 0]} == {0, 2, 3, 4, 5}
    assert len(author_negative_pairs(data, eligible, per_pair=0, seed=0)) == 0


def test_full_u_torch_head_matches_card_head(backbone_path: Path) -> None:
    import torch

    from localpers.publish.head_training import TorchHead, sequence_features

    rng = np.random.default_rng(1)
    embeddings = TokenEmbeddings(backbone_path)
    unique = np.array([7, 1000, 5000])
    tokens = np.array([1000, 7, 1000, 5000])
    index = torch.tensor([1, 0, 1, 2])
    raw = rng.normal(0, 3, size=(len(tokens), 4, 640)).astype(np.float32)
    head = TorchHead(4 * 640, torch.from_numpy(embeddings.rows(unique)), 8, 2, seed=0, full_u=True)
    assert head.U.shape == (3, 8) and head.U.requires_grad
    assert any(parameter is head.U for parameter in head.parameters())
    np.testing.assert_array_equal(
        head.token_inputs(None, index).detach().numpy(), head.U[index].detach().numpy()
    )
    config = HeadConfig(d=8, u="full", alpha=0.5)
    card = CardHead(
        config,
        head.P.detach().numpy(),
        np.zeros((2, 8), np.float32),
        u_ids=unique,
        u_rows=head.U.detach().numpy(),
    )
    got = sequence_features(
        head.P.detach(),
        head.Q,
        torch.from_numpy(normalise_features(raw)),
        head.token_inputs(None, index).detach(),
        torch.zeros(len(tokens), dtype=torch.long),
        1,
        torch.tensor([len(tokens)]),
        config.alpha,
        False,
    )[0].numpy()
    np.testing.assert_allclose(got, card.sequence_feature(tokens, raw), rtol=1e-4, atol=1e-5)


def test_pairs_and_features_are_the_same_under_ray(published: dict, ray_session, tmp_path: Path) -> None:
    """The published work directory, its pairs and features recomputed as Ray tasks (2-author shards)."""
    import dataclasses
    import shutil

    from localpers.publish.pipeline import publish

    options = published["options"]
    work = tmp_path / "work"
    shutil.copytree(options.work_dir, work)
    ray_options = dataclasses.replace(
        options, work=work, out=tmp_path / "bundle", executor="ray", shard_users=2
    )
    result = publish(ray_options, from_stage="pairs", until="features")
    assert result["executor"]["kind"] == "ray" and list(result["stages"])[-1] == "features"
    sequential_pairs = sorted((options.work_dir / "pairs").glob("user-*.json"))
    assert len(sequential_pairs) == 6
    for path in sequential_pairs:
        assert (work / "pairs" / path.name).read_text() == path.read_text(), path.name
    for path in sorted((options.work_dir / "features").glob("user-*.npz")):
        with np.load(path) as expected, np.load(work / "features" / path.name) as got:
            assert set(got.files) == set(expected.files)
            for name in expected.files:
                np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{path.name} {name}")


def _tensors(saved: object, prefix: str = "") -> dict:
    """Every tensor of a saved object (nested dicts, lists), by its path."""
    import torch

    if isinstance(saved, torch.Tensor):
        return {prefix: saved}
    if isinstance(saved, dict):
        return {k: v for key, value in saved.items() for k, v in _tensors(value, f"{prefix}/{key}").items()}
    if isinstance(saved, list | tuple):
        return {k: v for i, value in enumerate(saved) for k, v in _tensors(value, f"{prefix}/{i}").items()}
    return {}


def test_a_damaged_out_is_installed_again_not_reported_as_written(published: dict) -> None:
    """The cached bundle stage compared only OUT's manifest: a head file edited and an adapter deleted since, a
    rerun said "wrote OUT", exit 0, and `bundle verify` refused what it left (audit85 F2)."""
    from localpers.bundle.format import verify_bundle
    from localpers.publish.pipeline import publish

    options = published["options"]
    publish(
        options
    )  # every stage cached from here (an earlier test may have left the bundle stage unfinished)
    with (options.out / "head.safetensors").open("ab") as head:
        head.write(b"edited")
    (options.out / "adapters" / "cluster-1.gguf").unlink()
    log = options.work_dir / "publish.log"
    before = log.read_text()
    publish(options)
    assert "stage bundle: what it made is no longer where it put it" in log.read_text()[len(before) :]
    verify_bundle(options.out)


def test_a_damaged_stage_file_is_named_with_the_stage_that_mends_it(published: dict, tmp_path: Path) -> None:
    """A cut features file ended in a zipfile traceback and a cut lora.pt in torch's, naming no file, on every
    rerun (audit85)."""
    import dataclasses
    import shutil

    from localpers.errors import LocalpersError
    from localpers.publish.pipeline import publish

    options = published["options"]
    work = Path(shutil.copytree(options.work_dir, tmp_path / "work"))
    copy = dataclasses.replace(options, work=work, out=tmp_path / "out")
    features = sorted((work / "features").glob("user-*.npz"))[0]
    features.write_bytes(features.read_bytes()[:100])
    with pytest.raises(LocalpersError, match="unreadable stage file") as cut:
        publish(copy, from_stage="head")
    assert str(features) in str(cut.value) and "--from-stage features" in str(cut.value)
    lora = work / "sft" / "global" / "lora.pt"
    lora.write_bytes(lora.read_bytes()[:3000])
    with pytest.raises(LocalpersError, match="unreadable stage file") as cut:
        publish(copy, from_stage="export")
    assert str(lora) in str(cut.value) and "--from-stage sft" in str(cut.value)


def test_an_item_too_dense_for_the_context_is_left_out_of_the_pairs_not_the_stages_stop(
    published: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text that tokenizes densely (Amharic, hex, URLs: ~1,050-1,500 tokens within the character limits) passed
    the corpus checks and SFT (which trims), then stopped the pairs stage with "text too long", hours in and at
    every rerun (eighty-seventh session's publish audit). Here the context is made small instead."""
    import dataclasses
    import json
    import shutil

    import localpers.engine
    from localpers.publish.pipeline import publish

    options = published["options"]
    work = tmp_path / "work"
    shutil.copytree(options.work_dir, work)
    # the synthetic prompts are 24-27 tokens and y- gets 32: some items fit, some do not
    monkeypatch.setattr(localpers.engine, "CONTEXT_TOKENS", 57)
    result = publish(
        dataclasses.replace(options, work=work, out=tmp_path / "bundle"), from_stage="pairs", until="pairs"
    )
    summary = json.loads((work / "pairs" / "done.json").read_text(encoding="utf-8"))
    assert list(result["stages"])[-1] == "pairs"
    left_out = summary["summary"]["too_long_this_run"]
    assert 0 < left_out < 12, "the context should leave some items out, not all"
    log = (work / "publish.log").read_text(encoding="utf-8")
    assert log.count("leaves no room in the model's context for its y-") == left_out
    assert f"{options.corpus}:" in log
