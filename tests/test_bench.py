"""`localpers bench` end to end on a tiny invented data file and the synthetic bundle.

Two users, two queries each, three history items each: it fits, generates, scores, writes the
results.json shape the issue fixes, resumes from its cache, and refuses bad input in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SHARED_DATA
from synthetic_bundle import make_bundle
from typer.testing import CliRunner

from localpers.bench import BenchConfig, run_and_write
from localpers.bench.data import load_bench_users, read_bench_file, store_name
from localpers.bench.method_names import canonical_spec, expand_methods, parse_method, split_method_list
from localpers.bench.methods import MethodSpec
from localpers.bench.prompt_methods import few_shot_prefix
from localpers.bundle.format import open_bundle
from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.errors import InputError, LocalpersError
from localpers.methods.card.head_spec import HeadConfig
from localpers.methods.card.personalizer import Personalizer
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat

PROMPT = "Generate a headline for the following article: "
USERS = [
    {
        "user_id": "loud",
        "history": [
            {
                "id": "a1",
                "input": PROMPT + "The bridge reopened after repairs.",
                "output": "BRIDGE IS BACK!!!",
            },
            {
                "id": "a2",
                "input": PROMPT + "The bakery won a national prize.",
                "output": "BAKERY WINS BIG!!!",
            },
            {
                "id": "a3",
                "input": PROMPT + "The river flooded two streets.",
                "output": "RIVER FLOODS STREETS!!!",
            },
        ],
        "queries": [
            {
                "id": "q1",
                "input": PROMPT + "The bakery opened a second shop.",
                "output": "BAKERY DOUBLES UP!!!",
            },
            {
                "id": "q2",
                "input": PROMPT + "The bridge will close for a day.",
                "output": "BRIDGE SHUT FOR A DAY!!!",
            },
        ],
    },
    {
        "user_id": "Quiet User",
        "history": [
            {
                "id": "b1",
                "input": PROMPT + "A new park bench was installed.",
                "output": "a bench in the park",
            },
            {
                "id": "b2",
                "input": PROMPT + "The library extended its hours.",
                "output": "the library stays open later",
            },
            {"id": "b3", "input": PROMPT + "Rain is expected on Sunday.", "output": "a rainy sunday ahead"},
        ],
        "queries": [
            {
                "id": "q1",
                "input": PROMPT + "The library added a reading room.",
                "output": "a new reading room",
            },
            {"id": "q2", "input": PROMPT + "Snow is expected on Monday.", "output": "a snowy monday"},
        ],
    },
]
METHODS = ["main", "card@strength=0.5", "cluster@history=1", "card@history=2"]
REQUIRED_METHOD_FIELDS = {
    "rouge1": float,
    "rougeL": float,
    "n": int,
    "ms_per_token": float,
    "fit_s_per_user": float,
    "bytes_per_user": int,
    "max_bytes_per_user": int,
}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "users.jsonl"
    path.write_text("".join(json.dumps(user) + "\n" for user in USERS))
    return path


@pytest.fixture(scope="module")
def personalizer(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Personalizer:
    bundle_dir = make_bundle(tmp_path_factory.mktemp("bundle") / "bundle", backbone)
    # one thread: on a CPU shared with other jobs, two llama.cpp threads were measured 10x+ slower
    loaded = Personalizer(open_bundle(bundle_dir, backbone_sha256=backbone.sha256), backbone, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def first_run(data_file: Path, personalizer: Personalizer, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("bench") / "out"
    config = BenchConfig(data=data_file, out=out, methods=METHODS, n_resamples=500)
    progress_calls: list[tuple[str, int, int, str]] = []
    written = run_and_write(config, personalizer=personalizer, progress=lambda *a: progress_calls.append(a))
    return config, written, progress_calls


def test_results_json_has_the_issue_shape(first_run) -> None:
    config, written, _ = first_run
    results = json.loads((config.out / "results.json").read_text())
    assert {"methods", "deltas_vs_global"} <= set(results)
    expected = {
        "global",
        "rag",
        "cluster",
        "card",
        "card@strength=0.5",
        "cluster@history=1",
        "card@history=2",
    }
    assert set(results["methods"]) == expected
    for name, row in results["methods"].items():
        for field, kind in REQUIRED_METHOD_FIELDS.items():
            assert isinstance(row[field], kind), (name, field, row[field])
        assert row["n"] == 4  # 2 users x 2 queries
        assert 0.0 <= row["rouge1"] <= 1.0 and 0.0 <= row["rougeL"] <= 1.0
        assert row["ms_per_token"] > 0
    assert set(results["deltas_vs_global"]) == expected - {"global"}
    for name, delta in results["deltas_vs_global"].items():
        low, mean, high = delta["rouge1"]
        assert low <= mean <= high, name
        assert mean == pytest.approx(
            results["methods"][name]["rouge1"] - results["methods"]["global"]["rouge1"], abs=1e-4
        )


def test_author_level_figures_agree_with_the_per_user_means(first_run) -> None:
    _, written, _ = first_run
    results = written.results
    users = results["users"]
    assert set(results["authors_vs_global"]) == set(results["methods"]) - {"global"}
    for name, row in results["authors_vs_global"].items():
        means = [(u["rouge1"][name], u["rouge1"]["global"]) for u in users.values()]
        assert row["authors"] == 2
        assert row["improved"] == sum(m > g for m, g in means), name
        assert row["unchanged"] == sum(m == g for m, g in means), name
        assert row["improved"] + row["unchanged"] + row["worse"] == 2
        low, ratio, high = row["rouge1_ratio"]
        assert low <= high
        if not math.isnan(ratio):
            assert ratio == pytest.approx(results["deltas_vs_global"][name]["rouge1_ratio"][1], abs=1e-4)
        assert row["rouge1"][1] == pytest.approx(results["deltas_vs_global"][name]["rouge1"][1], abs=1e-4)
    for user_id, record in zip(users, written.run.records["card"], strict=True):
        scores = [q["rouge1"] for q in record["queries"]]
        assert users[user_id]["rouge1"]["card"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)


def test_gain_is_split_by_how_close_the_history_came(first_run) -> None:
    config, written, _ = first_run
    entry = written.results["by_sibling"]
    # loud's q1 ("BAKERY DOUBLES UP") shares 1 of 3 words with "BAKERY WINS BIG" (R-1 0.33); the other
    # three queries' best earlier headline stays below 0.3
    assert [(b["name"], b["queries"], b["authors"]) for b in entry["bins"]] == [
        ("< 0.3", 3, 2),
        ("0.3-0.5", 1, 1),
        (">= 0.5", 0, 0),
    ]
    # fitted on 1 and 2 of the author's items, they never saw the siblings the bins are made of (bench audit, s87)
    other_windows = {"cluster@history=1", "card@history=2"}
    assert set(entry["left_out"]) == other_windows
    assert set(entry["methods"]) == set(written.results["methods"]) - {"global"} - other_windows
    card = {cell["bin"]: cell for cell in entry["methods"]["card"]["bins"]}
    loud_q1 = next(q for q in written.run.records["card"][0]["queries"] if q["query_id"] == "q1")
    assert card["0.3-0.5"]["n"] == 1 and card["0.3-0.5"]["rouge1"] == pytest.approx(
        loud_q1["rouge1"], abs=1e-5
    )
    assert card[">= 0.5"]["n"] == 0
    assert entry["methods"]["card"]["top_share_for_target"] is None  # no query in the top bin
    report = (config.out / "report.md").read_text()
    assert "## Where the gain comes from" in report
    assert "| card | 0.3-0.5 | 1 |" in report
    assert "Not binned (fitted on another window of the history than the bins): `cluster@history=1`" in report
    assert "![ROUGE-1 gain over global by sibling score](siblings.png)" in report
    assert (config.out / "siblings.png").stat().st_size > 0


def test_costs_per_method_are_measured(first_run) -> None:
    config, written, _ = first_run
    rows = written.results["methods"]
    assert rows["global"]["bytes_per_user"] == 0 and rows["global"]["fit_s_per_user"] == 0
    assert rows["rag"]["bytes_per_user"] == 0 and rows["rag"]["history_bytes_per_user"] > 0
    assert 0 < rows["cluster"]["bytes_per_user"] < rows["card"]["bytes_per_user"]
    assert rows["card"]["fit_s_per_user"] > rows["cluster"]["fit_s_per_user"] > 0
    # the stored vector: D=16 float32 = 64 bytes plus safetensors header, plus state.json
    assert rows["card"]["bytes_per_user"] > 64
    users = written.results["users"]
    assert users["loud"]["cluster"] == 0 and users["Quiet User"]["cluster"] == 1  # the synthetic centroids
    assert users["loud"]["mode"] == "vector"
    # The 2-item fit reuses the full fit's y- (same bundle, cluster and items) and has too few pairs
    # for a vector of its own, so lambda is the prior (zero: the cluster adapter without a correction).
    truncated = written.run.records["card@history=2"]
    assert all(r["fit"]["shared_negatives"] and r["fit"]["mode"] == "too-few-pairs" for r in truncated)
    # and uses them: the shared file's key (bundle, adapter, fit mark) is the one its fit reads, so it generates none
    states = sorted((config.out / "users" / "history-2" / "users").glob("*/state.json"))
    assert len(states) == 2
    assert all(json.loads(path.read_text())["fit"]["seconds"]["negatives"] == 0.0 for path in states)
    assert all(r["history_items"] == 2 for r in truncated)
    # the per-user table showed the file's whole history under --history-limit (audit85)
    from localpers.bench.results import build_results

    limited = dataclasses.replace(
        written.run, config=dataclasses.replace(written.run.config, history_limit=2)
    )
    assert {row["history_items"] for row in build_results(limited)["users"].values()} == {2}
    assert rows["card@history=2"]["fit_shared_negatives"] and not rows["card"]["fit_shared_negatives"]
    for name, row in rows.items():
        queries = [q for record in written.run.records[name] for q in record["queries"]]
        waited = [q["prompt_ms"] + q["tokens"] * q["ms_per_token"] for q in queries]
        assert row["rewrite_ms"] == pytest.approx(sum(waited) / len(waited), abs=0.01), name
        assert row["rewrite_ms"] > row["prompt_ms"] > 0, name


def test_outputs_report_and_plots_are_written(first_run) -> None:
    config, written, progress_calls = first_run
    lines = [json.loads(line) for line in (config.out / "outputs.jsonl").read_text().splitlines()]
    assert len(lines) == 7 * 4
    assert {line["method"] for line in lines} == set(written.results["methods"])
    assert all({"user", "query_id", "method", "text", "rouge1", "rougeL"} <= set(line) for line in lines)
    report = (config.out / "report.md").read_text()
    assert "| Method | R-1 | R-L | ΔR-1 vs global" in report
    assert "## Low-resource curve" in report and "## Strength α sweep" in report
    for reference in ("BAKERY DOUBLES UP", "a snowy monday"):
        assert reference not in report  # numbers only
    names = {path.name for path in written.plots}
    assert names == {
        "bars.png",
        "authors.png",
        "siblings.png",
        "gold.png",
        "low_resource.png",
        "alpha_sweep.png",
    }
    assert "## Per author" in report and "| Method | authors improved |" in report
    assert "## Cost against global" in report and "| global | " in report.split("## Cost against global")[1]
    for path in written.plots:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a progress report per method, ending with every user done
    finished = {(m, d, t) for m, d, t, _ in progress_calls if d == t}
    assert {(name, 2, 2) for name in written.results["methods"]} <= finished
    # user by user, every method in turn: each method finishes the first user before any starts the second
    user_done = [(m, d) for m, d, _, detail in progress_calls if not detail and d > 0]
    methods = list(written.results["methods"])
    assert user_done == [(m, 1) for m in methods] + [(m, 2) for m in methods]


def test_strength_zero_equals_cluster_and_rag_prompt_holds_examples(
    first_run, personalizer: Personalizer
) -> None:
    config, written, _ = first_run
    records = written.run.records
    cluster_texts = [q["text"] for r in records["cluster"] for q in r["queries"]]
    assert cluster_texts  # and card@strength=0 would reproduce them: checked on one query, cheaply
    users = load_bench_users(config.data)
    record = records["cluster"][0]
    zero = personalizer.rewrite(
        users[0].queries[0].input, method="card", cluster=record["cluster"], vector=None, strength=0.0
    )
    assert zero.text == record["queries"][0]["text"]
    prefix = few_shot_prefix(list(users[0].history[:2]))
    assert prefix.count("Headline:") == 2 and prefix.endswith("BAKERY WINS BIG!!!\n\n") is False


def test_second_run_reuses_the_cache(
    first_run, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, written, _ = first_run
    calls = {"rewrite": 0, "fit": 0}
    real_rewrite, real_fit = personalizer.rewrite, personalizer.fit_user

    def counting_rewrite(*args, **kwargs):
        calls["rewrite"] += 1
        return real_rewrite(*args, **kwargs)

    def counting_fit(*args, **kwargs):
        calls["fit"] += 1
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(personalizer, "rewrite", counting_rewrite)
    monkeypatch.setattr(personalizer, "fit_user", counting_fit)
    again = run_and_write(config, personalizer=personalizer)
    assert calls == {"rewrite": 0, "fit": 0}
    assert again.results["methods"] == written.results["methods"]

    # An interrupted run leaves at most one (method, user) unfinished: only that one is redone,
    # and the user's stored fit is reused rather than refitted.
    cache_file = config.out / "cache" / "card" / f"{store_name('Quiet User')}.json"
    assert cache_file.is_file()
    cache_file.write_text("{")  # half-written
    third = run_and_write(config, personalizer=personalizer)
    assert calls == {"rewrite": 2, "fit": 0}
    assert third.results["methods"]["card"]["rouge1"] == written.results["methods"]["card"]["rouge1"]


def test_a_run_resumed_on_other_kernels_computes_again(
    first_run, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Outputs change with the CPU's kernels (another CPU, LOCALPERS_CPU_BUFFERS): a resumed run mixed both
    configurations' outputs without a note (audit85); the kernels are in the cache's fingerprint now."""
    config, _, _ = first_run
    calls = {"rewrite": 0}
    real_rewrite = personalizer.rewrite

    def counting_rewrite(*args, **kwargs):
        calls["rewrite"] += 1
        return real_rewrite(*args, **kwargs)

    monkeypatch.setattr(personalizer, "rewrite", counting_rewrite)
    kernels = {**personalizer.engine.kernels, "buffers": ["another CPU's"]}
    monkeypatch.setattr(type(personalizer.engine), "kernels", property(lambda engine: kernels))
    import shutil

    copy = Path(shutil.copytree(config.out, tmp_path / "out"))  # the module's run stays as it is
    run_and_write(dataclasses.replace(config, out=copy, methods=["global"]), personalizer=personalizer)
    assert calls["rewrite"] > 0


@pytest.mark.parametrize("changed", ["kernels", "code"])
def test_a_run_resumed_on_other_kernels_or_code_fits_again_from_fresh_y_minus(
    first_run, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, changed: str
) -> None:
    """The fits' fingerprint held neither the CPU's kernels nor the code: a run resumed on another CPU recomputed
    card-auto's outputs on the old CPU's y-, vector and choice, and results and fits outlived commits that changed
    what they compute (eighty-seventh session's bench audit)."""
    import shutil

    from localpers.bench import fits

    config, _, _ = first_run
    if changed == "kernels":
        kernels = {**personalizer.engine.kernels, "system": "another CPU"}
        monkeypatch.setattr(type(personalizer.engine), "kernels", property(lambda engine: kernels))
    else:
        from localpers.bench import runner

        monkeypatch.setattr(fits, "code_sha256", lambda: "another commit")
        monkeypatch.setattr(runner, "code_sha256", lambda: "another commit")
    rewrites: list[bool] = []
    real_rewrite = personalizer.rewrite

    def rewrite(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        rewrites.append(True)
        return real_rewrite(*args, **kwargs)

    monkeypatch.setattr(personalizer, "rewrite", rewrite)
    y_minus_at_fit: list[bool] = []
    real_fit = personalizer.fit_user

    def fit_user(user, **kwargs):  # noqa: ANN001, ANN003, ANN202
        y_minus_at_fit.append((user.dir / "negatives.json").exists())
        return real_fit(user, **kwargs)

    monkeypatch.setattr(personalizer, "fit_user", fit_user)
    copy = Path(shutil.copytree(config.out, tmp_path / "out"))
    run_and_write(dataclasses.replace(config, out=copy, methods=["card-auto"]), personalizer=personalizer)
    assert y_minus_at_fit and not any(y_minus_at_fit)  # every fit again, none from the other run's y-
    assert rewrites  # and the results too, not only the fits


def test_a_fit_stopped_midway_keeps_its_saved_y_minus_for_the_resumed_run(
    first_run, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The configuration was recorded only once a fit ended: a fit stopped after saving y- (which it does so that
    the next fit starts from there) had them deleted as another configuration's on the resumed run (session
    review)."""
    import json
    import shutil

    from localpers.bench import fits

    config, _, _ = first_run
    monkeypatch.setattr(fits, "code_sha256", lambda: "a new commit")  # every fit is due again
    real_fit = personalizer.fit_user

    def stopped(user, **kwargs):  # noqa: ANN001, ANN003, ANN202
        (user.dir / "negatives.json").write_text(
            json.dumps({"saved": {"item": "a y- saved before the stop"}})
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(personalizer, "fit_user", stopped)
    copy = Path(shutil.copytree(config.out, tmp_path / "out"))
    resumed = dataclasses.replace(config, out=copy, methods=["card-auto"])
    with pytest.raises(KeyboardInterrupt):
        run_and_write(resumed, personalizer=personalizer)
    found: list[bool] = []

    def resumed_fit(user, **kwargs):  # noqa: ANN001, ANN003, ANN202
        path = user.dir / "negatives.json"
        found.append(path.exists() and "saved" in json.loads(path.read_text()))
        return real_fit(user, **kwargs)

    monkeypatch.setattr(personalizer, "fit_user", resumed_fit)
    run_and_write(resumed, personalizer=personalizer)
    assert found and found[0]


def test_a_run_resumed_with_other_threads_says_its_timings_mix_them(
    first_run, personalizer: Personalizer
) -> None:
    config, written, _ = first_run
    assert not written.results["config"].get("run_notes")  # one run, one thread count
    cache_file = config.out / "cache" / "card" / f"{store_name('Quiet User')}.json"
    original = cache_file.read_text()
    record = json.loads(original)
    assert record["threads"] == personalizer.engine.n_threads
    record["threads"] = personalizer.engine.n_threads + 1  # as if timed by a run with another --threads
    cache_file.write_text(json.dumps(record))
    try:
        again = run_and_write(config, personalizer=personalizer)
    finally:
        cache_file.write_text(original)
    (note,) = again.results["config"]["run_notes"]
    assert note.startswith("timings mix llama.cpp thread counts (") and "1 with " in note
    assert note in (config.out / "report.md").read_text()
    assert again.results["methods"]["card"]["rouge1"] == written.results["methods"]["card"]["rouge1"]


class _Borrowed:
    """The module's Personalizer lent to the CLI, which must not close it."""

    def __init__(self, personalizer: Personalizer) -> None:
        self._personalizer = personalizer

    def __getattr__(self, name: str):
        return getattr(self._personalizer, name)

    def close(self) -> None:
        pass


def test_cli_bench_json_and_one_line_errors(
    first_run, data_file: Path, tmp_path: Path, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, written, _ = first_run
    opened = []

    def open_borrowed(*, model=None, bundle=None, n_threads=None):
        opened.append(bundle)
        return _Borrowed(personalizer)

    monkeypatch.setattr(Personalizer, "open", staticmethod(open_borrowed))
    runner = CliRunner()
    bundle = str(written.results["config"]["bundle"])
    args = [
        "bench",
        "--data",
        str(data_file),
        "--out",
        str(config.out),
        "--bundle",
        bundle,
        "--bootstrap",
        "500",
    ]
    result = runner.invoke(app, [*args, *sum((["-m", m] for m in METHODS), []), "--json"])
    assert result.exit_code == 0, result.output
    assert opened == [Path(bundle)]
    printed = json.loads(result.stdout)["methods"]
    assert {name: row["rouge1"] for name, row in printed.items()} == {
        name: row["rouge1"] for name, row in written.results["methods"].items()
    }

    bad = runner.invoke(app, [*args, "-m", "card@stength=2"])
    assert bad.exit_code != 0 and "has no parameter 'stength'" in bad.output and "Traceback" not in bad.output
    missing = runner.invoke(app, ["bench", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)])
    assert missing.exit_code != 0 and "no such file" in missing.output


def test_cli_bench_without_methods_runs_the_product_and_judges_its_targets(
    first_run, data_file: Path, tmp_path: Path, personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    config, written, _ = first_run
    out = tmp_path / "product"
    shutil.copytree(config.out, out)  # global's records are reused from the cache
    monkeypatch.setattr(Personalizer, "open", staticmethod(lambda **_: _Borrowed(personalizer)))
    bundle = str(written.results["config"]["bundle"])
    args = ["bench", "--data", str(data_file), "--out", str(out), "--bundle", bundle, "--bootstrap", "500"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["methods"] == ["global", "global-history", "card-auto"]
    targets = results["targets"]
    assert targets["method"] == "card-auto" and len(targets["checks"]) == 7
    assert {check["met"] for check in targets["checks"]} <= {True, False, None}
    assert targets["checks"][6]["met"] is None  # fitted on whole histories, not on 20 items
    assert f"targets  card-auto against global: {targets['summary']}" in result.output
    # loud's q1 is the one query with a sibling (0.3-0.5); none reaches 0.5
    assert "siblings 0.0% of the queries have a sibling >= 0.5; card-auto / global: " in result.output
    report = (out / "report.md").read_text()
    assert "## Targets: `card-auto` (the default) against global" in report
    assert report.count("| target | measured | |") == 1


def test_bench_refuses_an_out_directory_it_did_not_write(data_file: Path, tmp_path: Path) -> None:
    from localpers.bench.runner import check_output_directory

    project = tmp_path / "project"
    project.mkdir()
    (project / "report.md").write_text("the user's own report\n")
    result = CliRunner().invoke(
        app, ["bench", "--data", str(data_file), "--out", str(project), "-m", "global"]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"--out {project} already holds files a benchmark did not write (report.md)" in result.output
    assert (project / "report.md").read_text() == "the user's own report\n"
    earlier = tmp_path / "earlier"
    (earlier / "cache").mkdir(parents=True)
    probes = tmp_path / "probes"
    (probes / "bold" / "cache").mkdir(parents=True)
    for fine in (tmp_path / "new", earlier, probes):
        check_output_directory(fine)  # a fresh directory, or a run's or probes' own, which reruns resume


def test_parse_and_canonical_method_names() -> None:
    assert parse_method("card@top_k=50,strength=0.5") == MethodSpec(
        "card", (("strength", 0.5), ("top_k", 50))
    )
    assert parse_method("card@strength=0.5,top_k=50").name == "card@strength=0.5,top_k=50"
    assert parse_method("rag@k=2,history=all").name == "rag@history=all,k=2"
    # 6 significant digits named both alike: one cache file and one results entry, then a traceback (audit85)
    assert parse_method("global@presence=0.1000001").name == "global@presence=0.1000001"
    assert parse_method("global@presence=0.1").name == "global@presence=0.1"
    fake = SimpleNamespace(
        head_config=HeadConfig(alpha=1.0, top_k=20, u="factored"), prompt_format=PromptFormat(recent=4)
    )
    assert canonical_spec(parse_method("card@strength=1"), fake, None) == MethodSpec("card")
    assert canonical_spec(parse_method("card@history=5"), fake, 5) == MethodSpec("card")
    assert canonical_spec(parse_method("card@reg=1"), fake, None) == MethodSpec("card")
    assert canonical_spec(parse_method("card@reg=0.1"), fake, None).name == "card@reg=0.1"
    assert canonical_spec(parse_method("card"), fake, 5) == MethodSpec("card")
    assert canonical_spec(parse_method("card@history=all"), fake, 5).name == "card@history=all"
    # the device's prompt (4 recent examples) is the default; the trained format (no recent ones) is named
    assert canonical_spec(parse_method("cluster@recent=4"), fake, None) == MethodSpec("cluster")
    assert canonical_spec(parse_method("cluster@recent=0"), fake, None).name == "cluster@recent=0"
    assert split_method_list("cluster,card@bias=2,history=20,rag") == [
        "cluster",
        "card@bias=2,history=20",
        "rag",
    ]
    mixed = expand_methods(["cluster,card@top_k=5,history=all", "rag@k=2,history=5"], fake, None)
    assert [s.name for s in mixed] == [
        "global",
        "cluster",
        "card@top_k=5",
        "rag@history=5,k=2",
    ]  # all = default
    specs = expand_methods(["alpha-sweep"], fake, None)
    assert [s.name for s in specs][:3] == ["global", "card@strength=0.0", "card@strength=0.25"]
    assert "card" in [s.name for s in specs]  # the default strength is plain card
    for bad, message in (
        ("nope", "unknown method"),
        ("global@k=2", "has no parameter"),
        ("card@strength=-1", "at least 0"),
        ("card@top_k=0", "at least 1"),
        ("card@top_k=x", "not a valid int"),
        ("card@strength", "key=value"),
        ("card@reg=0", "greater than 0"),
    ):
        with pytest.raises(LocalpersError, match=message):
            parse_method(bad)


def test_every_device_method_is_measured_by_a_bench_method() -> None:
    """A method added to the device's registry without a benchmark counterpart fails here."""
    from localpers.bench.registry import BASELINE, REGISTRY, bench_method_for, unmeasured_device_methods
    from localpers.methods.registry import BASELINE_METHOD, method_names

    assert unmeasured_device_methods() == []
    assert bench_method_for("card") == "card-auto"  # rewrite's CARD uses the strengths the fit chose
    assert BASELINE == bench_method_for(BASELINE_METHOD) == "global"
    for cls in REGISTRY.values():
        assert cls.device_method is None or cls.device_method in method_names(), cls.name
    measured = [cls.device_method for cls in REGISTRY.values() if cls.device_method]
    assert len(measured) == len(set(measured))  # one bench method per device method


def test_bench_help_names_every_method_and_preset() -> None:
    import re

    from localpers.bench.method_names import PRESETS
    from localpers.bench.registry import REGISTRY
    from localpers.cli.bench import METHODS_HELP

    named = set(re.findall(r"[a-z][a-z-]*[a-z]", METHODS_HELP))
    assert set(REGISTRY) <= named, set(REGISTRY) - named
    assert set(PRESETS) <= named, set(PRESETS) - named


def test_full_u_method_refuses_a_factored_bundle() -> None:
    fake = SimpleNamespace(
        head_config=HeadConfig(alpha=1.0, top_k=20, u="factored"),
        bundle=SimpleNamespace(directory="b"),
        prompt_format=PromptFormat(recent=4),
    )
    with pytest.raises(LocalpersError, match="needs a bundle with a full U"):
        expand_methods(["card-full-u"], fake, None)
    assert [s.name for s in expand_methods(["card-factored-u"], fake, None)] == ["global", "card-factored-u"]


def test_data_loading_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(USERS[0])
        + "\n"
        + json.dumps({"user_id": "x", "history": [], "queries": [{"id": "q"}]})
        + "\n"
    )
    with pytest.raises(LocalpersError, match=r"line 2 \(user x\) query 1: field 'input'"):
        load_bench_users(path)
    path.write_text("{not json\n")
    with pytest.raises(LocalpersError, match="line 1: not valid JSON"):
        load_bench_users(path)
    path.write_text(json.dumps(USERS[0]) + "\n" + json.dumps(USERS[0]) + "\n")
    with pytest.raises(LocalpersError, match="collides with line 1"):
        load_bench_users(path)
    path.write_text(json.dumps(USERS[0]) + "\n" + json.dumps({**USERS[0], "user_id": "LOUD"}) + "\n")
    assert len(load_bench_users(path)) == 2  # ids alike once lowercased are still two users


def test_a_file_from_elsewhere_is_read_as_the_protocol_says_and_every_repair_is_noted(tmp_path: Path) -> None:
    """History oldest first, no query in its own history, no duplicates, users without queries left out,
    queries dated before the history counted; a UTF-8 BOM is no error. Each repair is one note."""

    def item(i: int, date: str) -> dict[str, str]:
        return {
            "id": f"n{i}",
            "input": f"Article {i} about the harbour.",
            "output": f"Headline {i}",
            "date": date,
        }

    answer = item(9, "2021-05-01")
    lines = [
        {  # newest first, the answer in the history, one item twice
            "user_id": "ann",
            "history": [
                item(3, "2021-03-01"),
                answer,
                item(2, "2021-02-01"),
                item(1, "2021-01-01"),
                item(1, "2021-01-01"),
            ],
            "queries": [answer],
        },
        {"user_id": "bob", "history": [item(5, "2021-01-01")], "queries": []},
        {"user_id": "cat", "history": [item(6, "2021-06-01")], "queries": [item(7, "2021-04-01")]},
    ]
    path = tmp_path / "elsewhere.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(line) + "\n" for line in lines).encode())
    read = read_bench_file(path)
    ann, cat = read.users
    assert [h.output for h in ann.history] == ["Headline 1", "Headline 2", "Headline 3"]
    assert [u.user_id for u in read.users] == ["ann", "cat"] and (ann.line, cat.line) == (1, 3)
    assert len(read.notes) == 5, read.notes
    notes = "\n".join(read.notes)
    for expected in (
        "user ann was not oldest first: sorted",
        "1 history item(s) equal to one of their author's queries left out",
        "1 duplicate history item(s) dropped (user ann)",
        "1 query(ies) dated before their author's latest history item (user cat)",
        "1 user(s) without queries left out (user bob)",
    ):
        assert expected in notes
    # the query's exact headline for another article: kept (an author may repeat one), but said (audit85)
    repeat = {**item(4, "2021-04-01"), "output": answer["output"]}
    lines[0]["history"].append(repeat)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    again = read_bench_file(path)
    assert any(
        note.startswith("1 history item(s) hold one of their author's query headlines word for word")
        for note in again.notes
    ), again.notes
    assert answer["output"] in [h.output for h in again.users[0].history]


def test_a_history_too_long_for_a_user_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from localpers.bench.runner import _check_history_sizes
    from localpers.users.history import MAX_HISTORY_ITEMS

    history = [{"input": f"Article {i}.", "output": f"Headline {i}"} for i in range(MAX_HISTORY_ITEMS + 1)]
    query = {"id": "q1", "input": "A new article.", "output": "北京推出新交通政策"}
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"user_id": "ann", "history": history, "queries": [query]}) + "\n")
    users = load_bench_users(path)
    with pytest.raises(LocalpersError, match=r"line 1 \(user ann\): 501 history items.*--history-limit 500"):
        _check_history_sizes(BenchConfig(data=path, out=tmp_path / "out"), users)
    _check_history_sizes(BenchConfig(data=path, out=tmp_path / "out", history_limit=20), users)
    assert read_bench_file(path).notes == [
        "1 of 1 references have no word ROUGE can count (rouge-score keeps only a-z and 0-9), so every method "
        "scores 0 on them (user ann)"
    ]


@pytest.mark.skipif(not (SHARED_DATA / "test.jsonl").is_file(), reason="../shared data is absent")
def test_the_shared_files_are_read_as_written() -> None:
    assert read_bench_file(SHARED_DATA / "test.jsonl").notes == []
    assert read_bench_file(SHARED_DATA / "train.jsonl", dev_split=True).notes == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"input": "Headline of a story", "output": "An article. " * 40},
            r"query 1: field 'output' has 479 characters.*swapped",
        ),
        (
            {"input": "Generate a headline for the following article:", "output": "A headline"},
            r"query 1: field 'input' holds the instruction but no text",
        ),
    ],
)
def test_bench_data_refuses_swapped_fields_and_an_empty_article(
    tmp_path: Path, entry: dict, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"user_id": "ann", "history": [], "queries": [entry]}) + "\n")
    with pytest.raises(LocalpersError, match=message):
        load_bench_users(path)
    with pytest.raises(LocalpersError, match="is a directory"):
        load_bench_users(tmp_path)


def test_data_loading_limits_and_history_order(data_file: Path) -> None:
    users = load_bench_users(data_file, max_users=1, max_queries=1)
    assert len(users) == 1 and len(users[0].queries) == 1
    assert [item.output for item in users[0].history_up_to(2)] == [
        "BAKERY WINS BIG!!!",
        "RIVER FLOODS STREETS!!!",
    ]
    assert users[0].history_up_to(0) == ()
    assert isinstance(users[0].history[0], HistoryItem)
    assert store_name("u003") == "u003"  # a name the store takes is kept as it is
    assert re.fullmatch(r"quiet-user-[0-9a-f]{8}", store_name("Quiet User"))
    assert re.fullmatch(r"user-[0-9a-f]{8}", store_name("!!!"))
    distinct = ["李明", "王芳", "Zoë", "Zoé", "a" * 40 + "1", "a" * 40 + "2"]
    names = [store_name(user_id) for user_id in distinct]
    assert len(set(names)) == len(distinct)
    assert all(re.fullmatch(r"[a-z0-9_-]{1,32}", name) for name in names)


def test_cope_and_exact_run_in_the_bench_registry(
    data_file: Path, personalizer: Personalizer, tmp_path: Path
) -> None:
    """The `related` preset expands to cope and exact; both fit per user, generate, and report their costs."""
    out = tmp_path / "out"
    config = BenchConfig(
        data=data_file,
        out=out,
        methods=["related", "exact@pairs=1"],
        max_users=1,
        max_queries=1,
        n_resamples=200,
    )
    written = run_and_write(config, personalizer=personalizer)
    methods = written.results["methods"]
    assert {"global", "cope", "exact", "exact@pairs=1"} <= set(methods)
    for name in ("cope", "exact", "exact@pairs=1"):
        assert methods[name]["n"] == 1
        assert methods[name]["fit_s_per_user"] > 0
        assert methods[name]["bytes_per_user"] > 0
    assert (out / "method-state" / "cope").is_dir() and (out / "method-state" / "exact").is_dir()
    generated = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert {row["method"] for row in generated} >= {"cope", "exact"}


def test_global_history_always_builds_a_history_prompt_even_on_a_plain_bundle() -> None:
    """On a bundle without a prompt format it is the "same prompt, untrained adapter" ablation, not `global`."""
    from localpers.bench.methods import MethodSpec, UserProfile
    from localpers.bench.prompt_methods import history_index
    from localpers.bench.registry import get_method
    from localpers.users.history import HistoryItem
    from localpers.users.history_prompt import PromptFormat

    class Recorder:
        prompt_format = None

        def rewrite(self, text: str, **kwargs: object) -> dict[str, object]:
            return kwargs

    method = get_method("global-history")
    item = HistoryItem.create("headline", "Generate a headline for the following article: a b", "A B")
    profile = UserProfile("u", (item,))
    prepared = method.prepare(Recorder(), profile, MethodSpec("global-history"))  # type: ignore[arg-type]
    assert prepared.pool == history_index(profile).pool
    sent = method.generate(Recorder(), profile, prepared, "text", MethodSpec("global-history"))  # type: ignore[arg-type]
    assert sent["prompt_format"] == PromptFormat(examples=5) and sent["history"] is prepared
    sent = method.generate(
        Recorder(), profile, prepared, "t", MethodSpec("global-history", (("examples", 3),))
    )  # type: ignore[arg-type]
    assert sent["prompt_format"] == PromptFormat(examples=3)


def test_penalty_parameters_reach_the_sampler_chain_settings() -> None:
    """`global@presence=1`, `global-history@frequency=1`: llama.cpp's penalties, greedy; none named, None (greedy
    with the task's word rule, which `rewrite` fills in); `@repeated_words=0` turns the rule off explicitly."""
    from localpers.bench.methods import MethodSpec, UserProfile
    from localpers.bench.registry import get_method
    from localpers.engine.decoding import SamplerSettings

    class Recorder:
        prompt_format = None

        def rewrite(self, text: str, **kwargs: object) -> dict[str, object]:
            return kwargs

    profile = UserProfile("u", ())
    sent = get_method("global").generate(Recorder(), profile, None, "t", parse_method("global"))  # type: ignore[arg-type]
    assert sent["sampling"] is None
    sent = get_method("global").generate(Recorder(), profile, None, "t", parse_method("global@presence=1"))  # type: ignore[arg-type]
    assert sent["sampling"] == SamplerSettings(presence_penalty=1.0)
    spec = parse_method("global-history@frequency=1,dry=0.8")
    assert spec == MethodSpec("global-history", (("dry", 0.8), ("frequency", 1)))
    sent = get_method("global-history").generate(Recorder(), profile, None, "t", spec)  # type: ignore[arg-type]
    assert sent["sampling"] == SamplerSettings(frequency_penalty=1.0, dry_multiplier=0.8)
    assert sent["sampling"].greedy
    sent = get_method("global").generate(
        Recorder(), profile, None, "t", parse_method("global@repeated_words=3")
    )  # type: ignore[arg-type]
    assert sent["sampling"] == SamplerSettings(repeated_word_penalty=3.0)
    sent = get_method("global").generate(
        Recorder(), profile, None, "t", parse_method("global@repeated_words=0")
    )  # type: ignore[arg-type]
    assert sent["sampling"] == SamplerSettings(repeated_word_penalty=0.0)  # off, not the task's default
    with pytest.raises(LocalpersError, match="presence_penalty must be in"):
        get_method("global").generate(Recorder(), profile, None, "t", parse_method("global@presence=3"))  # type: ignore[arg-type]


def test_the_word_rule_at_the_headline_default_is_the_plain_method_name() -> None:
    """`card-auto@repeated_words=3` is `card-auto` (the task's default, dropped from the name); 0 stays named."""
    from localpers.bench.method_names import canonical_spec
    from localpers.tasks import get_task

    class Head:
        default_strength, top_k = 1.0, 50

    class Plain:
        head_config = Head()
        prompt_format = None

    default = get_task("headline").repeated_word_penalty
    assert default > 0
    for base in ("global", "global-history", "card-auto"):
        named = canonical_spec(parse_method(f"{base}@repeated_words={default:g}"), Plain(), None)  # type: ignore[arg-type]
        assert named.get("repeated_words") is None, named
        off = canonical_spec(parse_method(f"{base}@repeated_words=0"), Plain(), None)  # type: ignore[arg-type]
        assert off.get("repeated_words") == 0.0, off


def test_dev_split_takes_each_train_authors_most_recent_30_percent_as_queries(tmp_path: Path) -> None:
    def item(i: int) -> dict[str, str]:
        return {"id": f"n{i}", "input": f"Article number {i} about the town.", "output": f"Headline {i}"}

    path = tmp_path / "train.jsonl"
    lines = [
        {"user_id": "long", "history": [item(i) for i in range(200)], "queries": []},  # 30% = 60 -> 40
        {"user_id": "mid", "history": [item(i) for i in range(20)], "queries": []},  # 30% = 6
        {"user_id": "short", "history": [item(i) for i in range(5)], "queries": []},  # 5 queries need 6 items
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    users = {user.user_id: user for user in load_bench_users(path, dev_split=True)}
    assert set(users) == {"long", "mid"}
    long, mid = users["long"], users["mid"]
    assert [q.reference for q in long.queries] == [f"Headline {i}" for i in range(160, 200)]
    assert [h.output for h in long.history] == [
        f"Headline {i}" for i in range(60, 160)
    ]  # at most 100 earlier
    assert [q.reference for q in mid.queries] == [f"Headline {i}" for i in range(14, 20)]
    assert len(mid.history) == 14
    with pytest.raises(LocalpersError, match="no user has queries; .* add --dev-split"):
        load_bench_users(path)  # without the split a train file has no queries


def test_dev_split_refuses_a_file_whose_authors_have_queries(tmp_path: Path) -> None:
    """Bench audit (eightieth session): `--dev-split` on test.jsonl moved its queries into the histories,
    re-split them and scored test queries in a run labelled a dev split, with no note: settings "chosen on the
    dev split" could be tuned on the test queries."""
    path = tmp_path / "test.jsonl"
    history = [{"input": f"Article {i} about the town.", "output": f"Headline {i}"} for i in range(12)]
    query = {"input": "A later article about the town.", "output": "A later headline"}
    path.write_text(json.dumps({"user_id": "u1", "history": history, "queries": [query]}) + "\n")
    with pytest.raises(InputError, match="line 1 \\(user u1\\): holds queries, .* drop --dev-split"):
        load_bench_users(path, dev_split=True)
    assert [q.reference for q in load_bench_users(path)[0].queries] == ["A later headline"]
