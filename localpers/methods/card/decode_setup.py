"""What a decode for one user and one method is set up with: the user's cluster, the adapter, CARD's
correction and the prompt.

`DecodeSetup` is a base class of `localpers.methods.card.personalizer.Personalizer`: it assigns a user's
cluster (the nearest of the bundle's centroids, `cluster_assignment`), says which adapter each method decodes
on (`adapter_for`; the one CARD corrects, `card_adapter`), builds CARD's top-k correction sampler for a user's
vector and token bias (`correction_sampler`, through `correction.build_correction`) and the prompt each method
sees (`prompt_for`, `prompt_tokens`: history-conditioned where the bundle and method allow, through
`prompting`). `Personalizer.__init__` creates every attribute this class reads; this class creates none (the
centroids, `_centroids`, are read from the bundle when first asked for).

What it does not do: load the engine or the bundle, decode, score or fit (`Personalizer` does, with
`decoding_runs` and `user_fit`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localpers.bundle.format import Bundle, reading_bundle
from localpers.engine import Engine
from localpers.errors import LocalpersError
from localpers.methods.card import prompting
from localpers.methods.card.cluster_assignment import nearest_centroid, read_centroids
from localpers.methods.card.correction import CardCorrection, build_correction
from localpers.methods.card.head import CardHead
from localpers.methods.card.head_spec import HeadConfig
from localpers.methods.card.token_bias import TokenBias
from localpers.users.history_index import HistoryIndex, prompt_for_user
from localpers.users.history_prompt import PromptFormat

METHODS = ("card", "cluster", "global", "card-global", "global-history")
# Methods that see the user's past outputs in the prompt when the bundle's adapters were trained that way.
HISTORY_METHODS = ("card", "cluster", "card-global", "global-history")


class DecodeSetup:
    """The cluster, adapter, correction and prompt of one user's decode with one of `METHODS`."""

    bundle: Bundle
    engine: Engine
    head: CardHead
    head_config: HeadConfig
    prompt_format: PromptFormat | None
    end_tokens: list[int]
    _centroids: np.ndarray | None

    # ------------------------------------------------------------------ clusters
    @property
    def centroids(self) -> np.ndarray:
        if self._centroids is None:
            with reading_bundle(self.bundle):
                self._centroids = read_centroids(self.bundle.centroids_path, k=self.bundle.k)
        return self._centroids

    def assign_cluster(self, outputs: Sequence[str]) -> tuple[int, list[float]]:
        """Nearest centroid (cosine) to the user's mean output embedding, and all similarities."""
        return nearest_centroid(self.centroids, outputs)

    def adapter_for(self, method: str, cluster: int | None) -> str:
        """The adapter `method` decodes on for a user of `cluster` (the global one for a user without one)."""
        if method not in METHODS:
            raise LocalpersError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
        if method == "card":
            return self.card_adapter(cluster)
        if method in ("global", "card-global", "global-history") or cluster is None:
            return "global"
        return self.bundle.cluster_adapter_name(cluster)

    def card_adapter(self, cluster: int | None) -> str:
        """The adapter CARD corrects (its y- come from it too): the bundle's `head.base` for this user."""
        if self.head_config.base == "global" or cluster is None:
            return "global"
        return self.bundle.cluster_adapter_name(cluster)

    # ------------------------------------------------------------------ prompts and corrections
    def chat_prompt_tokens(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """`(role, content)` messages as a prompt (`prompting.chat_prompt_tokens`)."""
        return prompting.chat_prompt_tokens(self.engine, messages)

    def correction_sampler(
        self,
        method: str,
        cluster: int | None,
        vector: np.ndarray | None,
        strength: float | None,
        top_k: int | None,
        bias: TokenBias | None,
        bias_strength: float | None,
        *,
        record: bool = False,
    ) -> tuple[CardCorrection | None, float | None, int | None]:
        """`(sampler, strength, top_k)` of `method`: CARD's top-k correction (None for the uncorrected methods).

        Every generation and teacher-forced scoring gets its correction here (`correction.build_correction`);
        with `record`, the sampler keeps each step's candidates, logits and corrections (the Why view).
        """
        if method not in ("card", "card-global"):
            return None, None, None
        return build_correction(
            self.head,
            self.head_config,
            cluster=cluster,
            vector=vector,
            strength=strength,
            top_k=top_k,
            bias=bias,
            bias_strength=bias_strength,
            end_tokens=self.end_tokens,
            record=record,
        )

    def prompt_for(
        self,
        task: str,
        text: str,
        method: str,
        history: HistoryIndex | None,
        prompt_format: PromptFormat | None = None,
    ) -> str:
        """The prompt `method` sees for `text`: history-conditioned where the bundle and method allow."""
        return prompt_for_user(task, text, self.format_for(method, prompt_format), history)

    def prompt_tokens(
        self,
        task: str,
        text: str,
        method: str,
        history: HistoryIndex | None,
        prompt_format: PromptFormat | None = None,
        prompt_prefix: str = "",
        note: str = "",
    ) -> tuple[list[int], int, int | None]:
        """`prompt_prefix` + `prompt_for`'s prompt as tokens, how many of them the user's prompts share,
        and how many characters of a long text it carries (`prompting.prompt_tokens`; None: all of it).

        The shared tokens (the user's recent examples) stay in the engine's cache from one rewrite to the next.
        """
        chosen = self.format_for(method, prompt_format)
        return prompting.prompt_tokens(self.engine, task, text, chosen, history, prompt_prefix, note)

    def format_for(self, method: str, prompt_format: PromptFormat | None = None) -> PromptFormat | None:
        """The history format `method`'s prompts use (`prompt_format` or the bundle's), None for a plain prompt."""
        return (prompt_format or self.prompt_format) if method in HISTORY_METHODS else None
