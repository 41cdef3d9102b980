"""The files CoPe and EXACT keep in a user's folder beside CARD's state.json, named once, and the version mark
every fit stores (`fitted_by`: a fit made by another version of localpers or another fit format is never taken as
current).

Only names (and the command that makes them again): nothing here reads or writes them (`localpers.methods.cope`
and `localpers.methods.exact_index` do), so a front end can say which fits a user has without loading the engine
those modules import.
"""

import re
from collections.abc import Mapping
from typing import Any

from localpers import __version__

COPE_STATE_FILE = "cope.json"
# Bump FIT_FORMAT with every change to what a fit computes or stores, so `localpers fit` redoes the fits made before
# it: the package version alone never moved (0.1.0) while the fitting code changed several times.
FIT_FORMAT = 1
EXACT_INDEX_FILE = "exact-index.safetensors"


def fit_mark() -> str:
    """The mark a fit stores: the version of localpers and the fit format that made it."""
    return f"localpers {__version__}, fit format {FIT_FORMAT}"


def is_current_fit(mark: object) -> bool:
    """Whether a stored fit's mark (`fitted_by`) is this version's and fit format's.

    Fits of format 1 were marked with the version alone until formats were named; they are format 1's.
    """
    return mark == fit_mark() or (FIT_FORMAT == 1 and mark == f"localpers {__version__}")


def fit_format_of(mark: object) -> int | None:
    """The fit format a stored fit's mark names: "localpers X, fit format N" is N, "localpers X" is 1 (marked before
    formats were named); None for a fit without a mark (made before marks) or one this build cannot read."""
    if not isinstance(mark, str) or not mark.startswith("localpers "):
        return None
    version, separator, number = mark.partition(", fit format ")
    if not separator:
        return 1 if " " not in version[len("localpers ") :] else None
    # ASCII digits only, and few: str.isdigit takes "²", and int() refuses over 4,300 digits (an imported state.json)
    return int(number) if re.fullmatch(r"[0-9]{1,6}", number) else None


def fit_is_outdated(state: Mapping[str, Any]) -> bool:
    """Whether a stored fit (state.json or cope.json) was made by a localpers of another fit format.

    A rewrite cannot use such a fit, as it cannot use one made with another bundle. A fit of another version of
    the same format is fine (only `fit` redoes it, see `is_current_fit`); one without a mark was made before marks
    and so is format 1's; one whose mark this build cannot read is left to the other checks.
    """
    mark = state.get("fitted_by")
    found = 1 if mark is None else fit_format_of(mark)
    return found is not None and found != FIT_FORMAT


def fit_made_for(state: Mapping[str, Any], bundle_sha256: str) -> bool:
    """Whether a stored CARD fit (state.json) can serve rewrites with that bundle: made with it, in this fit format."""
    return state.get("bundle_sha256") == bundle_sha256 and not fit_is_outdated(state)


def refit_advice(method: str, user_name: str | None = None) -> str:
    """What to run to fit `method` (cope, exact) again, e.g. "run `localpers fit --method cope --user ann`"."""
    return f"run `localpers fit --method {method}{f' --user {user_name}' if user_name else ''}`"
