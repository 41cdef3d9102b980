"""The product's targets (issue 20, point 5), judged on a finished run's results.json object.

Each target compares the default personalized method (`card-auto`, the benchmark's name for what
`localpers rewrite` does after `localpers fit`; `localpers.bench.registry.DEFAULT`) with the global adapter
on the run's own queries:

    ROUGE-1 >= 1.25x global's, the paired query interval of the difference excluding 0
    >= 2/3 of the authors improved (the ratio's interval over authors shown beside it)
    the authors' own text more likely (gold log-probability), its interval excluding 0
    decode ms/token <= 1.10x global's; a whole rewrite (prompt included) <= 1.3x global's
    per-user state <= 10 KB besides the history; a fit on 20 history items <= 10 s

A target the run cannot judge (the method or a figure missing, an undefined ratio: one author or a global
scoring 0, or the fit run on other than 20 items) says why instead of met or not met. The style probes are a separate run (`localpers bench --probes`). The cost
figures come from methods run user by user, each in turn (`localpers.bench.runner`);
`scripts/bench_rewrite.py` interleaves them rewrite by rewrite for a finer cost comparison.

This module reads figures results.json already holds and compares them with thresholds; it computes no
statistic of its own and runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localpers.bench.registry import BASELINE
from localpers.bench.registry import DEFAULT as DEFAULT_METHOD  # card-auto

MIXED_TIMINGS = "timings mix llama.cpp thread counts"  # how a resumed run's note starts (`runner`)

ROUGE_RATIO = 1.25
AUTHORS_SHARE = 2 / 3
DECODE_RATIO = 1.10
REWRITE_RATIO = 1.3
STATE_BYTES = 10_000
FIT_ITEMS = 20
FIT_SECONDS = 10.0


@dataclass(frozen=True)
class TargetCheck:
    """One target: a short name, what it asks, what the run measured, whether it is met (None: not judged)."""

    name: str
    target: str
    measured: str
    met: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "measured": self.measured, "met": self.met}


def _interval(values: list[float], digits: int, signed: bool = False) -> str:
    low, mean, high = values
    sign = "+" if signed else ""
    return f"{mean:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


def check_targets(results: dict[str, Any], method: str = DEFAULT_METHOD) -> list[TargetCheck]:
    """Every target for `method` against global; empty when the run has either method missing."""
    rows = results.get("methods", {})
    if method not in rows or BASELINE not in rows:
        return []
    row, base = rows[method], rows[BASELINE]
    delta = results.get("deltas_vs_global", {}).get(method, {})
    authors = (results.get("authors_vs_global") or {}).get(method)
    # a resumed run's timings may mix thread counts (its run note says so): costs are then not judged
    mixed = any(note.startswith(MIXED_TIMINGS) for note in results.get("config", {}).get("run_notes") or [])
    return [
        _rouge_check(delta),
        _authors_check(authors),
        _gold_check(delta),
        _ratio_check("decode", "decode ms/token", row, base, "ms_per_token", DECODE_RATIO, "ms/token", mixed),
        _ratio_check(
            "whole rewrite",
            "whole rewrite (prompt included)",
            row,
            base,
            "rewrite_ms",
            REWRITE_RATIO,
            "ms",
            mixed,
        ),
        _state_check(row),
        _fit_check(row, results.get("config", {})),
    ]


def _state_check(row: dict[str, Any]) -> TargetCheck:
    """Every user's state within the limit (the mean let one user far above it pass); results written before the
    largest was recorded are judged on their mean, and say so."""
    largest = row.get("max_bytes_per_user")
    if largest is None:
        return TargetCheck(
            "per-user state",
            f"per-user state <= {STATE_BYTES:,} bytes besides the history",
            f"{row['bytes_per_user']:,} bytes on average (this run did not record the largest)",
            row["bytes_per_user"] <= STATE_BYTES,
        )
    return TargetCheck(
        "per-user state",
        f"every user's state <= {STATE_BYTES:,} bytes besides the history",
        f"{largest:,} bytes at most, {row['bytes_per_user']:,} on average",
        largest <= STATE_BYTES,
    )


def _rouge_check(delta: dict[str, Any]) -> TargetCheck:
    name = f"ROUGE-1 >= {ROUGE_RATIO}x"
    target = f"ROUGE-1 >= {ROUGE_RATIO}x global's, query interval of the difference excluding 0"
    ratio, difference = delta.get("rouge1_ratio"), delta.get("rouge1")
    if not difference:
        return TargetCheck(name, target, "no interval: fewer than 2 paired queries", None)
    if not ratio:
        return TargetCheck(name, target, "undefined: global's mean ROUGE-1 is 0", None)
    low, mean, high = ratio
    measured = f"{mean:.3f}x [{low:.3f}, {high:.3f}]; difference {_interval(difference, 4, signed=True)}"
    return TargetCheck(name, target, measured, mean >= ROUGE_RATIO and difference[0] > 0)


def _authors_check(authors: dict[str, Any] | None) -> TargetCheck:
    name = "2/3 of the authors improved"
    target = "at least 2/3 of the authors improved (interval over authors reported)"
    if not authors or not authors["authors"]:
        return TargetCheck(name, target, "no per-author scores", None)
    share = authors["improved"] / authors["authors"]
    unchanged = f", {authors['unchanged']} unchanged" if authors["unchanged"] else ""
    counted = f"{authors['improved']}/{authors['authors']} ({100 * share:.0f}%{unchanged})"
    ratio = authors.get("rouge1_ratio")
    if not ratio:  # one author (no interval over authors), or global's mean ROUGE-1 is 0
        return TargetCheck(
            name,
            target,
            f"{counted}; R-1 / global over authors undefined: one author, or global's mean ROUGE-1 is 0",
            None,
        )
    measured = f"{counted}; R-1 / global over authors {_interval(ratio, 3)}"
    return TargetCheck(name, target, measured, share >= AUTHORS_SHARE - 1e-12)


def _gold_check(delta: dict[str, Any]) -> TargetCheck:
    name = "gold likelihood"
    target = "authors' own text more likely than under global (gold log p), interval excluding 0"
    gold = delta.get("gold_logprob")
    if not gold:
        return TargetCheck(
            name, target, "no interval: gold likelihood not scored for both methods, or one query", None
        )
    return TargetCheck(name, target, f"{_interval(gold, 3, signed=True)} nats/token", gold[0] > 0)


def _ratio_check(
    name: str,
    what: str,
    row: dict[str, Any],
    base: dict[str, Any],
    key: str,
    limit: float,
    unit: str,
    mixed: bool = False,
) -> TargetCheck:
    target = f"{what} <= {limit:.2f}x global's"
    if not row.get(key) or not base.get(key):
        return TargetCheck(name, target, "not recorded", None)
    ratio = row[key] / base[key]
    measured = f"{ratio:.2f}x ({row[key]:.1f} against {base[key]:.1f} {unit})"
    if mixed:
        return TargetCheck(name, target, measured + "; not judged: the timings mix thread counts", None)
    return TargetCheck(name, target, measured, ratio <= limit)


def _fit_check(row: dict[str, Any], config: dict[str, Any]) -> TargetCheck:
    name = "fit time"
    target = f"fit of {FIT_ITEMS} history items <= {FIT_SECONDS:g} s"
    seconds = row["fit_s_per_user"]
    if config.get("history_limit") != FIT_ITEMS:
        limit = config.get("history_limit")
        on = "whole histories" if limit is None else f"{limit} items"
        return TargetCheck(
            name,
            target,
            f"{seconds:.2f} s/user on {on}; judged with --history-limit {FIT_ITEMS} "
            "(or scripts/bench_fit.py)",
            None,
        )
    if row.get("fit_shared_negatives"):
        return TargetCheck(
            name, target, f"{seconds:.2f} s/user, its y- reused from another fit (not all timed)", None
        )
    return TargetCheck(name, target, f"{seconds:.2f} s/user", seconds <= FIT_SECONDS)


def targets_summary(checks: list[TargetCheck]) -> str:
    """ "5 met, 2 not met (ROUGE-1 >= 1.25x; 2/3 of the authors improved), 1 not judged"."""
    met = sum(check.met is True for check in checks)
    missed = [check.name for check in checks if check.met is False]
    unjudged = sum(check.met is None for check in checks)
    text = f"{met} met, {len(missed)} not met"
    if missed:
        text += f" ({'; '.join(missed)})"
    if unjudged:
        text += f", {unjudged} not judged"
    return text
