"""The `localpers tui` command: open the interactive writer (a Textual app, `localpers.tui`).

It resolves the backbone and verifies the bundle before the screen opens, so a missing bundle or model is
a one-line error like in every other command; the model itself loads inside the app, in the background.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from localpers.cli.common import BundleOption, ModelOption, UserOption, checked_utf8
from localpers.cli.sampling import (
    GrammarOption,
    MinPOption,
    RepeatedWordPenaltyOption,
    RepetitionPenaltyOption,
    SampleTopKOption,
    SeedOption,
    TemperatureOption,
    TopPOption,
    sampler_settings,
)
from localpers.errors import LocalpersError
from localpers.methods.consensus import MAX_CANDIDATES


def tui_command(
    user: UserOption = None,
    text: Annotated[str, typer.Option("--text", help="Start with this draft.")] = "",
    bundle: BundleOption = None,
    model: ModelOption = None,
    temperature: TemperatureOption = 0.0,
    sample_top_k: SampleTopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    repeated_word_penalty: RepeatedWordPenaltyOption = None,
    seed: SeedOption = None,
    grammar: GrammarOption = None,
    candidates: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_CANDIDATES,
            help="Decode N outputs side by side and keep the one the others agree with most (slower; greedy"
            " decoding only), as `localpers rewrite --candidates`.",
        ),
    ] = 1,
) -> None:
    """Write a draft and watch your personalized rewrite stream beside the plain one; see why; teach it."""
    from localpers.bundle.backbone_choice import backbone_for_bundle
    from localpers.bundle.format import open_bundle
    from localpers.tui.text import drop_control_codes
    from localpers.users.store import UserStore

    # refused as `rewrite` refuses it, not shown as an encoding error; escape codes dropped, never drawn
    text = drop_control_codes(checked_utf8(text, "--text"))
    sampling = sampler_settings(
        temperature=temperature,
        top_k=sample_top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
        grammar=grammar,
        repeated_word_penalty=repeated_word_penalty,
    )
    if candidates > 1 and not sampling.greedy:
        raise LocalpersError("--candidates needs greedy decoding (--temperature 0)", exit_code=2)
    backbone = backbone_for_bundle(model, bundle)
    verified = open_bundle(bundle, backbone_sha256=backbone.sha256)
    from localpers.methods.card.bundle_content import check_bundle_before_use

    check_bundle_before_use(verified, backbone.path, given=bundle is not None)
    store = UserStore()
    if user is not None:
        store.get(user)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise LocalpersError(
            "`localpers tui` needs an interactive terminal; in scripts use `localpers rewrite`"
        )

    from localpers.methods.card.personalizer import Personalizer
    from localpers.tui import EngineService, run_app

    service = EngineService(
        lambda: Personalizer(verified, backbone), store, sampling=sampling, candidates=candidates
    )
    run_app(service, user=user, text=text)


def register(app: typer.Typer) -> None:
    """Add `tui` to the main app with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("tui")(one_line_errors(tui_command))
