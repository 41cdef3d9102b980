"""Print docs/PUBLISHING.md's scaling tables from `scripts/publish_scaling.sh` runs (OUTROOT/<name>/result.json).

Stage wall times per run, the load before and after it, and per-unit costs: seconds per author (clusters),
per SFT step and per adapter (sft, export), per pair (pairs, features).

    python scripts/publish_scaling_table.py /tmp/scaling seq ray-w1 ray-w2 ray-w4 x10-w2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STAGES = ("clusters", "sft", "export", "pairs", "features", "head", "bundle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="OUTROOT of `scripts/publish_scaling.sh`")
    parser.add_argument("names", nargs="+", help="the runs to tabulate (OUTROOT/<name>/result.json)")
    args = parser.parse_args()
    root, names = args.root, args.names
    results, loads = {}, {}
    for name in names:
        try:  # publish_scaling.sh writes result.json by redirection: a run cut short leaves it empty
            results[name] = json.loads((root / name / "result.json").read_text())
            loads[name] = (root / name / "load.txt").read_text().splitlines()
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"run {name!r} in {root}: {exc}; name runs that publish_scaling.sh finished")
    print(
        "| run | executor, CPUs | users | K | "
        + " | ".join(STAGES)
        + " | total | load 1-min before / after |"
    )
    print("|---" * (len(STAGES) + 6) + "|")
    units = []
    for name in names:
        result = results[name]
        load = [line.split("load average:")[1].split(",")[0].strip() for line in loads[name]]
        seconds, stages = result["stage_seconds"], result["stages"]
        executor = result["executor"]
        clusters = stages["clusters"]
        where = executor["kind"] + (f", {executor['cpus']:g}" if executor["kind"] == "ray" else ", 1 process")
        cells = " | ".join(f"{seconds[s]:.0f}" for s in STAGES)
        print(
            f"| {name} | {where} | {clusters['users']} | {clusters['k']} | {cells} |"
            f" {sum(seconds.values()):.0f} | {' / '.join(load)} |"
        )
        adapters = stages["sft"]["adapters"].values()
        steps = sum(a["steps"] for a in adapters)
        train = sum(a["train_seconds"] for a in adapters)
        pairs = max(1, stages["pairs"]["generated_this_run"])
        units.append(
            (
                name,
                seconds["clusters"] / clusters["users"],
                train / steps,
                seconds["sft"] / len(stages["sft"]["adapters"]),
                seconds["export"] / len(stages["sft"]["adapters"]),
                seconds["pairs"] / pairs,
                seconds["features"] / pairs,
            )
        )
    print()
    print(
        "| run | clusters s/author | SFT s/step (in-task) | sft stage s/adapter | export s/adapter |"
        " pairs s/pair | features s/pair |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, *values in units:
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")


if __name__ == "__main__":
    main()
