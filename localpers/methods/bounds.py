"""The bounds a method's options are checked against, readable without loading any method.

The command line declares its options with these (`--strength`, `--top-k` of `publish` and `rewrite`, `--head-d`, the API's
`strength` and `correction_top_k`), so they live apart
from the modules that use them (`card.choice`, `card.head_spec`), which load numpy and llama.cpp.
"""

from __future__ import annotations

# The largest strength a fit stores, `rewrite --strength` and the API's `strength` take, and so the largest
# `head.strength` and `head.alpha` a bundle may state (the choice stores the vector's strength as up to 1x it).
MAX_STRENGTH = 100.0
# What a manifest's head, `rewrite --top-k` and a request may ask for. CARD corrects the top 20 tokens; a k in
# the hundreds of thousands scored the whole vocabulary at every step (33 s and 2.2 GB for two tokens).
MAX_TOP_K = 1000
# The widest head D a manifest may state (devices refuse more); `publish --head-d` takes at most this.
MAX_D = 4096
