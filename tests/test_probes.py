"""Style probes: the four style transforms and detectors, and `localpers bench --probes` end to end.

The end-to-end run uses the tiny invented users of test_bench and the synthetic bundle: it restyles the
gold, runs each method per history size, and writes probes.json / probes.md / probes.png whose hit rates
are recomputed here from the generated outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_bench import USERS, data_file, personalizer  # noqa: F401 - shared fixtures
from typer.testing import CliRunner

from localpers.bench.data import load_bench_users
from localpers.bench.probes import ProbeConfig, hit_rate, paired_reference, probe_method_names, run_probes
from localpers.bench.styles import STYLES, get_style, restyle_users, sentence_case
from localpers.cli import app
from localpers.errors import LocalpersError

HEADLINES = [
    "Fed Raises Rates And Stocks Fall",
    "NASA Finds Water on Mars.",
    "Why the Vote Matters!",
    "Pope Visits Kenya",
]


@pytest.mark.parametrize("name", list(STYLES))
def test_every_style_is_detected_on_its_own_transform_and_idempotent(name: str) -> None:
    style = get_style(name)
    for text in HEADLINES:
        styled = style.transform(text)
        assert style.transform(styled) == styled
        joins_nothing = name == "ampersand" and " and " not in f" {text.lower()} "
        if joins_nothing:  # the only style that may not apply to a headline: there is nothing to join
            assert styled == text and style.detect(styled) is None and style.detect(text) is None
            continue
        assert style.detect(styled) is True, (name, styled)
        assert style.detect(text) is False, (name, text)  # plain title-case news headlines lack it


def test_transforms_do_what_their_names_say() -> None:
    assert sentence_case("NASA Finds Water on Mars") == "NASA finds water on mars"
    assert get_style("kicker").transform("Pope Visits Kenya") == "Opinion: Pope Visits Kenya"
    assert get_style("question").transform("Why the Vote Matters!") == "Why the Vote Matters?"
    assert get_style("ampersand").transform("Bread and Butter and Jam") == "Bread & Butter & Jam"
    assert get_style("ampersand").detect("Pope Visits Kenya") is None  # joins nothing: does not apply
    assert get_style("ampersand").detect("Rock & Roll and Blues") is False
    assert get_style("sentence-case").detect("Pope visits") is None  # too short to tell


def test_unknown_style_is_one_line_error() -> None:
    with pytest.raises(LocalpersError, match="unknown style 'bold'.*kicker"):
        get_style("bold")


def test_restyle_changes_only_outputs_and_references(data_file: Path) -> None:  # noqa: F811
    users = load_bench_users(data_file)
    restyled = restyle_users(users, get_style("kicker"))
    for before, after in zip(users, restyled, strict=True):
        assert [i.input for i in before.history] == [i.input for i in after.history]
        assert all(i.output.startswith("Opinion: ") for i in after.history)
        assert all(q.reference.startswith("Opinion: ") for q in after.queries)
        assert [q.input for q in before.queries] == [q.input for q in after.queries]
        assert {i.id for i in before.history}.isdisjoint({i.id for i in after.history})


def test_probe_method_names_and_hit_rate() -> None:
    assert probe_method_names(["global", "rag@k=2", "cluster@history=3"], (5, None)) == [
        "global",
        "rag@k=2,history=5",
        "rag@k=2,history=all",
        "cluster@history=3",
    ]
    assert hit_rate([True, None, False, True], n_resamples=200, seed=0)["n"] == 3
    assert hit_rate([None], n_resamples=200, seed=0) == {"rate": None, "ci": None, "n": 0}
    rate = hit_rate([True, True, False, True], n_resamples=200, seed=0)
    assert rate["rate"] == 0.75 and rate["ci"][0] <= 0.75 <= rate["ci"][2]


def test_paired_reference_is_the_adapter_alone_at_the_same_history_size() -> None:
    from types import SimpleNamespace

    names = {
        "global": ("global", "n/a"),
        "global-history@history=5": ("global-history", 5),
        "global-history@history=20": ("global-history", 20),
        "card-auto@history=20": ("card-auto", 20),
        "card-auto@history=10": ("card-auto", 10),
    }
    specs = [SimpleNamespace(name=name, base=base) for name, (base, _) in names.items()]
    run = SimpleNamespace(specs=specs, params={name: {"history": h} for name, (_, h) in names.items()})
    by_name = {spec.name: spec for spec in specs}
    reference = paired_reference(by_name["card-auto@history=20"], run)
    assert reference.name == "global-history@history=20"
    assert paired_reference(by_name["card-auto@history=10"], run).name == "global"  # no adapter alone at 10
    assert paired_reference(by_name["global-history@history=5"], run).name == "global"
    assert paired_reference(by_name["global"], run) is None


def test_probes_run_end_to_end(data_file: Path, personalizer, tmp_path: Path) -> None:  # noqa: F811
    config = ProbeConfig(
        data=data_file,
        out=tmp_path / "probes",
        styles=["kicker", "question"],
        methods=["rag", "cluster"],
        history_sizes=(2, None),
        max_queries=1,
        n_resamples=200,
        command="test",
    )
    probes = run_probes(config, personalizer=personalizer)
    assert [s["style"] for s in probes["styles"]] == ["kicker", "question"]
    for style in probes["styles"]:
        assert set(style["methods"]) == {
            "global",
            "rag@history=2",
            "rag",
            "cluster@history=2",
            "cluster",
        }
        assert style["gold_hit"]["rate"] == 1.0  # the restyled gold always carries the style
        detect = get_style(style["style"]).detect
        outputs = [
            json.loads(line)
            for line in (config.out / style["style"] / "outputs.jsonl").read_text().splitlines()
        ]
        for name, row in style["methods"].items():
            texts = [o["text"] for o in outputs if o["method"] == name]
            assert len(texts) == len(USERS) == row["n"]
            flags = [detect(t) for t in texts if detect(t) is not None]
            assert row["hit"]["n"] == len(flags)
            if flags:
                assert row["hit"]["rate"] == pytest.approx(sum(flags) / len(flags), abs=1e-4)
            # no conditioned adapter in this run: each method is paired with global, global with nothing
            if name == "global":
                assert row["rouge1_vs"] is None
            else:
                scores = {o["method"]: {} for o in outputs}
                for o in outputs:
                    scores[o["method"]][(o["user"], o["query_id"])] = o["rouge1"]
                expected = np.mean([scores[name][key] - scores["global"][key] for key in scores[name]])
                low, mean, high = row["rouge1_vs"]["delta"]
                assert row["rouge1_vs"]["method"] == "global"
                assert mean == pytest.approx(expected, abs=1e-4) and low <= mean <= high
    assert json.loads((config.out / "probes.json").read_text()) == probes
    assert "## kicker (prefix)" in (config.out / "probes.md").read_text()
    assert "vs global |" in (config.out / "probes.md").read_text()
    # a limit, not a count: users with fewer queries were said to have as many (audit85)
    assert (
        f"up to {probes['config']['queries_per_user']} queries each" in (config.out / "probes.md").read_text()
    )
    assert (config.out / "probes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # resumable: a second run is served from each style's cache and gives the same figures
    assert run_probes(config, personalizer=personalizer) == probes
    # the data notes are told once, not once per style (a dropped duplicate leaves the cached runs valid)
    twice = [{**user, "history": [*user["history"], user["history"][0]]} for user in USERS]
    noted = tmp_path / "noted.jsonl"
    noted.write_text("".join(json.dumps(user) + "\n" for user in twice))
    notes: list[str] = []
    config.data = noted
    run_probes(config, personalizer=personalizer, notify=notes.append)
    assert notes == ["2 duplicate history item(s) dropped (users loud, Quiet User)"]


def test_cli_probes_refuses_bad_options_in_one_line(data_file: Path, tmp_path: Path) -> None:  # noqa: F811
    runner = CliRunner()
    result = runner.invoke(
        app, ["bench", "--probes", "--data", str(data_file), "--out", str(tmp_path), "--styles", "bold"]
    )
    assert result.exit_code == 2 and "unknown style 'bold'" in result.output
    result = runner.invoke(
        app,
        ["bench", "--probes", "--data", str(data_file), "--out", str(tmp_path), "--probe-history", "5,0"],
    )
    assert result.exit_code == 2 and "--probe-history" in result.output
