"""Re-read one `localpers bench` run under stricter rules for the fit's per-user choice (offline, nothing decoded).

The fit's choice (`localpers.methods.card.choice`) gives a user a correction when its mean log-probability on the
user's recent items beats the adapter alone's by `MIN_LEAD` (any amount until the fifty-ninth session) and, for a
lead under `LARGE_LEAD`, steadily (`MIN_STEADINESS`, since the sixty-first); read a run made with `MIN_LEAD = 0` and
`MIN_STEADINESS = 0` to compare rules, since a run's own rule bounds what can be read from it. A user whose
choice falls back to the adapter alone decodes exactly what `global-history` decodes (strength 0, no bias; recasing
does not change ROUGE, which lowercases, nor the gold likelihood), so any stricter rule can be read from one run of
both methods: for each user the rule keeps, card-auto's outputs; for the others, global-history's. Rules: a margin
in nats/token over the adapter alone; "majority" (the chosen correction scored above the adapter alone on more than
half of the recent items: `items_higher`, stored since the fifty-eighth session); and "spread", the lead over its
standard error across the recent items, t = mean / (sd / sqrt(n)) (`item_scores`, stored since the fifty-ninth
session), small for a lead one item carries, alone, with a margin, or waived for a large lead (`--large-leads`).
Prints, for each rule, how many users keep a correction, ROUGE-1 and gold likelihood against global-history
(paired bootstrap over queries; authors improved and an interval over authors for ROUGE-1), and checks the premise:
users who chose the adapter have global-history's scores.
Usage: python scripts/choice_rules.py ../bench-runs/dev59 [--margins 0.005,0.01] [--t-values 1,2]
    [--large-leads 0.04] [--versus 'margin 0.01'] [--json]
    [--history 20: a probe style's run, e.g. ../bench-runs/probes-dev60/kicker]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from compare_runs import cache_records, load, user_id

from localpers.bench.authors import compare_authors
from localpers.bench.metrics import paired_bootstrap
from localpers.methods.card.choice import keeps_correction, steadiness

Rule = Callable[[dict], bool]


def choices(run: Path, history: str = "all", ids: dict[str, str] | None = None) -> dict[str, dict]:
    """Each user's stored choice (`state.json`'s `choice`) from the run's fits on `history` items ("all", or
    the probes' 20), by user_id: the fits' folders are named by store name, which `ids` maps to it."""
    found = {}
    for state in sorted((run / "users" / f"history-{history}" / "users").glob("*/state.json")):
        choice = json.loads(state.read_text()).get("choice")
        if isinstance(choice, dict):
            found[(ids or {}).get(state.parent.name, state.parent.name)] = choice
    if not found:
        raise SystemExit(f"no stored choices under {run / 'users' / f'history-{history}'}")
    return found


def user_ids(run: Path, method: str) -> dict[str, str]:
    """{store name: user_id} of the users in the run's cache of `method` (each record holds both)."""
    return {name: user_id(record) for name, record in cache_records(run, method).items()}


def margin_of(choice: dict) -> float:
    scores = choice["scores"]
    return float(scores[choice["label"]] - scores["adapter"])


def t_of(choice: dict) -> float:
    """The chosen correction's lead over the adapter alone in standard errors of its item-by-item differences."""
    return steadiness(choice["item_scores"][choice["label"]], choice["item_scores"]["adapter"])


def rules(
    margins: Sequence[float],
    with_items: bool,
    t_values: Sequence[float] = (),
    with_item_scores: bool = False,
    large_leads: Sequence[float] = (),
) -> dict[str, Rule]:
    """The rules to read; the majority ones only where every choice stored `items_higher`, the spread ones
    (alone, with each margin, and waived for a lead of at least each of `large_leads`: a habit's lead is large
    but over 4 items seldom steady) only where every choice stored `item_scores`."""
    table: dict[str, Rule] = {"any lead": lambda c: c["label"] != "adapter"}
    for margin in margins:
        if margin > 0:
            table[f"margin {margin}"] = lambda c, m=margin: c["label"] != "adapter" and margin_of(c) >= m
    if with_items:
        table["majority"] = lambda c: c["label"] != "adapter" and 2 * c["items_higher"] > c["n_items"]
        table["majority + margin 0.005"] = lambda c: table["majority"](c) and margin_of(c) >= 0.005
    if with_item_scores:
        for t_value in t_values:
            table[f"t >= {t_value}"] = lambda c, t=t_value: c["label"] != "adapter" and t_of(c) >= t
            for margin in (m for m in margins if m > 0):
                for large in (math.inf, *large_leads):  # the device's rule, `keeps_correction`
                    waiver = "" if large == math.inf else f", or lead >= {large}"
                    table[f"t >= {t_value} + margin {margin}{waiver}"] = (
                        lambda c, t=t_value, m=margin, big=large: (
                            c["label"] != "adapter"
                            and keeps_correction(
                                margin_of(c), t_of(c), min_lead=m, min_steadiness=t, large_lead=big
                            )
                        )
                    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--margins", default="0.005,0.01,0.02")
    parser.add_argument("--t-values", default="1,2", help="spread rules: the lead in standard errors")
    parser.add_argument("--versus", default="any lead", help="the rule every rule is also compared with")
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument(
        "--large-leads",
        default="",
        help="spread rules with margins are also read waived for leads >= each of these",
    )
    parser.add_argument(
        "--history",
        default="all",
        help="the fits' history size: all (a bench run) or 20 (a probe style's run)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    suffix = "" if args.history == "all" else f"@history={args.history}"
    plain = load(f"{args.run}:global-history{suffix}")  # {user: {query_id: cached query record}}
    corrected = load(f"{args.run}:card-auto{suffix}")
    chosen = choices(args.run, args.history, user_ids(args.run, f"card-auto{suffix}"))
    users = sorted(set(plain) & set(corrected) & set(chosen))
    rows = [(user, query) for user in users for query in sorted(set(plain[user]) & set(corrected[user]))]
    if not rows:
        raise SystemExit(
            f"{args.run}: no user has a stored choice and queries scored by both global-history{suffix} and"
            f" card-auto{suffix}: give a `localpers bench` run of both methods (and --history as its fits had)"
        )
    mismatched = sum(
        1
        for user, query in rows
        if chosen[user]["label"] == "adapter"
        and abs(plain[user][query]["rouge1"] - corrected[user][query]["rouge1"]) > 1e-9
    )
    base_rouge = np.array([plain[u][q]["rouge1"] for u, q in rows])
    base_gold = np.array([plain[u][q]["gold_logprob"] for u, q in rows])
    report: dict[str, object] = {
        "run": str(args.run),
        "users": len(users),
        "queries": len(rows),
        "premise_mismatches": mismatched,
        "global_history_rouge1": round(float(base_rouge.mean()), 4),
        "rules": {},
    }
    decoded: dict[str, tuple[set[str], np.ndarray, np.ndarray]] = {}
    with_items = all("items_higher" in chosen[user] for user in users)
    with_item_scores = all("item_scores" in chosen[user] for user in users)
    margins = [float(m) for m in args.margins.split(",") if m]
    t_values = [float(t) for t in args.t_values.split(",") if t]
    large_leads = [float(lead) for lead in args.large_leads.split(",") if lead]
    for name, keep in rules(margins, with_items, t_values, with_item_scores, large_leads).items():
        kept = {user for user in users if keep(chosen[user])}
        source = [corrected if user in kept else plain for user, _ in rows]
        rouge = np.array([table[u][q]["rouge1"] for table, (u, q) in zip(source, rows, strict=True)])
        gold = np.array([table[u][q]["gold_logprob"] for table, (u, q) in zip(source, rows, strict=True)])
        decoded[name] = kept, rouge, gold
    if args.versus not in decoded:
        raise SystemExit(f"--versus {args.versus!r} is not one of the rules read: {', '.join(decoded)}")
    report["versus"] = args.versus
    reference = decoded[args.versus][1]
    for name, (kept, rouge, gold) in decoded.items():
        versus_plain = paired_bootstrap(rouge, base_rouge, n_resamples=args.resamples)
        versus_reference = paired_bootstrap(rouge, reference, n_resamples=args.resamples)
        gold_vs_plain = paired_bootstrap(gold, base_gold, n_resamples=args.resamples)
        authors = compare_authors(rouge, base_rouge, [u for u, _ in rows], n_resamples=args.resamples)
        report["rules"][name] = {
            "users_corrected": len(kept),
            "rouge1": round(float(rouge.mean()), 4),
            "rouge1_vs_global_history": versus_plain.as_list(4),
            "rouge1_vs_versus": versus_reference.as_list(4),
            "authors_improved_vs_global_history": authors.improved_text(),
            "gold_vs_global_history": gold_vs_plain.as_list(4),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['run']}: {report['users']} users, {report['queries']} queries; global-history R-1 "
        f"{report['global_history_rouge1']}; users who chose the adapter but differ from global-history: "
        f"{mismatched} queries"
    )
    print(
        f"| rule | users corrected | R-1 | vs global-history | vs {args.versus} | authors up |"
        " gold vs global-history |"
    )
    print("|---|---:|---:|---|---|---:|---|")
    for name, row in report["rules"].items():
        print(
            f"| {name} | {row['users_corrected']}/{len(users)} | {row['rouge1']} | {row['rouge1_vs_global_history']}"
            f" | {row['rouge1_vs_versus']} | {row['authors_improved_vs_global_history']} |"
            f" {row['gold_vs_global_history']} |"
        )


if __name__ == "__main__":
    main()
