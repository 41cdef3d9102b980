"""Every personalization method, behind one interface: CARD (`card/`), the baselines, CoPe and EXACT.

- `base`: the interface a method implements (`Method`, its options and results); `registry`: the methods by name.
- `baselines`: the adapters without a correction (global, cluster, card-global, global-history); `consensus`:
  the optional choice among sampled candidates.

- `cope`: a per-user LoRA trained on the device (`cope_train`) and contrastive decoding between the
  user model and its base model (two llama.cpp contexts).
- `exact`: greedy selection of preference attributes (`attributes`, the paper's 42 names) per
  history pair, a prompt-level index, and retrieval of the nearest input's attributes at inference.
- `profile`: the user's interpretable style profile (EXACT frequencies next to CARD's cluster).
"""
