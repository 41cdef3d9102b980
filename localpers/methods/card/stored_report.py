"""A stored CARD fit's report (state.json's `fit`) and its choice's words, checked field by field as `fit` shows them.

`fit` prints the report and the choice of a fit it keeps as it came (a user imported without its history:
`user_fit.fit_without_history`), and `user import`, `user export` and `doctor` check such a fit the same way
(`user_state.check_stored_fit`), so a wrongly typed field is refused in one line naming it instead of ending the
fit's summary in a traceback. This module checks types and ranges only: whether the fit suits the bundle, and its
vector, token bias and strengths, are `user_state`'s and `choice`'s. It reads and writes no file.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from localpers.errors import InputError
from localpers.methods.reports import FitReport
from localpers.untrusted import one_line

MODES = ("vector", "too-few-pairs", "cold-start")
Check = Callable[[object], bool]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object, low: float = 0.0, high: float = math.inf) -> bool:
    """A finite number from `low` to `high` (bool, nan and the infinities are not)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


def _is_fraction(value: object) -> bool:
    return _is_number(value, high=1.0)


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _or_none(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _is_seconds(value: object) -> bool:
    return isinstance(value, dict) and all(_is_text(k) and _is_number(v) for k, v in value.items())


# Each stored field of a report: what a sound value is, and the words for it. A field left out is not checked here.
_FIELDS: dict[str, tuple[Check, str]] = {
    "mode": (lambda value: value in MODES, f"one of {', '.join(MODES)}"),
    "cluster": (_or_none(_is_count), "a cluster number or null"),
    "cluster_similarities": (_list_of(lambda v: _is_number(v, -math.inf)), "a list of numbers"),
    "n_items": (_is_count, "a count"),
    "n_pairs": (_is_count, "a count"),
    "n_identical_skipped": (_is_count, "a count"),
    "train_accuracy": (_or_none(_is_fraction), "a number from 0 to 1 or null"),
    "heldout_accuracy": (_or_none(_is_fraction), "a number from 0 to 1 or null"),
    "heldout_accuracy_default": (_or_none(_is_fraction), "a number from 0 to 1 or null"),
    "n_heldout": (_is_count, "a count"),
    "regularisation": (_or_none(_is_number), "a number of 0 or more, or null"),
    "vector_norm": (_or_none(_is_number), "a number of 0 or more, or null"),
    "seconds": (_is_seconds, "an object of stage names and seconds"),
    "bundle_sha256": (_is_text, "text"),
    "habits": (_list_of(_is_text), "a list of texts"),
    "n_too_long": (_is_count, "a count"),
    "history_sha256": (_or_none(_is_text), "text or null"),
}


def _damaged(where: str, field: str, value: object, wanted: str, advice: str) -> InputError:
    return InputError(
        f"{where} is damaged: field '{field}' is {one_line(repr(value), 40)}, not {wanted}; {advice}"
    )


def check_report_fields(fit: Mapping[str, Any], where: str, advice: str) -> None:
    """Refuse (InputError naming `where` and the field, ending in `advice`) a report field of the wrong type or
    range, and an accuracy missing where the summary prints one (a vector's, the default's beside a held-out one)."""
    for name, (sound, wanted) in _FIELDS.items():
        if name in fit and not sound(fit[name]):
            raise _damaged(where, f"fit.{name}", fit[name], wanted, advice)
    if fit.get("mode") == "vector" and "train_accuracy" in fit and fit["train_accuracy"] is None:
        wanted = "a number from 0 to 1 (a vector was fitted)"
        raise _damaged(where, "fit.train_accuracy", None, wanted, advice)
    if fit.get("heldout_accuracy") is not None and fit.get("heldout_accuracy_default", 0.0) is None:
        wanted = "a number from 0 to 1 (there is a held-out accuracy)"
        raise _damaged(where, "fit.heldout_accuracy_default", None, wanted, advice)


def stored_fit_report(fit: object, where: str, advice: str) -> FitReport | None:
    """The stored report `fit` as a FitReport, its fields checked (`check_report_fields`; a `fit` that is not an
    object is refused too). None without a report, or for one lacking a field every report has (a hand-made
    state, or one from before the field): such a fit is fitted anew, as before. Fields this version does not know
    are left out."""
    if fit is None:
        return None
    if not isinstance(fit, dict):
        raise InputError(f"{where} is damaged: field 'fit' is not an object; {advice}")
    check_report_fields(fit, where, advice)
    stored = [field for field in dataclasses.fields(FitReport) if field.name != "kept_without_history"]
    required = {
        field.name
        for field in stored
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }
    if not required <= set(fit):
        return None
    return FitReport(**{field.name: fit[field.name] for field in stored if field.name in fit})


def check_choice_words(choice: object, where: str, advice: str) -> None:
    """Refuse (InputError naming `where` and the field) a stored choice whose label or reason is missing or not
    text: the fit's summary prints both. A choice that is not an object is `choice.stored_choice`'s to refuse;
    its strengths are too."""
    if not isinstance(choice, dict):
        return
    for name in ("label", "reason"):
        if name not in choice:
            raise InputError(f"{where} is damaged: field 'choice.{name}' is missing; {advice}")
        if not _is_text(choice[name]):
            raise _damaged(where, f"choice.{name}", choice[name], "text", advice)
