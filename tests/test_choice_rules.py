"""`scripts/choice_rules.py` on a hand-made bench run: each rule takes card-auto's scores only for the users it keeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "choice_rules.py"


def write_method(run: Path, method: str, scores: dict[str, tuple[float, float]]) -> None:
    """One query per user: {user: (rouge1, gold log p)}."""
    folder = run / "cache" / method
    folder.mkdir(parents=True)
    for user, (rouge, gold) in scores.items():
        query = {"query_id": "q0", "rouge1": rouge, "gold_logprob": gold}
        (folder / f"{user}.json").write_text(json.dumps({"user": user, "queries": [query]}))


def write_choice(run: Path, user: str, label: str, gaps: list[float], history: str = "all") -> None:
    """A stored choice whose `label` scored `gaps` above the adapter alone, item by item."""
    folder = run / "users" / f"history-{history}" / "users" / user
    folder.mkdir(parents=True)
    lead = sum(gaps) / len(gaps)
    choice = {
        "label": label,
        "scores": {"adapter": -3.0, label: -3.0 + lead},
        "n_items": len(gaps),
        "items_higher": sum(gap > 0 for gap in gaps),
        "item_scores": {"adapter": [-3.0] * len(gaps), label: [-3.0 + gap for gap in gaps]},
    }
    (folder / "state.json").write_text(json.dumps({"choice": choice}))


def read_rules(run: Path, *options: str) -> dict:
    """The script's JSON report on `run`, margin 0.01 and t >= 2 read."""
    command = [sys.executable, str(SCRIPT), str(run), "--json", "--resamples", "200", "--margins", "0.01"]
    result = subprocess.run(
        [*command, "--t-values", "2", *options], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_rules_keep_card_auto_only_for_the_users_they_accept(tmp_path: Path) -> None:
    plain = {"tiny": (0.2, -3.0), "broad": (0.2, -3.0), "none": (0.3, -2.0)}
    corrected = {"tiny": (0.1, -3.5), "broad": (0.4, -2.5), "none": (0.3, -2.0)}
    write_method(tmp_path, "global-history", plain)
    write_method(tmp_path, "card-auto", corrected)
    write_choice(tmp_path, "tiny", "vector", [0.0301, -0.01, -0.01, -0.01])  # a lead from one item of four
    write_choice(tmp_path, "broad", "bias", [0.02, 0.04, 0.03, 0.03])
    write_choice(tmp_path, "none", "adapter", [0.0] * 4)
    report = read_rules(tmp_path)
    assert report["premise_mismatches"] == 0 and report["queries"] == 3
    rules = report["rules"]
    today, margin, majority = rules["any lead"], rules["margin 0.01"], rules["majority"]
    assert today["users_corrected"] == 2 and today["rouge1"] == round((0.1 + 0.4 + 0.3) / 3, 4)
    for strict in (margin, majority, rules["t >= 2.0"]):  # "tiny" falls back to the adapter: global-history's
        assert strict["users_corrected"] == 1 and strict["rouge1"] == round((0.2 + 0.4 + 0.3) / 3, 4)
        assert strict["gold_vs_global_history"][1] == round(0.5 / 3, 4)
        assert strict["rouge1_vs_versus"][1] == round(0.1 / 3, 4)


def test_the_spread_rule_drops_a_lead_one_item_carries(tmp_path: Path) -> None:
    write_method(tmp_path, "global-history", {"lumpy": (0.2, -3.0), "steady": (0.2, -3.0)})
    write_method(tmp_path, "card-auto", {"lumpy": (0.1, -3.0), "steady": (0.3, -3.0)})
    write_choice(tmp_path, "lumpy", "vector", [0.09, -0.01, -0.01, 0.01])  # lead 0.02, t 0.84
    write_choice(tmp_path, "steady", "bias", [0.02, 0.02, 0.03, 0.01])  # lead 0.02, t 4.9
    report = read_rules(tmp_path, "--versus", "margin 0.01")
    rules = report["rules"]
    assert report["versus"] == "margin 0.01" and rules["margin 0.01"]["rouge1_vs_versus"][1] == 0
    assert rules["t >= 2.0"]["rouge1_vs_versus"][1] == 0.05  # lumpy's 0.1 back to global-history's 0.2
    assert rules["margin 0.01"]["users_corrected"] == 2
    assert rules["t >= 2.0"]["users_corrected"] == 1 and rules["t >= 2.0"]["rouge1"] == 0.25


def test_a_probe_style_run_is_read_from_its_20_item_fits(tmp_path: Path) -> None:
    write_method(tmp_path, "global-history@history=20", {"lumpy": (0.2, -3.0), "steady": (0.2, -3.0)})
    write_method(tmp_path, "card-auto@history=20", {"lumpy": (0.1, -3.0), "steady": (0.3, -3.0)})
    write_choice(tmp_path, "lumpy", "vector", [0.09, -0.01, -0.01, 0.01], history="20")
    write_choice(tmp_path, "steady", "bias", [0.02, 0.02, 0.03, 0.01], history="20")
    rules = read_rules(tmp_path, "--history", "20")["rules"]
    assert rules["any lead"]["users_corrected"] == 2 and rules["any lead"]["rouge1"] == 0.2
    assert rules["t >= 2.0"]["users_corrected"] == 1 and rules["t >= 2.0"]["rouge1"] == 0.25


def test_a_large_lead_is_kept_however_uneven(tmp_path: Path) -> None:
    write_method(tmp_path, "global-history", {"habit": (0.2, -3.0), "lumpy": (0.2, -3.0)})
    write_method(tmp_path, "card-auto", {"habit": (0.4, -2.0), "lumpy": (0.1, -3.0)})
    write_choice(tmp_path, "habit", "habits", [0.55, 0.15, 0.21, -0.13])  # lead 0.195, t 1.4
    write_choice(tmp_path, "lumpy", "vector", [0.09, -0.01, -0.01, 0.01])  # lead 0.02, t 0.84
    rules = read_rules(tmp_path, "--large-leads", "0.04")["rules"]
    assert rules["t >= 2.0 + margin 0.01"]["users_corrected"] == 0
    waived = rules["t >= 2.0 + margin 0.01, or lead >= 0.04"]
    assert waived["users_corrected"] == 1 and waived["rouge1"] == 0.3  # habit's 0.4, lumpy back to 0.2


def test_a_user_whose_id_is_no_store_name_is_read(tmp_path: Path) -> None:
    """The fits' folders and cache files are named by store name, the figures by user_id: "Alice Smith" (stored
    as alice-smith-8ae10dfc) was dropped from every rule without a word (audit89 M1)."""
    from localpers.bench.data import store_name

    name = store_name("Alice Smith")
    for method, rouge in (("global-history", 0.2), ("card-auto", 0.4)):
        write_method(tmp_path, method, {"u1": (0.2, -3.0)})
        query = {"query_id": "q0", "rouge1": rouge, "gold_logprob": -3.0}
        record = {"user": name, "user_id": "Alice Smith", "queries": [query]}
        (tmp_path / "cache" / method / f"{name}.json").write_text(json.dumps(record))
    write_choice(tmp_path, "u1", "adapter", [0.0] * 4)
    write_choice(tmp_path, name, "bias", [0.02, 0.04, 0.03, 0.03])
    report = read_rules(tmp_path)
    assert report["users"] == 2 and report["queries"] == 2
    assert report["rules"]["any lead"]["users_corrected"] == 1
    assert report["rules"]["any lead"]["rouge1"] == 0.3


def test_no_user_in_common_is_one_line(tmp_path: Path) -> None:
    """It was compare_authors' "no queries to compare" traceback (audit89 L1)."""
    write_method(tmp_path, "global-history", {"u1": (0.2, -3.0)})
    write_method(tmp_path, "card-auto", {"u2": (0.3, -3.0)})
    write_choice(tmp_path, "u1", "adapter", [0.0] * 4)
    write_choice(tmp_path, "u2", "bias", [0.02] * 4)
    refused = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.splitlines()[-1].startswith(f"{tmp_path}: no user has a stored choice and queries")
