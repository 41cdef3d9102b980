"""The backbone's linear layers a LoRA adapter adapts by default, by their GGUF names.

Apart from `adapters` (numpy) so that the command line can show the default of `publish --targets` without
loading it.
"""

from __future__ import annotations

# The linear layers CARD adapts (`../shared/DESIGN.md` section 3): q, k, v, o, gate, up, down.
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
