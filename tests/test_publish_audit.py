"""The publisher under odd input (an audit of `localpers publish`).

Each test is a case that failed before: an edited corpus that found every stage cached (the old bundle reported
as written), an install from a stage cache on another filesystem that deleted the old bundle before failing, a
folder with a web app's `manifest.json` taken for a bundle, option typos found after work had started (one
deleted a finished stage), lone surrogates and an out-of-range seed that ended in tracebacks, corpus errors that
exited 1, a manifest with a bare NaN, and a Ctrl-C during a C extension's import that printed a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import InputError
from localpers.publish.options import PublishOptions

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_corpus import write_corpus  # noqa: E402

DEMO_BUNDLE = Path(__file__).resolve().parents[1] / "models" / "demo-bundle"


def options_for(tmp_path: Path, **changes: object) -> PublishOptions:
    return PublishOptions(
        corpus=write_corpus(tmp_path / "corpus.jsonl"),
        out=tmp_path / "bundle",
        k=2,
        executor="sequential",
        **changes,  # type: ignore[arg-type]
    )


@pytest.mark.slow
def test_an_edited_corpus_makes_every_stage_new(tmp_path: Path) -> None:
    from localpers.publish.pipeline import publish

    options = options_for(tmp_path)
    publish(options, until="clusters")
    log = options.work_dir / "publish.log"
    rows = [json.loads(line) for line in options.corpus.read_text().splitlines()]
    for row in rows:
        for item in row["history"]:
            item["output"] = "Completely Rewritten Headline " + item["output"]
    options.corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = log.read_text()
    publish(options, until="clusters")
    again = log.read_text()[len(before) :]
    assert "stage clusters: inputs changed" in again and "cached" not in again
    before = log.read_text()
    publish(options, until="clusters")
    assert "stage clusters: cached" in log.read_text()[len(before) :]  # unchanged inputs still resume


def test_install_from_another_filesystem_keeps_a_whole_bundle(tmp_path: Path) -> None:
    from localpers.bundle.format import verify_bundle
    from localpers.publish import bundle_stage

    out = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "out"))
    staging = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "staging"))
    (staging / "plots").mkdir(exist_ok=True)
    (staging / "plots" / "new-run.txt").write_text("only the staged bundle has this file\n")
    staged = {p.relative_to(staging): p.read_bytes() for p in staging.rglob("*") if p.is_file()}
    assert staged != {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    replace = os.replace

    def no_cross_device(src: object, dst: object) -> None:
        if Path(str(src)).is_relative_to(staging):
            raise OSError(18, "Invalid cross-device link")
        replace(src, dst)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bundle_stage, "_same_filesystem", lambda first, second: False)
        patch.setattr(bundle_stage.os, "replace", no_cross_device)
        bundle_stage.install(staging, out)
    verify_bundle(out)
    assert {
        p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()
    } == staged  # the new one
    assert not [p for p in out.iterdir() if p.name.startswith((".installing-", ".replaced-"))]


def install_failing_at_its_head(tmp_path: Path, out: Path) -> None:
    """Install a copy of the demo bundle into `out`, the move of its head failing with an I/O error."""
    from localpers.publish import bundle_stage

    staging = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "staging"))
    (staging / "plots").mkdir(exist_ok=True)
    replace = os.replace

    def fail_on_head(src: object, dst: object) -> None:
        if Path(str(src)) == staging / "head.safetensors":
            raise OSError(5, "Input/output error")
        replace(src, dst)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bundle_stage.os, "replace", fail_on_head)
        with pytest.raises(OSError, match="Input/output"):
            bundle_stage.install(staging, out)


def test_an_install_that_fails_half_way_puts_the_old_bundle_back(tmp_path: Path) -> None:
    from localpers.bundle.format import verify_bundle

    out = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "out"))
    (out / "plots").mkdir(exist_ok=True)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    install_failing_at_its_head(tmp_path, out)
    verify_bundle(out)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("killed_while", ["moving the old bundle aside", "placing the new one"])
def test_a_bundle_an_install_killed_half_way_moved_aside_is_put_back_before_the_next(
    tmp_path: Path, killed_while: str
) -> None:
    """A SIGKILL or a power cut mid-install left OUT without a manifest and the old bundle in `.replaced-*`; the
    next install deleted it, and when that install failed in turn OUT had no bundle at all (publish audit, s87)."""
    from localpers.bundle.format import verify_bundle
    from localpers.publish import bundle_stage

    out = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "out"))
    (out / "plots").mkdir(exist_ok=True)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    aside = out / ".replaced-4242-00c0ffee"
    aside.mkdir()
    os.replace(out / "manifest.json", aside / "manifest.json")
    os.replace(out / "adapters", aside / "adapters")
    if killed_while == "placing the new one":
        for entry in ("plots", "centroids.safetensors", "head.safetensors"):
            os.replace(out / entry, aside / entry)
        (aside / bundle_stage.ALL_MOVED).touch()
        shutil.copytree(DEMO_BUNDLE / "adapters", out / "adapters")
        (out / "adapters" / "new-only.gguf").write_bytes(b"a file of the killed install")
    install_failing_at_its_head(tmp_path, out)
    verify_bundle(out)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith((".installing-", ".replaced-"))]


def test_option_typos_are_refused_before_any_work(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "bundle"
    runner = CliRunner()
    for flags, message in (
        (["--targets", "attn_q,bogus"], "--targets names unknown target(s) 'bogus'"),
        (["--targets", ","], "--targets is empty"),
        (["--until", "bogus"], "--until 'bogus' is not a stage"),
        (["--from-stage", "sft", "--until", "clusters"], "--from-stage sft comes after --until clusters"),
        (["--precision", "fp16"], "--precision must be auto, bf16 or fp32"),
        (["--executor", "bogus"], "--executor must be one of"),
        (["--executor", "sequential", "--gpus-per-task", "1"], "--gpus-per-task needs --executor ray"),
        (["--executor", "sequential", "--workers", "2"], "--workers needs --executor ray"),
    ):
        result = runner.invoke(app, ["publish", str(corpus), "--out", str(out), *flags])
        assert result.exit_code == 2, (flags, result.output)
        assert message in result.output and not out.exists()
    for seed in ("-1", str(2**32)):
        result = runner.invoke(app, ["publish", str(corpus), "--out", str(out), "--seed", seed])
        assert result.exit_code == 2 and "--seed" in result.output and not out.exists()
    # values that make adapters without effect were found only after the training, blamed on the export
    for flag in ("--lr", "--lora-alpha", "--global-epochs", "--cluster-epochs"):
        result = runner.invoke(app, ["publish", str(corpus), "--out", str(out), flag, "0"])
        assert result.exit_code == 2 and flag in result.output and not out.exists(), (flag, result.output)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"user_id": "a\\ud800", "history": [{"input": "x", "output": "y"}]}',
            "field 'user_id' is not Unicode",
        ),
        (
            '{"user_id": "a", "history": [{"input": "x", "output": "y\\ud800"}]}',
            "field 'output' is not Unicode",
        ),
        ("hello world", "not valid JSON"),
        # a key named twice kept its last value silently
        (
            '{"user_id": "a", "history": [{"input": "x", "output": "first", "output": "second"}]}',
            "duplicate key",
        ),
        (
            '{"user_id": "a", "user_id": "b", "history": [{"input": "x", "output": "y"}]}',
            "duplicate key 'user_id'",
        ),
    ],
)
def test_a_malformed_corpus_is_an_input_error_naming_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    from localpers.publish.corpus import load_corpus

    path = tmp_path / "c.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputError, match=rf"c.jsonl:1: .*{message}"):
        load_corpus(path)


def test_a_corpus_path_that_is_no_regular_file_is_not_called_missing() -> None:
    from localpers.publish.corpus import load_corpus

    with pytest.raises(InputError, match="/dev/null is not a regular file"):
        load_corpus("/dev/null")


def test_a_corpus_saved_with_a_bom_is_read(tmp_path: Path) -> None:
    from localpers.publish.corpus import load_corpus

    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"user_id": "a", "history": [{"input": "x", "output": "y"}]}\n', encoding="utf-8")
    assert [user.user_id for user in load_corpus(path).users] == ["a"]


def test_too_few_users_for_any_k_is_told_to_add_users_only(tmp_path: Path) -> None:
    from localpers.publish.corpus import load_corpus

    path = tmp_path / "one.jsonl"
    path.write_text('{"user_id": "a", "history": [{"input": "x", "output": "y"}]}\n')
    with pytest.raises(InputError, match=r"1 user\(s\) found, at least 2 needed; add users$"):
        load_corpus(path, min_users=2)
    with pytest.raises(InputError, match="add users or lower --k$"):
        load_corpus(path, min_users=3)


def test_automatic_k_stops_at_the_number_of_distinct_users() -> None:
    import numpy as np

    from localpers.publish.clusters import choose_k

    embeddings = np.array([[1, 0], [1, 0], [0, 1], [0, 1], [0, 1], [1, 0]], dtype=np.float32)
    best, scores = choose_k(embeddings, (2, 6), seed=0)
    assert best == 2 and list(scores) == [2]


def test_a_manifest_never_holds_a_bare_nan(tmp_path: Path) -> None:
    from localpers.bundle.format import write_manifest

    (tmp_path / "file.bin").write_bytes(b"x")
    write_manifest(tmp_path, {"training": {"val_loss": float("nan")}, "backbone": {"sha256": "0" * 64}})
    text = (tmp_path / "manifest.json").read_text()
    assert "NaN" not in text and json.loads(text)["training"]["val_loss"] is None


def test_a_ctrl_c_during_a_c_extensions_import_is_reported_as_an_interrupt() -> None:
    import typer

    from localpers.cli.common import one_line_errors

    @one_line_errors
    def command() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise ImportError("initialization failed") from interrupt

    with pytest.raises(typer.Exit) as ended:
        command()
    assert ended.value.exit_code == 130

    @one_line_errors
    def broken() -> None:
        raise ImportError("no module named x")

    with pytest.raises(ImportError):  # a real import error is not hidden
        broken()


def test_a_repository_or_keys_that_cannot_sign_are_refused_before_training(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "bundle"
    runner = CliRunner()
    keys, other, repo = tmp_path / "keys", tmp_path / "other", tmp_path / "repo"
    assert runner.invoke(app, ["repo", "keygen", str(keys)]).exit_code == 0
    assert runner.invoke(app, ["repo", "keygen", str(other)]).exit_code == 0
    assert runner.invoke(app, ["repo", "init", str(repo), "--keys", str(keys)]).exit_code == 0
    for flags, message in (
        (["--repo", str(tmp_path / "missing"), "--keys", str(keys)], "missing"),
        (["--repo", str(repo), "--keys", str(other)], "is not one this repository's root trusts"),
    ):
        result = runner.invoke(app, ["publish", str(corpus), "--out", str(out), *flags])
        assert result.exit_code != 0 and message in result.output, result.output
        assert not out.exists()
    signing = ["--repo", str(repo), "--keys", str(keys)]
    for flags, message in (
        # the bundle or its stage cache (the authors' ids and headlines) in the folder that is uploaded whole
        (["--out", str(repo / "bundle")], f"--out {repo / 'bundle'} is inside the repository"),
        (["--out", str(out), "--work", str(repo / "w")], f"--work {repo / 'w'} is inside the repository"),
        # signed nothing, exit 0, not a word (audit85)
        (["--out", str(out), "--until", "head"], "--repo signs the bundle, and --until head stops before"),
        (
            ["--out", str(out), "--head-d", "5000"],
            "--head-d",
        ),  # devices refuse it, found only after every stage
    ):
        result = runner.invoke(app, ["publish", str(corpus), *flags, *signing])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not out.exists() and not (repo / "bundle").exists() and not (repo / "w").exists()


def test_card_base_named_as_auto_would_choose_it_keys_the_stages_as_auto() -> None:
    # switching between `auto` and the base it resolves to re-ran pairs, features, head and bundle for the same bundle
    from dataclasses import replace

    from localpers.publish.options import stage_fields

    for history_examples, resolved, other in ((5, "global", "cluster"), (0, "cluster", "global")):
        auto = PublishOptions(corpus=Path("c.jsonl"), out=Path("b"), history_examples=history_examples)
        assert stage_fields(replace(auto, card_base=resolved), "pairs") == stage_fields(auto, "pairs")
        assert stage_fields(replace(auto, card_base=other), "pairs") != stage_fields(auto, "pairs")


def test_a_second_publish_on_a_busy_work_folder_is_refused_before_it_touches_it(tmp_path: Path) -> None:
    """Two publishes on one --work wiped and refilled each other's stage folders, one installing the other's
    manifest with exit 0 (audit85 F1); the second is now refused at once."""
    fcntl = pytest.importorskip("fcntl")  # POSIX: elsewhere nothing is locked

    from localpers.errors import LocalpersError
    from localpers.publish.pipeline import publish

    options = options_for(tmp_path)
    options.work_dir.mkdir(parents=True)
    (options.work_dir / "publish.log").write_text("the running publish's log\n")
    holder = os.open(options.work_dir, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # what the running publish holds
        with pytest.raises(LocalpersError, match="another publish is using --work"):
            publish(options, until="clusters")
    finally:
        os.close(holder)
    assert sorted(p.name for p in options.work_dir.iterdir()) == ["publish.log"]
    assert (options.work_dir / "publish.log").read_text() == "the running publish's log\n"


def test_an_install_waits_for_another_into_the_same_out_before_sweeping_its_folders(tmp_path: Path) -> None:
    """Each install swept every `.replaced-*` folder in OUT, another running install's included (audit85 F1)."""
    fcntl = pytest.importorskip("fcntl")  # POSIX: elsewhere nothing is locked
    import threading

    from localpers.bundle.format import verify_bundle
    from localpers.publish import bundle_stage

    out = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "out"))
    staging = Path(shutil.copytree(DEMO_BUNDLE, tmp_path / "staging"))
    (staging / "plots").mkdir(exist_ok=True)
    live = out / ".replaced-424242-deadbeef"  # the other install's old bundle, set aside
    live.mkdir()
    holder = os.open(out, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # the other install, still running
    installing = threading.Thread(target=bundle_stage.install, args=(staging, out))
    try:
        installing.start()
        installing.join(1.0)
        assert installing.is_alive() and live.is_dir()
    finally:
        os.close(holder)
    installing.join(30)
    assert not installing.is_alive() and not live.exists()  # the other install is over: a leftover now
    verify_bundle(out)
