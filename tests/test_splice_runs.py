"""`scripts/splice_runs.py`: a whole run with some authors replaced by a smaller run's, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "splice_runs.py"
COMPARE = SCRIPT.with_name("compare_runs.py")


def make_run(folder: Path, method: str, scores: dict[str, float]) -> Path:
    (folder / "cache" / method).mkdir(parents=True)
    with (folder / "outputs.jsonl").open("a") as writer:
        for user, score in scores.items():
            query = {"query_id": "q1", "rouge1": score, "ms_per_token": 1.0, "prompt_ms": 1.0}
            (folder / "cache" / method / f"{user}.json").write_text(
                json.dumps({"user": user, "queries": [query]})
            )
            record = {
                "user": user,
                "query_id": "q1",
                "method": method,
                "text": f"{user} {score}",
                "rouge1": score,
            }
            writer.write(json.dumps(record) + "\n")
    return folder


def splice(*folders: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, folders)], capture_output=True, text=True)


def test_replaces_the_parts_authors_and_keeps_the_rest(tmp_path: Path) -> None:
    base = make_run(tmp_path / "base", "m", {"u1": 0.1, "u2": 0.2, "u3": 0.3})
    part = make_run(tmp_path / "part", "m", {"u2": 0.9})
    done = splice(base, part, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    cache = tmp_path / "out" / "cache" / "m"
    scores = {p.stem: json.loads(p.read_text())["queries"][0]["rouge1"] for p in cache.glob("*.json")}
    assert scores == {"u1": 0.1, "u2": 0.9, "u3": 0.3}
    lines = [json.loads(line) for line in (tmp_path / "out" / "outputs.jsonl").read_text().splitlines()]
    assert sorted((r["user"], r["rouge1"]) for r in lines) == [("u1", 0.1), ("u2", 0.9), ("u3", 0.3)]


def test_refuses_new_authors_missing_methods_and_a_used_folder(tmp_path: Path) -> None:
    base = make_run(tmp_path / "base", "m", {"u1": 0.1})
    stranger = make_run(tmp_path / "stranger", "m", {"u9": 0.5})
    assert "lacks" in splice(base, stranger, tmp_path / "o1").stderr
    other = make_run(tmp_path / "other", "n", {"u1": 0.5})
    assert "did not run n" in splice(base, other, tmp_path / "o2").stderr
    assert "not empty" in splice(base, base, base).stderr


def test_authors_whose_user_id_is_no_store_name_are_spliced_once(tmp_path: Path) -> None:
    """outputs.jsonl names authors by user_id, the cache files by store name: "Alice Smith"'s lines were kept from
    both runs (audit85)."""
    runs = {}
    for name, score in (("base", 0.1), ("part", 0.9)):
        folder = tmp_path / name
        (folder / "cache" / "m").mkdir(parents=True)
        record = {"user": "alice-smith-8ae10dfc", "user_id": "Alice Smith", "queries": [{"query_id": "q1"}]}
        (folder / "cache" / "m" / "alice-smith-8ae10dfc.json").write_text(json.dumps(record))
        line = {"user": "Alice Smith", "query_id": "q1", "method": "m", "rouge1": score}
        (folder / "outputs.jsonl").write_text(json.dumps(line) + "\n")
        runs[name] = folder
    done = splice(runs["base"], runs["part"], tmp_path / "out")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "out" / "outputs.jsonl").read_text().splitlines()]
    assert [(r["user"], r["rouge1"]) for r in lines] == [("Alice Smith", 0.9)]


def test_only_the_users_of_bases_run_are_spliced_and_out_can_be_filtered(tmp_path: Path) -> None:
    """BASE's cache also kept u3 from an earlier run into the same folder; the splice copied it and wrote no
    results.json, so compare_runs read 3 authors and 0.7x where the run is 1.4x over 2 (audit89 M2)."""
    base = tmp_path / "base"
    for method, scores in (
        ("global", {"u1": 0.2, "u2": 0.3, "u3": 0.5}),
        ("card", {"u1": 0.3, "u2": 0.3, "u3": 0.0}),
    ):
        make_run(base, method, scores)
    users = {user: {"queries": 1, "fingerprints": {"global": None, "card": None}} for user in ("u1", "u2")}
    (base / "results.json").write_text(json.dumps({"users": users}))
    part = tmp_path / "part"
    for method, score in (("global", 0.2), ("card", 0.4)):
        make_run(part, method, {"u1": score})
        record = json.loads((part / "cache" / method / "u1.json").read_text())
        (part / "cache" / method / "u1.json").write_text(
            json.dumps({**record, "fingerprint": f"new-{method}"})
        )
    out = tmp_path / "out"
    done = splice(base, part, out)
    assert done.returncode == 0, done.stderr
    assert sorted(p.stem for p in (out / "cache" / "card").glob("*.json")) == ["u1", "u2"]
    written = json.loads((out / "results.json").read_text())["users"]
    assert sorted(written) == ["u1", "u2"] and written["u1"]["fingerprints"]["card"] == "new-card"
    compared = subprocess.run(
        [sys.executable, str(COMPARE), f"{out}:global", f"{out}:card", "--json", "--resamples", "200"],
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(compared.stdout)["compared"][f"{out}:card"]
    assert row["authors"] == 2 and row["ratio"] == 1.4


def test_a_users_table_without_query_counts_is_spliced_and_read(tmp_path: Path) -> None:
    """An older results.json names no query count: OUT's table held `"queries": null`, and compare_runs then refused
    every user of the spliced run."""
    base = tmp_path / "base"
    for method, scores in (("global", {"u1": 0.2, "u2": 0.3}), ("card", {"u1": 0.3, "u2": 0.3})):
        make_run(base, method, scores)
    users = {user: {"fingerprints": {"global": None, "card": None}} for user in ("u1", "u2")}
    (base / "results.json").write_text(json.dumps({"users": users}))
    part = tmp_path / "part"
    for method, score in (("global", 0.2), ("card", 0.4)):
        make_run(part, method, {"u1": score})
    out = tmp_path / "out"
    done = splice(base, part, out)
    assert done.returncode == 0, done.stderr
    assert "queries" not in json.loads((out / "results.json").read_text())["users"]["u1"]
    compared = subprocess.run(
        [sys.executable, str(COMPARE), f"{out}:global", f"{out}:card", "--json", "--resamples", "200"],
        capture_output=True,
        text=True,
    )
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["compared"][f"{out}:card"]["authors"] == 2
