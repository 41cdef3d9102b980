"""The baselines CARD is compared with, decoded on the bundle's adapters without a user vector.

`global`: the global adapter, plain prompt. `cluster`: the user's cluster adapter (history-conditioned
prompt where the bundle was trained so). `card-global`: CARD's correction on the global adapter (the
paper's "w/o LoRA" ablation). `global-history`: the global adapter with the user's history in the prompt.
They read the cluster and vector that `localpers fit` (CARD) stored.
"""

from __future__ import annotations

from localpers.methods.card.method import HISTORY_ONLY_METHOD, AdapterMethod


class GlobalMethod(AdapterMethod):
    name = "global"
    summary = "the shared global adapter: no personalization (the baseline)"
    needs_user = False


class ClusterMethod(AdapterMethod):
    name = "cluster"
    summary = "your cluster's adapter, without CARD's correction"


class CardGlobalMethod(AdapterMethod):
    name = "card-global"
    summary = "CARD's correction on the global adapter (the 'without cluster LoRA' ablation)"
    takes_strength = True
    takes_top_k = True


class GlobalHistoryMethod(AdapterMethod):
    name = HISTORY_ONLY_METHOD
    summary = "the global adapter with your own earlier outputs in the prompt"
