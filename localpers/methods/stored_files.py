"""The files CoPe and EXACT keep in a user's folder beside CARD's state.json, named once, and the version mark
every fit stores (`FITTED_BY`: a fit made by another version of localpers is never taken as current).

Only names (and the command that makes them again): nothing here reads or writes them (`localpers.methods.cope`
and `localpers.methods.exact_index` do), so a front end can say which fits a user has without loading the engine
those modules import.
"""

from localpers import __version__

COPE_STATE_FILE = "cope.json"
# Bump FIT_FORMAT with every change to what a fit computes or stores, so `fit` redoes the fits made before it. The
# package version alone never moved: every fit made before this number, by several versions of the fitting code,
# was marked "localpers 0.1.0" and kept as current (format 1).
FIT_FORMAT = 2
FITTED_BY = f"localpers {__version__}, fit format {FIT_FORMAT}"
EXACT_INDEX_FILE = "exact-index.safetensors"


def refit_advice(method: str, user_name: str | None = None) -> str:
    """What to run to fit `method` (cope, exact) again, e.g. "run `localpers fit --method cope --user ann`"."""
    return f"run `localpers fit --method {method}{f' --user {user_name}' if user_name else ''}`"
