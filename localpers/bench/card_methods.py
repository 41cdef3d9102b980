"""CARD in the benchmark: fixed strengths (`card`), the fit's chosen ones (`card-auto`) and the ablations.

`card@strength=S,top_k=K,bias=B` decodes with those strengths (defaults: the bundle's), `card-auto` with what
`localpers fit` chose on the user's own recent items (what `localpers rewrite --method card` does),
`card-global` puts the vector on the global adapter (the paper's "w/o LoRA"), and `card-factored-u` /
`card-full-u` refuse a bundle whose head has the other kind of U. The fit itself (vector, token bias,
choice) is the runner's, cached per user (`localpers.bench.fits`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from localpers.bench.methods import (
    PENALTY_DEFAULTS,
    PENALTY_PARAMS,
    MethodSpec,
    ParamValue,
    UserProfile,
    penalty_sampling,
)
from localpers.bench.prompt_methods import HistoryPromptMethod
from localpers.errors import LocalpersError
from localpers.methods.card.correction import DEFAULT_BIAS_STRENGTH
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT, DEFAULT_REGULARISATION
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.reports import RewriteResult


class CardMethod(HistoryPromptMethod):
    name = "card"
    scores_gold = True
    description = "cluster adapter + the user's vector correcting the top-k logits (CARD)"
    needs = "vector"
    uses_history = True
    # `candidates=N`: N outputs decoded side by side and the consensus one kept (`Personalizer.rewrite`)
    params = {
        "strength": float,
        "top_k": int,
        "reg": float,
        "prior": float,
        "bias": float,
        "candidates": int,
        **PENALTY_PARAMS,
    }
    adapter_method = "card"
    head_type: ClassVar[str | None] = None  # set by the full/factored-U variants

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        config = personalizer.head_config
        return {
            "strength": float(config.default_strength),
            "top_k": int(config.top_k),
            "reg": float(DEFAULT_REGULARISATION),
            "prior": float(DEFAULT_PRIOR_WEIGHT),
            "bias": float(DEFAULT_BIAS_STRENGTH),
            **PENALTY_DEFAULTS,
        }

    def check(self, personalizer: Personalizer) -> None:
        actual = personalizer.head_config.u
        if self.head_type is not None and actual != self.head_type:
            raise LocalpersError(
                f"method {self.name} needs a bundle with a {self.head_type} U, but "
                f"{personalizer.bundle.directory} has a {actual} U; run it with --bundle pointing at such a bundle"
            )

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        sampling = penalty_sampling(spec)
        if profile.cluster is None and self.adapter_method == "card":
            return self.global_rewrite(personalizer, text, reference, sampling=sampling)  # cold start
        strength = spec.get("strength")
        top_k = spec.get("top_k")
        bias_strength = spec.get("bias")
        return personalizer.rewrite(
            text,
            method=self.adapter_method,
            cluster=profile.cluster,
            vector=profile.vector,
            strength=None if strength is None else float(strength),
            top_k=None if top_k is None else int(top_k),
            history=prepared,
            bias=profile.bias,
            bias_strength=None if bias_strength is None else float(bias_strength),
            reference=reference,
            candidates=int(spec.get("candidates") or 1),
            sampling=sampling,
        )


class CardChosenMethod(CardMethod):
    name = "card-auto"
    device_method = "card"
    description = (
        "CARD with the strengths `localpers fit` chose on the user's own recent items (what rewrite does)"
    )
    params = {"top_k": int, "reg": float, "prior": float, "candidates": int, **PENALTY_PARAMS}

    def defaults(self, personalizer: Personalizer) -> dict[str, ParamValue]:
        values = super().defaults(personalizer)
        values.pop("strength")
        values.pop("bias")
        return values

    def generate(
        self,
        personalizer: Personalizer,
        profile: UserProfile,
        prepared: Any,
        text: str,
        spec: MethodSpec,
        reference: str | None = None,
    ) -> RewriteResult:
        from localpers.methods.card.choice import chosen_bias, stored_choice

        vector_strength, bias_strength, _ = stored_choice({"choice": profile.choice})
        profile = replace(profile, bias=chosen_bias({"choice": profile.choice}, profile.bias))
        chosen = MethodSpec(
            spec.base,
            tuple(
                (key, value)
                for key, value in (*spec.params, ("strength", vector_strength), ("bias", bias_strength))
                if value is not None
            ),
        )
        return super().generate(personalizer, profile, prepared, text, chosen, reference)


class CardGlobalMethod(CardMethod):
    name = "card-global"
    device_method = "card-global"  # the bundle's strengths, as the device's card-global (no fit choice)
    description = "the user's vector on the global adapter (the paper's 'w/o LoRA' ablation)"
    adapter_method = "card-global"


class CardFactoredUMethod(CardMethod):
    name = "card-factored-u"
    description = "CARD, requiring a bundle whose head has a factored U (E Q)"
    head_type = "factored"


class CardFullUMethod(CardMethod):
    name = "card-full-u"
    description = "CARD, requiring a bundle whose head has a full (sparse) U"
    head_type = "full"
