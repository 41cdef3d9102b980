"""The files CoPe and EXACT keep in a user's folder beside CARD's state.json, named once.

Only names: nothing here reads or writes them (`localpers.methods.cope` and `localpers.methods.exact_index`
do), so a front end can say which fits a user has without loading the engine those modules import.
"""

COPE_STATE_FILE = "cope.json"
EXACT_INDEX_FILE = "exact-index.safetensors"
