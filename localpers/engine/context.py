"""How many tokens a generation or rewrite can hold: the prompt and its output share one llama.cpp context.

A constant of its own, apart from `model`, so that the command line can cap `--max-tokens` without loading
llama.cpp.
"""

from __future__ import annotations

CONTEXT_TOKENS = 1024  # prompt and output together
