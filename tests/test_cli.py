"""The foundation CLI: --version, doctor, generate, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers import __version__
from localpers.cli import app
from localpers.engine.backbone import Backbone

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.stdout


def test_every_command_has_help() -> None:
    for command in ([], ["doctor"], ["generate"], ["history", "import"]):
        for flag in ("--help", "-h"):
            result = runner.invoke(app, [*command, flag])
            assert result.exit_code == 0, (command, flag)
            assert "Usage" in result.stdout


def test_every_commands_help_reads_as_paragraphs() -> None:
    """Typer keeps a docstring's line breaks inside a paragraph (and in the command list), so a paragraph
    wrapped over two source lines printed as ragged half-lines in `--help`."""
    import click
    import typer.main

    def commands(group: click.Command, prefix: str = "") -> list[tuple[str, click.Command]]:
        found = []
        for name, command in getattr(group, "commands", {}).items():
            found.append((prefix + name, command))
            found.extend(commands(command, prefix + name + " "))
        return found

    ragged = [
        name
        for name, command in commands(typer.main.get_command(app))
        if any("\n" in paragraph.strip() for paragraph in (command.help or "").split("\n\n"))
    ]
    assert not ragged


def test_rewrite_and_fit_help_say_what_each_method_does() -> None:
    """`--method` listed bare names; what `cope` or `card-global` is was written only in the registry."""
    from localpers.methods.registry import get_method, method_names

    for command, names in (("rewrite", method_names()), ("fit", method_names(fitted=True))):
        result = runner.invoke(app, [command, "--help"], terminal_width=1000)
        assert result.exit_code == 0
        shown = " ".join(result.stdout.split())
        for name in names:
            assert f"{name}: {' '.join(get_method(name).summary.split())}" in shown, (command, name)


def test_a_text_comes_in_as_history_is_stored_nfc() -> None:
    """An NFD text was measured in code points (a 950-character paraphrase counted 1,113 and was refused, though
    `history add` took it), matched against NFC history and echoed decomposed (text audit)."""
    import unicodedata

    from localpers.api.requests import parse_chat, parse_completion
    from localpers.cli.common import read_text_argument

    decomposed = unicodedata.normalize("NFD", "Zoë et Chloé ouvrent une crêperie à Montréal")
    composed = unicodedata.normalize("NFC", decomposed)
    assert decomposed != composed and read_text_argument(decomposed) == composed
    assert parse_completion({"model": "localpers", "prompt": decomposed}).text == composed
    chat = parse_chat({"model": "localpers", "messages": [{"role": "user", "content": decomposed}]})
    assert chat.text == composed and chat.messages == (("user", composed),)


def test_starting_the_cli_loads_no_heavy_library() -> None:
    """Every command pays for what the CLI imports at start: scipy alone added ~0.3 s to `--help`."""
    heavy = (
        "scipy",
        "sklearn",
        "torch",
        "transformers",
        "sentence_transformers",
        "textual",
        "tuf",
        "safetensors",
    )
    code = (
        "import sys, localpers.cli.main\n"
        f"loaded = [name for name in {heavy!r} if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_doctor_json_reports_backbone_and_extras(backbone: Backbone) -> None:
    result = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["backbone"]["sha256"] == backbone.sha256
    assert report["llama_cpp_python"] == "0.3.36"
    assert set(report["extras"]) >= {"publish", "torch", "gguf", "ray"}
    assert Path(report["dirs"]["data"]).is_dir()
    if report["extras"]["publish"]:  # where `publish` would train: this machine's GPU, else its CPU
        from localpers.engine.torch_model import cpu_has_bf16, training_device

        expected = {"device": "cpu", "bf16": cpu_has_bf16()} if training_device() == "cpu" else None
        assert report["training"]["device"] == training_device()
        assert expected is None or report["training"] == expected
    else:
        assert report["training"] is None


def test_generate_streams_text(backbone: Backbone) -> None:
    """The streamed pieces add up to the whole greedy continuation that `--json` reports, once, then a newline."""
    command = ["generate", "The capital of France is", "--max-tokens", "8", "--model", str(backbone.path)]
    streamed = runner.invoke(app, command)
    assert streamed.exit_code == 0, streamed.output
    reported = runner.invoke(app, [*command, "--json"])
    assert reported.exit_code == 0, reported.output
    payload = json.loads(reported.stdout)
    assert payload["text"].strip() and streamed.stdout == payload["text"] + "\n"
    assert payload["tokens"] == 8 or payload["stop_reason"] != "length"


def test_generate_json_headline_is_one_line(backbone: Backbone) -> None:
    result = runner.invoke(
        app,
        [
            "generate",
            "Scientists found that people who walk 20 minutes a day sleep better.",
            "--task",
            "headline",
            "--json",
            "--model",
            str(backbone.path),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["task"] == "headline"
    assert "\n" not in payload["text"]
    assert payload["tokens"] >= 1 and payload["ms_per_token"] > 0


def test_generate_reads_stdin(backbone: Backbone) -> None:
    result = runner.invoke(
        app,
        ["generate", "-", "--max-tokens", "4", "--json", "--model", str(backbone.path)],
        input="Once upon a time",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"] >= 1


def test_generate_refuses_or_tells_a_text_its_task_cuts_as_rewrite_does(backbone: Backbone) -> None:
    """`generate` cut a free or paraphrase text past 1,000 characters without a word (a 15,000-character text
    became a 201-token prompt), where `rewrite` refuses it, and cut a long headline text without its note
    (eighty-first session's device audit)."""
    long_text = "lorem ipsum " * 200 + "Question: what is the capital of France? Answer:"
    for task in ("free", "paraphrase"):
        refused = runner.invoke(app, ["generate", long_text, "--task", task, "--model", str(backbone.path)])
        assert refused.exit_code == 2, refused.output
        assert refused.output.startswith(
            f"error: the text has 2,448 characters; the {task} task takes at most"
        )
    told = runner.invoke(
        app,
        [
            "generate",
            long_text,
            "--task",
            "headline",
            "--max-tokens",
            "2",
            "--json",
            "--model",
            str(backbone.path),
        ],
    )
    assert told.exit_code == 0, told.output
    assert "note: the text has 2,448 characters; the headline task read its first 1,500" in told.stderr
    assert json.loads(told.stdout)["tokens"] >= 1


def test_generate_names_a_folder_given_as_adapter(tmp_path: Path) -> None:
    """`generate --adapter DIR` said "no such file" of a folder that exists (device audit)."""
    folder = runner.invoke(app, ["generate", "hi", "--adapter", str(tmp_path)])
    assert folder.exit_code == 2 and f"--adapter {tmp_path}: it is a folder" in folder.output
    missing = runner.invoke(app, ["generate", "hi", "--adapter", str(tmp_path / "none.gguf")])
    assert missing.exit_code == 2 and "none.gguf: no such file" in missing.output


def test_bad_model_path_is_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["generate", "hello", "--model", str(tmp_path / "missing.gguf")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert result.output.startswith("error:") and "missing.gguf" in result.output


def test_unknown_task_is_one_line_error(backbone: Backbone) -> None:
    result = runner.invoke(app, ["generate", "hello", "--task", "poem", "--model", str(backbone.path)])
    assert result.exit_code == 2
    assert "unknown task 'poem'" in result.output


def test_generate_samples_with_min_p_and_a_seed_reproducibly(backbone: Backbone) -> None:
    command = [
        "generate",
        "Once upon a time",
        "--max-tokens",
        "8",
        "--json",
        "--model",
        str(backbone.path),
        "--temperature",
        "0.9",
        "--min-p",
        "0.05",
        "--top-k",
        "40",
        "--seed",
        "3",
    ]
    first, second = runner.invoke(app, command), runner.invoke(app, command)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["text"] == json.loads(second.stdout)["text"]


def test_generate_follows_a_grammar_file(backbone: Backbone, tmp_path: Path) -> None:
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= " " ("yes" | "no")\n')
    result = runner.invoke(
        app,
        [
            "generate",
            "Is Paris in France? Answer:",
            "--json",
            "--grammar",
            str(grammar),
            "--model",
            str(backbone.path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["text"] in {" yes", " no"}


def test_bad_grammar_is_a_one_line_error_with_exit_code_2(backbone: Backbone, tmp_path: Path) -> None:
    grammar = tmp_path / "broken.gbnf"
    grammar.write_text("root ::= (")
    result = runner.invoke(app, ["generate", "hi", "--grammar", str(grammar), "--model", str(backbone.path)])
    assert result.exit_code == 2
    assert (  # naming the file, as a file that cannot be read is named (audit85)
        result.output.startswith(f"error: the grammar in {grammar} is not valid GBNF")
        and result.output.strip().count("\n") == 0
    )
    missing = runner.invoke(app, ["generate", "hi", "--grammar", str(tmp_path / "none.gbnf")])
    assert missing.exit_code == 2 and missing.output.startswith("error: cannot read grammar file")


def test_streamed_one_line_output_starts_at_its_first_word(capsys: pytest.CaptureFixture[str]) -> None:
    from localpers.cli.common import stdout_stream

    write = stdout_stream(strip_leading=True)
    for piece in [" ", " New", " Bridge", " Opens"]:
        write(piece)
    assert capsys.readouterr().out == "New Bridge Opens"
    keep = stdout_stream(strip_leading=False)  # a free continuation's leading space is part of it
    for piece in [" there", " was"]:
        keep(piece)
    assert capsys.readouterr().out == " there was"


def test_fit_progress_without_a_terminal_logs_stage_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localpers.cli import progress

    clock = iter([100.0, 103.0, 108.0, 114.0, 116.0, 117.0, 120.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.fit_progress(True, interactive=False) as update:  # the logger starts its clock at 100
        update("pairs", 16, 40)  # 103: too soon for a line
        update("pairs", 32, 40)  # 108: still under 10 s
        update("pairs", 35, 40)  # 114: 14 s since the stage began, a line
        update("pairs", 40, 40)  # 116: the stage's end, timed from the start
        update("choice", 1, 2)  # 117
        update("choice", 2, 2)  # 120: timed from the previous stage's end
    assert capsys.readouterr().err.splitlines() == [
        "fit: pairs: y- and features 35/40, about 2 s left",  # 14 s for 35: 0.4 s each
        "fit: pairs: y- and features 40/40 (16.0 s)",
        "fit: choosing the correction 2/2 (4.0 s)",
    ]
    with progress.fit_progress(False, interactive=False) as update:
        assert update is None
    assert [progress._duration(s) for s in (42, 420, 8280)] == ["42 s", "7 min", "2.3 h"]


@pytest.mark.parametrize(
    ("command", "option", "value", "message"),
    [
        (["rewrite", "x"], "--strength", "inf", "--strength must be a finite number from 0 to 100"),
        (["rewrite", "x"], "--strength", "nan", "--strength must be a finite number from 0 to 100"),
        (["rewrite", "x"], "--strength", "1e6", "--strength must be a finite number from 0 to 100"),
        (["generate", "x"], "--temperature", "inf", "--temperature must be a finite number of 0 or more"),
        (["rewrite", "x"], "--top-p", "nan", "--top-p must be a finite number above 0 and at most 1"),
        (["tui"], "--min-p", "-inf", "--min-p must be a finite number from 0 to 0.99"),
        (
            ["generate", "x"],
            "--presence-penalty",
            "nan",
            "--presence-penalty must be a finite number from -2",
        ),
        (["generate", "x"], "--repeated-word-penalty", "inf", "--repeated-word-penalty must be a finite"),
        (["publish", "c.jsonl", "-o", "out"], "--lr", "inf", "--lr must be a finite number above 0"),
    ],
)
def test_float_options_refuse_numbers_that_are_not_finite(
    command: list[str], option: str, value: str, message: str
) -> None:
    """`inf` passed Typer's min check (rewrite printed "strength": Infinity, not JSON) and `nan` was refused
    as "greater than or equal to 0"."""
    result = runner.invoke(app, [*command, option, value])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


@pytest.mark.parametrize(("option", "value"), [("--repetition-penalty", "0"), ("--top-p", "0")])
def test_the_help_shows_the_range_the_check_applies(option: str, value: str) -> None:
    """--help showed [0.0<=x<=10.0] for --repetition-penalty, and 0 was refused at run time as repeat_penalty."""
    refused = runner.invoke(app, ["generate", "x", option, value])
    assert refused.exit_code == 2 and f"{option} must be a finite number above 0" in refused.output
    shown = " ".join(runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "Must be above 0 and at most" in shown and "0.0<=x<=10.0" not in shown


def test_json_output_is_strict_json() -> None:
    from localpers.cli.common import json_text

    text = json_text({"a": float("inf"), "b": [float("nan"), 1.5], "c": "é"})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(name)) == {
        "a": None,
        "b": [None, 1.5],
        "c": "é",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "-m", "bogus"],
        ["rewrite", "x", "-m", "bogus"],
        ["rewrite", "x", "-t", "poem"],
        ["generate", "x", "-t", "poem"],
    ],
)
def test_bad_names_and_text_arguments_exit_with_code_2(args: list[str]) -> None:
    """The README's rule (exit 2 for a malformed argument); these exited 1 (text that is not UTF-8:
    tests/test_interrupts_and_damage.py)."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.strip().count("\n") == 0


def test_a_model_or_adapter_that_is_not_a_whole_gguf_file_exits_with_code_2(
    backbone: Backbone, tmp_path: Path
) -> None:
    text_file, truncated = tmp_path / "notes.gguf", tmp_path / "cut.gguf"
    text_file.write_text("hello\n")
    truncated.write_bytes(backbone.path.read_bytes()[:100_000])
    for option, path, fragment in [
        ("--model", text_file, "is not a GGUF file"),
        ("--model", truncated, "could not load"),
        ("--adapter", text_file, "is not a GGUF file"),
        ("--adapter", truncated, "refused adapter"),
    ]:
        result = runner.invoke(app, ["generate", "x", "--max-tokens", "1", option, str(path)])
        assert result.exit_code == 2 and fragment in result.output, (option, path, result.output)


def test_a_grammar_path_that_is_missing_or_a_folder_says_so(tmp_path: Path) -> None:
    """It said "cannot read grammar file ...: FileNotFoundError"."""
    for path, problem in [(tmp_path / "nothere.gbnf", "no such file"), (tmp_path, "it is a directory")]:
        result = runner.invoke(app, ["generate", "hi", "--grammar", str(path)])
        assert result.exit_code == 2
        assert result.output.startswith(
            f"error: cannot read grammar file {path}: {problem}; give a GBNF file"
        )


def complete(words: str, home: Path) -> list[str]:
    """What the shell would offer after `words` (bash's protocol, as `localpers --show-completion bash` sets up)."""
    import os

    env = {
        **os.environ,
        "LOCALPERS_HOME": str(home),
        "_LOCALPERS_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    script = Path(sys.executable).parent / "localpers"  # the console script: its name keys the protocol
    result = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and not result.stderr, result.stderr
    return result.stdout.split()


def test_the_shell_completes_commands_users_methods_and_tasks_without_writing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert complete("localpers rew", home) == ["rewrite"]
    assert not any(
        word.startswith("0.") for word in complete("localpers --version ", home)
    )  # no version printed
    assert complete("localpers user use ", home) == []
    assert not home.exists()  # completing reads: no folder is made for it
    assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    assert runner.invoke(app, ["user", "create", "bob", "--no-use"]).exit_code == 0
    from localpers.paths import data_dir

    users_home = data_dir().parent  # the test's LOCALPERS_HOME
    assert complete("localpers user use ", users_home) == ["ann", "bob"]
    assert complete("localpers rewrite --user b", users_home) == ["bob"]
    assert "card" in complete("localpers rewrite --method ", home)
    assert "global" not in complete("localpers fit --method ", home)  # nothing to fit for it
    assert complete("localpers history import f.jsonl --task h", home) == ["headline"]
    shown = runner.invoke(app, ["--show-completion", "bash"])
    assert shown.exit_code == 0 and "_LOCALPERS_COMPLETE=complete_bash" in shown.stdout


def test_the_top_help_names_every_environment_variable_localpers_reads() -> None:
    import re

    package = Path(__file__).parents[1] / "localpers"
    read = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"\bLOCALPERS_[A-Z_]+[A-Z]\b", path.read_text(encoding="utf-8"))
    }
    assert {"LOCALPERS_HOME", "LOCALPERS_MODEL", "LOCALPERS_THREADS"} <= read
    shown = " ".join(runner.invoke(app, ["--help"], env={"COLUMNS": "300"}).stdout.split())
    assert not [name for name in sorted(read) if name not in shown]


def test_generate_json_with_an_adapter_names_it(backbone: Backbone) -> None:
    """`generate --adapter FILE --json` ended in a TypeError traceback (a Path in the payload) after the work."""
    adapter = Path(__file__).resolve().parents[1] / "models" / "demo-bundle" / "adapters" / "global.gguf"
    result = runner.invoke(
        app,
        ["generate", "Rain is due.", "--max-tokens", "2", "--adapter", str(adapter), "--json"]
        + ["--model", str(backbone.path)],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["adapter"] == str(adapter)


def test_bundle_info_json_never_prints_a_bare_nan(tmp_path: Path) -> None:
    import shutil

    bundle = Path(
        shutil.copytree(Path(__file__).resolve().parents[1] / "models" / "demo-bundle", tmp_path / "b")
    )
    manifest = (bundle / "manifest.json").read_text()
    value = json.loads(manifest)["training"]["val_loss"]["global"]["val_loss_backbone"]
    (bundle / "manifest.json").write_text(
        manifest.replace(f'"val_loss_backbone": {value}', '"val_loss_backbone": NaN', 1)
    )
    result = runner.invoke(app, ["bundle", "info", str(bundle), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(name))
    assert shown["training"]["val_loss"]["global"]["val_loss_backbone"] is None


def test_json_with_a_path_of_non_utf8_bytes_stays_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    """A lone surrogate (a path's byte 0xff) reached a UTF-8 stdout raw: the output was no UTF-8, so no JSON."""
    from localpers.cli.common import print_json

    print_json({"archive": "z\udcff.zip"}, indent=None)
    printed = capsys.readouterr().out
    printed.encode("utf-8")
    assert json.loads(printed) == {"ok": True, "archive": "z\udcff.zip"}


def test_tui_refuses_a_draft_that_is_not_utf8_before_the_screen_opens() -> None:
    result = runner.invoke(app, ["tui", "--text", "bad\udcffbyte draft"])
    assert result.exit_code == 2 and "--text" in result.output and "UTF-8" in result.output, result.output
