"""CoPe: contrastive decoding on two contexts, stacked adapters, the device SFT, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from synthetic_bundle import make_bundle
from typer.testing import CliRunner

from localpers.bundle.format import open_bundle
from localpers.cli import app
from localpers.engine import Engine
from localpers.engine.adapters import random_lora
from localpers.engine.backbone import Backbone
from localpers.engine.generation import generate
from localpers.errors import LocalpersError
from localpers.methods import stored_files
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.cope import CopeState, fit_cope, load_state, stored_bytes
from localpers.methods.cope_decode import CopeDecoder
from localpers.methods.cope_train import SftConfig, training_prompts
from localpers.methods.lora_files import LoraFile, read_lora_gguf, write_stacked_lora
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat
from localpers.users.store import UserStore

PROMPT = "Generate a headline for the following article: The city opened a new bike lane along the river.\nHeadline:"


@pytest.fixture(scope="module")
def adapters(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return {
        "user": random_lora(backbone.path, folder / "user.gguf", rank=4, std=0.05, seed=11),
        "base": random_lora(backbone.path, folder / "base.gguf", rank=4, std=0.05, seed=12),
    }


@pytest.fixture(scope="module")
def decoder(backbone: Backbone, adapters: dict[str, Path]) -> CopeDecoder:
    loaded = CopeDecoder(backbone.path, adapters["user"], adapters["base"], n_ctx=256)
    yield loaded
    loaded.close()


def test_chosen_tokens_are_always_plausible_under_the_user_model(decoder: CopeDecoder) -> None:
    tau, alpha = 0.05, 3.0
    result, hook = decoder.generate(PROMPT, max_tokens=16, tau=tau, alpha=alpha, record=True)
    assert len(result.tokens) >= 4
    # Independent check: replay the output through the user model alone, one token at a time as decoding
    # evaluates it (a multi-token teacher-forced pass differs from one-token steps by llama.cpp's float noise,
    # up to ~0.3 nats on this backbone: enough to move a token across the plausibility threshold).
    rows = {}
    for name, engine in (("user", decoder.user), ("base", decoder.base)):
        engine.reset()
        rows[name] = [engine.prefill(engine.tokenize(PROMPT)).logits]
        rows[name] += [engine.step(token).logits for token in result.tokens[:-1]]
    left_argmax = 0
    for t, token in enumerate(result.tokens):
        row = rows["user"][t].astype(np.float64)
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        assert probs[token] >= tau * probs.max() - 1e-6, f"step {t} chose an implausible token"
        assert token in hook.steps[t].plausible
        left_argmax += token != int(np.argmax(row))
        # and the contrast's best among them, `log p_user - alpha * log p_base`, from the replayed models (a sign
        # flipped in the contrast passed the checks above)
        base = rows["base"][t].astype(np.float64)
        log_user = row - np.logaddexp.reduce(row)
        log_base = base - np.logaddexp.reduce(base)
        plausible = hook.steps[t].plausible
        score = log_user[plausible] - alpha * log_base[plausible]
        assert score[list(plausible).index(token)] >= score.max() - 1e-3, (
            f"step {t} is not the contrast's best"
        )
    assert left_argmax >= 1, "the contrast never changed a choice; the test would not notice a broken hook"


def test_the_contrast_is_not_scored_teacher_forced(decoder: CopeDecoder) -> None:
    # its plausible tokens get log-probabilities while every other token keeps its raw logit (tens of nats higher
    # on Gemma): a gold likelihood scored so was meaningless, and the engine's docstring said it worked
    from localpers.engine.generation import score_forced
    from localpers.methods.cope_decode import ContrastiveSampler

    tokens = decoder.user.tokenize(PROMPT)
    contrast = ContrastiveSampler(decoder.base, tokens)
    forced = decoder.user.tokenize(" BIKE LANE OPENS", add_bos=False)
    with pytest.raises(ValueError, match="cope sampler's values are not logits"):
        score_forced(decoder.user, tokens, forced, [contrast])


def test_alpha_zero_is_plain_greedy_decoding_of_the_user_model(decoder: CopeDecoder) -> None:
    contrastive, _ = decoder.generate(PROMPT, max_tokens=12, alpha=0.0)
    plain = generate(decoder.user, PROMPT, max_tokens=12)
    assert contrastive.tokens == plain.tokens


def test_a_long_free_text_is_given_alone_only_when_asked(decoder: CopeDecoder) -> None:
    """The API gives a `free` text over 1,000 characters alone, bounded by the context; CoPe refused it with a 400
    naming `messages` until the seventy-ninth session. Elsewhere (the CLI) the limit stands."""
    from localpers.methods.base import RewriteOptions, gives_text_alone
    from localpers.methods.cope_decode import rewrite_cope
    from localpers.tasks import TextTooLong

    state = types.SimpleNamespace(conditioned=False, cluster=0, base_adapter="base")
    text = "=" * 1100  # few tokens: inside this decoder's 256-token context
    with pytest.raises(TextTooLong):
        rewrite_cope(decoder, state, text, task="free", max_tokens=4)  # type: ignore[arg-type]
    whole = rewrite_cope(decoder, state, text, task="free", max_tokens=4, alone=True)  # type: ignore[arg-type]
    assert whole.prompt_tokens == len(decoder.user.tokenize(text)) and whole.text_chars_read is None
    asked = RewriteOptions(task="free", long_text_alone=True)
    assert gives_text_alone(text, asked) and not gives_text_alone(text, RewriteOptions(task="free"))
    assert not gives_text_alone("=" * 990, asked) and gives_text_alone("=" * 990, asked, room=30)
    assert not gives_text_alone(text, RewriteOptions(task="paraphrase", long_text_alone=True))
    with pytest.raises(ValueError, match="only a `free` text"):
        rewrite_cope(decoder, state, text, task="paraphrase", alone=True)  # type: ignore[arg-type]


def test_the_api_decoder_gives_a_long_text_alone_and_says_the_examples_were_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from localpers.methods import cope_method
    from localpers.methods.base import RewriteOptions

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(cope_method, "rewrite_cope", lambda *args, **kwargs: calls.append(kwargs))
    decoder = object.__new__(cope_method.CopeUserDecoder)
    decoder.state = types.SimpleNamespace(conditioned=True)  # type: ignore[assignment]
    decoder.user = types.SimpleNamespace(history_index=lambda task: types.SimpleNamespace(pool=["an item"]))  # type: ignore[assignment]
    decoder.decoder, decoder.prompt_format = None, None  # type: ignore[assignment]
    notes: list[str] = []
    options = RewriteOptions(task="free", long_text_alone=True, note=notes.append)
    decoder.rewrite("A short text.", options)
    decoder.rewrite("word " * 300, options)
    assert [call["alone"] for call in calls] == [False, True]
    assert notes == [
        "the text has over 1,000 characters: it was given without your examples, which would not fit beside it"
    ]


def test_stacked_adapter_is_the_sum_of_its_parts(
    backbone: Backbone, adapters: dict[str, Path], tmp_path: Path
) -> None:
    lora = read_lora_gguf(adapters["user"])
    negated = LoraFile({k: (a, -b) for k, (a, b) in lora.tensors.items()}, lora.alpha, lora.architecture)
    write_stacked_lora(tmp_path / "same.gguf", [lora])
    write_stacked_lora(tmp_path / "cancel.gguf", [lora, negated])
    engine = Engine(backbone.path, n_ctx=128, tap_layers=None)
    try:
        for name in ("same", "cancel"):
            engine.load_adapter(tmp_path / f"{name}.gguf", name)
        engine.load_adapter(adapters["user"], "user")
        tokens = engine.tokenize(PROMPT)
        logits = {}
        for name in (None, "user", "same", "cancel"):
            engine.set_adapter(name)
            logits[name] = engine.prefill(tokens).logits
    finally:
        engine.close()
    assert np.abs(logits["user"] - logits[None]).max() > 0.5  # the adapter matters
    assert np.abs(logits["same"] - logits["user"]).max() < 1e-2
    assert np.abs(logits["cancel"] - logits[None]).max() < 1e-2


def test_missing_cope_state_is_refused_by_the_api_and_the_cli(backbone: Backbone, tmp_path: Path) -> None:
    user = UserStore().create("nocope")
    with pytest.raises(LocalpersError, match="fit --method cope"):
        load_state(user)
    bundle = make_bundle(tmp_path / "bundle", backbone)
    result = CliRunner().invoke(
        app, ["rewrite", "Some article.", "--method", "cope", "--user", "nocope", "--bundle", str(bundle)]
    )
    assert result.exit_code == 1
    assert "no CoPe adapter" in result.output and "Traceback" not in result.output
    assert "\n" not in result.output.strip()


@pytest.mark.slow
def test_device_sft_fits_stores_and_decodes(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tiny real fit (rank 2, 3 steps): stored atomically, loads in llama.cpp, moves the user model."""
    personalizer = Personalizer(
        open_bundle(make_bundle(tmp_path / "bundle", backbone), backbone_sha256=backbone.sha256), backbone
    )
    user = UserStore().create("coper")
    user.save_history(
        [
            HistoryItem.create("headline", f"Generate a headline for the following article: {a}", h)
            for a, h in [
                ("The zoo welcomed two baby pandas.", "TWO BABY PANDAS, ADORABLE!!!"),
                ("Bus fares will drop for students.", "BUS FARES HALVED, GREAT!!!"),
                ("A storm cut power overnight.", "STORM CUTS POWER, WOW!!!"),
            ]
        ]
    )
    try:
        config = SftConfig(rank=2, alpha=4.0, max_steps=3, batch_size=2, learning_rate=5e-3)
        state = fit_cope(personalizer, user, config=config)
        assert state.steps == 3 and state.rank == 2 and state.n_items == 3
        assert load_state(user).adapter_sha256 == state.adapter_sha256
        assert stored_bytes(user) > 10_000
        trained = read_lora_gguf(user.dir / state.adapter_file)
        assert trained.alpha == 4.0 and all(np.abs(b).max() > 0 for _, b in trained.tensors.values())
        modes: list[int] = []
        loading = CopeDecoder.__init__

        def seen_loading(self, backbone_path, user_adapter, base_adapter, **options):  # noqa: ANN001, ANN003, ANN202
            modes.append(os.stat(user_adapter).st_mode & 0o777)
            return loading(self, backbone_path, user_adapter, base_adapter, **options)

        monkeypatch.setattr(CopeDecoder, "__init__", seen_loading)
        decoder = CopeDecoder.for_user(personalizer, user, state)
        try:
            assert modes == [0o600]  # the user's weights, stacked: their own to read, as every file of theirs
            assert not list(user.dir.glob(".cope-stacked*")), "the temporary stacked adapter was left behind"
            prompt = decoder.user.tokenize(PROMPT)
            user_logits = decoder.user.prefill(prompt).logits
            base_logits = decoder.base.prefill(prompt).logits
            assert np.abs(user_logits - base_logits).max() > 1e-2
            result, _ = decoder.generate(PROMPT, max_tokens=8)
            assert result.tokens
        finally:
            decoder.close()
        # a caller's stop strings (an API request's `stop`, a chat's turn openings) end the rewrite
        from localpers.methods.base import RewriteOptions
        from localpers.methods.cope_method import CopeUserDecoder

        opened = CopeUserDecoder(personalizer, user)
        try:
            text = "The zoo welcomed two baby pandas, and the keepers said"
            plain = opened.rewrite(text, RewriteOptions(task="free", max_tokens=12))
            word = plain.text.split()[1]
            cut = opened.rewrite(text, RewriteOptions(task="free", max_tokens=12, stop=(word,)))
            assert cut.text == plain.text[: plain.text.index(word)] and cut.stop_reason == "stop"
        finally:
            opened.close()
        monkeypatch.setattr(stored_files, "FIT_FORMAT", 2)  # the fitting code changed since this fit
        with pytest.raises(LocalpersError, match="fitted by a localpers of another fit format"):
            CopeDecoder.for_user(personalizer, user, state)
        monkeypatch.setattr(stored_files, "FIT_FORMAT", 1)
        second = fit_cope(
            personalizer, user, config=config
        )  # refit replaces the adapter, leaves no stale file
        assert [p.name for p in user.dir.glob("cope-*.gguf")] == [second.adapter_file]
        # `localpers fit --method cope` with nothing new keeps this fit (it would only train it again)
        from localpers.methods.cope_method import CopeMethod

        current = CopeMethod().current_fit(personalizer, user, history_limit=None)
        assert current is not None and current.report["adapter_file"] == second.adapter_file
        assert CopeMethod().current_fit(personalizer, user, history_limit=2) is None  # another window
        user.save_history([*user.history(), HistoryItem.create("headline", "Rain is expected.", "RAIN!!!")])
        assert CopeMethod().current_fit(personalizer, user, history_limit=None) is None
    finally:
        personalizer.close()


NETWORK_PROBE = """
import socket
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args[:2]))
    raise OSError("no network in this test")
socket.getaddrinfo = refuse
socket.socket.connect = refuse
socket.create_connection = refuse
import huggingface_hub  # imported first, as another library may, while the environment still says online
from localpers.engine import torch_model
from localpers.engine.backbone import resolve_backbone
model = torch_model.wrap_lora(torch_model.load_backbone(resolve_backbone().path), 2, 4.0, 0.0, ("attn_q",))
assert torch_model.lora_state(model)
print("ATTEMPTS", attempts)
"""


@pytest.mark.slow
def test_training_never_looks_anything_up_on_a_hub_even_when_the_environment_allows_it() -> None:
    """With HF_HUB_OFFLINE=0, saving a fitted adapter made peft ask huggingface.co for the backbone's config."""
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", NETWORK_PROBE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ATTEMPTS []" in done.stdout, done.stdout + done.stderr[-2000:]


def _items(pairs: list[tuple[str, str]]) -> list[HistoryItem]:
    return [
        HistoryItem.create("headline", f"Generate a headline for the following article: {a}", h)
        for a, h in pairs
    ]


def test_conditioned_training_prompts_show_only_earlier_outputs() -> None:
    items = _items(
        [("Pandas at the zoo.", "PANDAS!!!"), ("Bus fares drop.", "FARES!!!"), ("Storm hits.", "STORM!!!")]
    )
    plain = training_prompts(items, None)
    assert plain == [get_task("headline").prompt_for(item.input) for item in items]
    prompts = training_prompts(items, PromptFormat(examples=2, recent=1))
    assert prompts[0] == plain[0]  # nothing written before the first item: the plain prompt
    assert "PANDAS!!!" in prompts[1] and "FARES!!!" not in prompts[1]
    assert "PANDAS!!!" in prompts[2] and "FARES!!!" in prompts[2] and "STORM!!!" not in prompts[2]
    assert all(prompt.endswith(plain[i]) for i, prompt in enumerate(prompts))


def test_a_damaged_adapter_file_field_advises_refitting_that_user() -> None:
    """The advice named no user, so following it refitted the active user and left this one damaged."""
    UserStore().create("active-one")
    other = UserStore().create("other-one")  # the first user stays the active one
    state = {"adapter_file": "../elsewhere.gguf", "rank": 8, "n_items": 3, "steps": 3, "train_tokens": 30}
    state |= {"bundle_sha256": "0" * 64, "base_adapter": "global", "adapter_sha256": "0" * 64, "version": 1}
    state |= {"alpha": 16.0, "cluster": None, "seconds": {}, "precision": "fp32", "final_loss": None}
    (other.dir / "cope.json").write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(LocalpersError, match="bad adapter_file.*--method cope --user other-one"):
        load_state(other)


def test_a_fit_stored_before_conditioned_prompts_decodes_with_the_plain_prompt() -> None:
    stored = {
        "bundle_sha256": "0" * 64,
        "cluster": 0,
        "base_adapter": "cluster-0",
        "adapter_file": "cope-0000000000000000.gguf",
        "adapter_sha256": "0" * 64,
        "rank": 8,
        "alpha": 16.0,
        "n_items": 3,
        "steps": 3,
        "train_tokens": 30,
        "final_loss": 1.0,
        "precision": "fp32",
    }
    assert CopeState(**stored).conditioned is False


def test_rewrite_cope_shows_the_history_only_for_a_fit_trained_on_conditioned_prompts(
    decoder: CopeDecoder,
) -> None:
    # the test above read a dataclass default only; a rewrite treating every fit as conditioned passed it
    from localpers.methods.cope_decode import rewrite_cope
    from localpers.users.history_index import HistoryIndex

    history = HistoryIndex(get_task("headline"), [("A storm cut power.", "STORM CUTS POWER!!!")] * 3)
    conditioned = PromptFormat(examples=2)
    text = "The zoo welcomed two baby pandas."
    plain_length = len(decoder.user.tokenize(get_task("headline").prompt_for(text)))
    for fitted_on_conditioned in (False, True):
        state = types.SimpleNamespace(conditioned=fitted_on_conditioned, cluster=0, base_adapter="base")
        result = rewrite_cope(
            decoder,  # type: ignore[arg-type]
            state,  # type: ignore[arg-type]
            text,
            max_tokens=2,
            history=history,
            prompt_format=conditioned,
            show_examples=True,
        )
        if fitted_on_conditioned:
            assert result.examples and result.prompt_tokens > plain_length
        else:
            assert result.examples == [] and result.prompt_tokens == plain_length


@pytest.mark.slow
def test_device_sft_on_a_conditioned_bundle_trains_and_decodes_on_the_bases_prompt(
    backbone: Backbone, tmp_path: Path
) -> None:
    """A history-conditioned bundle with the global base: CoPe stacks on the global adapter, says it is conditioned."""
    bundle = make_bundle(
        tmp_path / "bundle", backbone, prompt=PromptFormat(examples=2).to_manifest(), base="global"
    )
    user = UserStore().create("conditioned-coper")
    user.save_history(
        _items(
            [
                ("Pandas at the zoo.", "PANDAS!!!"),
                ("Bus fares drop.", "FARES!!!"),
                ("Storm hits.", "STORM!!!"),
            ]
        )
    )
    personalizer = Personalizer(open_bundle(bundle, backbone_sha256=backbone.sha256), backbone)
    try:
        state = fit_cope(personalizer, user, config=SftConfig(rank=2, alpha=4.0, max_steps=2, batch_size=2))
    finally:
        personalizer.close()
    assert state.conditioned is True and state.base_adapter == "global"
    assert load_state(user).conditioned is True
    result = CliRunner().invoke(
        app,
        ["rewrite", "A new bridge opened.", "--method", "cope", "--user", user.name, "--bundle", str(bundle)]
        + ["--no-stream", "--json", "--max-tokens", "6"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["adapter"] == "global+user"
    # the conditioned prompt's history items, listed as CARD's are: the latest output, then the closest one
    assert [example["why"] for example in payload["examples"]] == ["recent", "closest"]
    assert payload["examples"][0]["output"] == "STORM!!!"


def test_a_lora_that_learned_from_an_item_removed_while_it_trained_is_not_stored(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`history remove` in another shell during a CoPe fit: the fit stored a LoRA trained on the removed item and
    ended in success (concurrency audit, seventy-eighth session)."""
    from localpers.methods import cope
    from localpers.methods.forget import remove_history_items

    personalizer = Personalizer(
        open_bundle(make_bundle(tmp_path / "bundle", backbone), backbone_sha256=backbone.sha256), backbone
    )
    user = UserStore().create("remover")
    items = [
        HistoryItem.create("headline", f"Generate a headline for the following article: {a}", h)
        for a, h in [("The zoo welcomed two pandas.", "PANDAS!!!"), ("Bus fares drop.", "FARES HALVED!!!")]
    ]
    user.save_history(items)

    try:
        trained = types.SimpleNamespace(
            seconds={}, tensors={}, steps=1, tokens=1, losses=[], precision="fp32"
        )

        def removed_meanwhile(*args: object, **kwargs: object) -> object:
            remove_history_items(user, lambda _: {items[0].id})
            return trained

        monkeypatch.setattr(cope, "train_user_lora", removed_meanwhile)
        with pytest.raises(
            LocalpersError, match=r"1 of the items this CoPe fit learned from was removed .* while it"
        ):
            fit_cope(personalizer, user)
    finally:
        personalizer.close()
    assert not (user.dir / "cope.json").exists() and not list(user.dir.glob("*cope*"))


def test_a_user_deleted_while_its_lora_trains_stops_the_training_at_once(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user deleted during a CoPe fit was refused only by the final write, after the whole training (25-50 s on 2
    cores; concurrency audit, seventy-eighth session)."""
    from localpers.methods import cope

    personalizer = Personalizer(
        open_bundle(make_bundle(tmp_path / "bundle", backbone), backbone_sha256=backbone.sha256), backbone
    )
    store = UserStore()
    user = store.create("leaver")
    user.save_history(
        [HistoryItem.create("headline", "Generate a headline for the following article: Rain.", "RAIN")]
    )
    steps: list[int] = []

    def training(
        path: object, examples: object, base: object, config: object, progress: cope.Progress
    ) -> None:
        for step in range(5):
            if step == 2:
                store.delete("leaver")  # `localpers user delete leaver` in another shell
            progress("train", step + 1, 5)
            steps.append(step)

    monkeypatch.setattr(cope, "train_user_lora", training)
    try:
        with pytest.raises(LocalpersError, match="'leaver' no longer exists"):
            fit_cope(personalizer, user)
    finally:
        personalizer.close()
    assert steps == [0, 1] and not user.dir.exists()

    def remade(path: object, examples: object, base: object, config: object, progress: cope.Progress) -> None:
        store.delete("leaver2")
        store.create("leaver2")  # `user import --as leaver2` in another shell
        progress("train", 1, 5)

    user = store.create("leaver2")
    user.save_history(
        [HistoryItem.create("headline", "Generate a headline for the following article: Sun.", "SUN")]
    )
    monkeypatch.setattr(cope, "train_user_lora", remade)
    personalizer = Personalizer(
        open_bundle(make_bundle(tmp_path / "bundle2", backbone), backbone_sha256=backbone.sha256), backbone
    )
    try:
        with pytest.raises(
            LocalpersError, match="'leaver2' was deleted and made anew while this command ran"
        ):
            fit_cope(personalizer, user)
    finally:
        personalizer.close()
    assert not (store.get("leaver2").dir / "cope.json").exists()


def test_merging_the_base_adapter_for_a_fit_leaves_the_shared_backbone_bit_identical() -> None:
    # the update was subtracted again: in float32 (w + d) - d is not w, so each fit changed the backbone a process
    # shares with the next user's fit and the publisher's training
    torch = pytest.importorskip("torch")
    from localpers.methods.cope_train import merged

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    projection = torch.nn.Linear(64, 64, bias=False)
    layer = types.SimpleNamespace(self_attn=types.SimpleNamespace(q_proj=projection))
    causal_lm = types.SimpleNamespace(model=types.SimpleNamespace(layers=[layer]))
    model = types.SimpleNamespace(get_base_model=lambda: causal_lm)
    original = projection.weight.detach().clone()
    for _ in range(3):
        lora_a = rng.normal(0, 0.05, size=(4, 64)).astype(np.float32)
        lora_b = rng.normal(0, 0.05, size=(64, 4)).astype(np.float32)
        adapter = LoraFile({"blk.0.attn_q.weight": (lora_a, lora_b)}, alpha=8.0, architecture="gemma3")
        with merged(model, adapter):
            assert not torch.equal(projection.weight, original)  # the update is in while the block runs
    assert torch.equal(projection.weight, original)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seconds": {"train": "3.0"}}, "seconds"),  # summed by the fit's summary: a TypeError traceback
        ({"seconds": {"train": None}}, "seconds"),
        ({"conditioned": "no"}, "conditioned"),  # taken as true
        ({"rank": -5}, "rank"),
    ],
)
def test_a_cope_state_field_no_fit_writes_is_damaged(change: dict, field: str) -> None:
    """audit85: these passed the type check of cope.json."""
    user = UserStore().create("tampered")
    state = {"adapter_file": "cope-0000000000000000.gguf", "rank": 8, "n_items": 3, "steps": 3}
    state |= {"bundle_sha256": "0" * 64, "base_adapter": "global", "adapter_sha256": "0" * 64, "version": 1}
    state |= {
        "alpha": 16.0,
        "cluster": None,
        "seconds": {"train": 1.5},
        "precision": "fp32",
        "final_loss": None,
    }
    state |= {"train_tokens": 30, "conditioned": True, **change}
    (user.dir / "cope.json").write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(LocalpersError, match=f"is damaged \\(field '{field}'\\)"):
        load_state(user)


def test_a_lora_file_whose_tensors_do_not_pair_or_are_not_finite_is_named(tmp_path: Path) -> None:
    """Shapes that do not stack ended a CoPe rewrite in numpy's ValueError; NaN in a sampler's "dropped every
    candidate token", naming no file (audit85)."""
    from localpers.engine.adapters import write_lora_gguf
    from localpers.methods.lora_files import read_lora_gguf, stack_loras

    a, b = np.ones((4, 640), np.float32), np.ones((640, 4), np.float32)
    good = read_lora_gguf(write_lora_gguf(tmp_path / "good.gguf", {"blk.0.attn_q.weight": (a, b)}, alpha=8.0))
    path = write_lora_gguf(tmp_path / "nan.gguf", {"blk.0.attn_q.weight": (a * np.nan, b)}, alpha=8.0)
    with pytest.raises(LocalpersError, match=f"{path}: .* not finite"):
        read_lora_gguf(path)
    other = read_lora_gguf(
        write_lora_gguf(
            tmp_path / "other.gguf",
            {"blk.0.attn_q.weight": (np.ones((4, 100), np.float32), np.ones((640, 4), np.float32))},
            alpha=8.0,
        )
    )
    with pytest.raises(LocalpersError, match="different models"):
        stack_loras([good, other])
