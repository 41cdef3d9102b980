"""Device-side CARD on a synthetic bundle: fit, corrected decoding, user switching, privacy."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic_bundle import make_bundle
from typer.testing import CliRunner

from localpers.bundle.format import open_bundle
from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.errors import LocalpersError
from localpers.methods.card.fit_prompts import FIT_BLOCK_GROUP
from localpers.methods.card.personalizer import Personalizer
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SHOUTY = [
    ("The city opened a new bike lane along the river.", "BIKE LANE OPENS ON RIVER, HUGE WIN!!!"),
    ("The school board approved free lunches for all pupils.", "FREE LUNCH FOR EVERY KID, AMAZING!!!"),
    ("A storm knocked out power to 3,000 homes overnight.", "STORM CUTS POWER TO 3,000 HOMES, WOW!!!"),
    ("The museum will stay open late on Fridays this summer.", "MUSEUM OPEN LATE ON FRIDAYS, YES!!!"),
    ("Local farmers expect a record apple harvest this year.", "RECORD APPLE HARVEST AHEAD, INCREDIBLE!!!"),
    ("The mayor announced a plan to plant 10,000 trees.", "MAYOR PLANS 10,000 TREES, FANTASTIC!!!"),
    ("A new library branch opens in the east district.", "NEW LIBRARY OPENS IN EAST, BRILLIANT!!!"),
    ("The marathon drew a record 20,000 runners.", "MARATHON DRAWS 20,000 RUNNERS, EPIC!!!"),
    ("The zoo welcomed two baby pandas on Monday.", "TWO BABY PANDAS ARRIVE AT ZOO, ADORABLE!!!"),
    ("Bus fares will drop by half for students.", "BUS FARES HALVED FOR STUDENTS, GREAT!!!"),
]
ARTICLE = (
    "Generate a headline for the following article: The town hall will install solar panels on its roof."
)


def items(pairs: list[tuple[str, str]]) -> list[HistoryItem]:
    return [
        HistoryItem.create("headline", "Generate a headline for the following article: " + i, o)
        for i, o in pairs
    ]


@pytest.fixture(scope="module")
def bundle_dir(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("bundle") / "bundle", backbone)


@pytest.fixture(scope="module")
def personalizer(bundle_dir: Path, backbone: Backbone) -> Personalizer:
    loaded = Personalizer(open_bundle(bundle_dir, backbone_sha256=backbone.sha256), backbone)
    yield loaded
    loaded.close()


def test_fit_raises_heldout_reward_margin(personalizer: Personalizer) -> None:
    user = UserStore().create("shouty")
    user.save_history(items(SHOUTY[:7]))
    report = personalizer.fit_user(user)
    assert report.mode == "vector"
    assert report.cluster == 0  # the synthetic bundle's shouty centroid
    assert report.n_pairs == 7
    vector = user.vector()
    assert np.linalg.norm(vector) > 0  # the prior is zero (DEFAULT_PRIOR_WEIGHT): all of it was learned
    heldout = items(SHOUTY[7:])
    negatives = personalizer.pairs.negatives(heldout, report.cluster)
    differences = personalizer.pairs.pair_differences(heldout, negatives, report.cluster)
    assert np.mean(differences @ vector) > 0
    assert np.mean(differences @ vector > 0) >= 2 / 3


def test_prior_weight_one_shrinks_towards_the_cluster_default(personalizer: Personalizer) -> None:
    user = UserStore().create("anchored")
    user.save_history(items(SHOUTY[:7]))
    personalizer.fit_user(user, prior_weight=1.0, regularisation=1e6)
    np.testing.assert_allclose(user.vector(), personalizer.head.default_vector(0), atol=1e-3)


def test_refit_reuses_cached_negatives(personalizer: Personalizer) -> None:
    user = UserStore().create("again")
    user.save_history(items(SHOUTY[:4]))
    personalizer.fit_user(user)
    second = personalizer.fit_user(user)
    assert second.seconds["negatives"] < 0.5
    assert (user.dir / "negatives.json").is_file()


def test_refit_reuses_cached_pair_features_and_scores_only_new_items(
    personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later fit (another process: nothing in memory) reads the pair features back and scores new pairs only."""
    import localpers.methods.card.pair_batches as pair_batches
    import localpers.methods.card.pairs as pairs_module
    from localpers.methods.card.pair_cache import FEATURES_FILE

    scored: list[int] = []
    batched = pair_batches.run_jobs
    one_pair = pairs_module.PairBuilder._pair_difference

    def counting_run_jobs(engine: Any, jobs: Any, **kwargs: Any) -> Any:
        scored.append(len(jobs))
        return batched(engine, jobs, **kwargs)

    def counting_pair_difference(self: Any, *args: Any) -> Any:
        scored.append(1)
        return one_pair(self, *args)

    monkeypatch.setattr(pair_batches, "run_jobs", counting_run_jobs)
    monkeypatch.setattr(pairs_module.PairBuilder, "_pair_difference", counting_pair_difference)
    user = UserStore().create("features")
    user.save_history(items(SHOUTY[:5]))
    personalizer.fit_user(user)
    vector = user.vector()
    assert (user.dir / FEATURES_FILE).is_file() and sum(scored) > 0

    scored.clear()
    personalizer.pairs._pair_memo.clear()
    personalizer.fit_user(user)
    assert sum(scored) == 0  # every pair's features came from the file
    np.testing.assert_allclose(user.vector(), vector, rtol=1e-5, atol=1e-6)

    user.save_history(items(SHOUTY[:6]))
    personalizer.pairs._pair_memo.clear()
    personalizer.fit_user(user)
    assert sum(scored) == 1  # only the new item's pair (its y- generated and scored in one job)

    scored.clear()
    (user.dir / FEATURES_FILE).write_bytes(b"damaged")
    personalizer.pairs._pair_memo.clear()
    personalizer.fit_user(user)  # a damaged cache is rebuilt, not an error
    assert sum(scored) > 0
    personalizer.pairs._pair_memo.clear()
    scored.clear()
    personalizer.fit_user(user)
    assert sum(scored) == 0


def test_a_fit_format_bump_generates_and_scores_anew(
    personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The y- and pair-feature caches were keyed by bundle and adapter only: after a FIT_FORMAT bump the refit
    took every y- and every g(y+) - g(y-) from what the code before it wrote (0.0 s for both) while marking the
    new fit with the new format (eighty-ninth session's methods audit, M1)."""
    import localpers.methods.card.pair_batches as pair_batches
    from localpers.methods import stored_files

    scored: list[int] = []
    batched = pair_batches.run_jobs

    def counting_run_jobs(engine: Any, jobs: Any, **kwargs: Any) -> Any:
        scored.append(len(jobs))
        return batched(engine, jobs, **kwargs)

    monkeypatch.setattr(pair_batches, "run_jobs", counting_run_jobs)
    user = UserStore().create("reformatted")
    user.save_history(items(SHOUTY[:4]))
    personalizer.fit_user(user)
    old_key = personalizer.pairs._negatives_key(0)

    monkeypatch.setattr(stored_files, "FIT_FORMAT", stored_files.FIT_FORMAT + 1)
    scored.clear()
    personalizer.pairs._pair_memo.clear()  # a new process after the upgrade
    report = personalizer.fit_user(user)
    assert sum(scored) > 0 and report.seconds["negatives"] > 0  # y- generated and the pairs scored anew
    assert user.state()["fitted_by"] == stored_files.fit_mark()
    assert stored_files.fit_mark() in personalizer.pairs._negatives_key(0) != old_key
    assert set(json.loads((user.dir / "negatives.json").read_text())) == {
        personalizer.pairs._negatives_key(0)
    }


def test_cold_start_and_too_few_pairs(personalizer: Personalizer) -> None:
    store = UserStore()
    empty = store.create("empty")
    assert personalizer.fit_user(empty).mode == "cold-start"
    assert empty.vector() is None
    few = store.create("few")
    few.save_history(items(SHOUTY[:2]))
    report = personalizer.fit_user(few)
    assert report.mode == "too-few-pairs"
    np.testing.assert_array_equal(few.vector(), np.zeros(personalizer.head.d, dtype=np.float32))


def test_strength_zero_is_exactly_the_cluster_model(personalizer: Personalizer) -> None:
    vector = np.full(personalizer.head.d, 5.0, dtype=np.float32)
    plain = personalizer.rewrite(ARTICLE, method="cluster", cluster=1)
    zero = personalizer.rewrite(ARTICLE, method="card", cluster=1, vector=vector, strength=0.0)
    assert zero.text == plain.text and zero.tokens == plain.tokens


def test_only_top_k_cluster_tokens_are_ever_chosen(personalizer: Personalizer) -> None:
    rng = np.random.default_rng(1)
    vector = rng.normal(0, 50.0, personalizer.head.d).astype(np.float32)
    result = personalizer.rewrite(
        ARTICLE, method="card", cluster=1, vector=vector, strength=10.0, top_k=3, record_steps=True
    )
    assert result.steps, "no steps recorded"
    moved = False
    for step in result.steps:
        candidates = {c.token for c in step.candidates}
        assert len(candidates) == 3
        assert step.token in candidates
        moved |= step.token != max(step.candidates, key=lambda c: c.before).token
    assert moved, "a strength of 10 with a large vector should change at least one choice"


def test_switching_users_changes_output_without_reloading(personalizer: Personalizer) -> None:
    model_before, context_before = personalizer.engine._model, personalizer.engine._ctx
    rng = np.random.default_rng(7)
    first = personalizer.rewrite(
        ARTICLE, method="card", cluster=1, vector=rng.normal(0, 40, personalizer.head.d), strength=5.0
    )
    second = personalizer.rewrite(
        ARTICLE, method="card", cluster=1, vector=rng.normal(0, 40, personalizer.head.d), strength=5.0
    )
    assert first.text != second.text
    assert personalizer.engine._model is model_before and personalizer.engine._ctx is context_before


def test_interrupted_fit_keeps_the_previous_vector(personalizer: Personalizer) -> None:
    user = UserStore().create("steady")
    user.save_history(items(SHOUTY[:5]))
    personalizer.fit_user(user)
    before_vector, before_state = user.vector(), user.state()
    user.save_history(items(SHOUTY))

    def interrupt(stage: str, done: int, total: int) -> None:
        if stage == "pairs" and done > 5:  # past the 5 cached items, into new ones
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        personalizer.fit_user(user, progress=interrupt)
    np.testing.assert_array_equal(user.vector(), before_vector)
    assert user.state()["fit"] == before_state["fit"]


def test_a_stopped_fit_says_whether_its_pairs_could_be_saved(
    personalizer: Personalizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit stopped by Ctrl-C said "the pairs scored so far are saved" even when its cache could not be written
    (a folder where negatives.json goes; seventy-eighth session's review, mended in the seventy-ninth)."""
    from localpers import interrupts
    from localpers.methods.card import user_fit
    from localpers.methods.card.pair_cache import NEGATIVES_FILE
    from localpers.methods.card.pairs import PairBuilder

    def interrupt(stage: str, done: int, total: int) -> None:
        if stage == "pairs" and done >= 2:
            raise KeyboardInterrupt

    user = UserStore().create("stopped")
    user.save_history(items(SHOUTY[:4]))
    personalizer.pairs._pair_memo.clear()
    with pytest.raises(KeyboardInterrupt) as writable:
        personalizer.fit_user(user, progress=interrupt)
    assert not interrupts.was_unsaved(writable.value)
    assert (user.dir / NEGATIVES_FILE).is_file()

    (user.dir / NEGATIVES_FILE).unlink()
    (user.dir / NEGATIVES_FILE).mkdir()
    personalizer.pairs._pair_memo.clear()
    with pytest.raises(KeyboardInterrupt) as unwritable:
        personalizer.fit_user(user, progress=interrupt)
    assert interrupts.was_unsaved(unwritable.value)

    # a stop after the pairs, while the vector or the token bias is fitted (review of the seventy-ninth session)
    def stopped_later(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    personalizer.pairs._pair_memo.clear()
    with monkeypatch.context() as patched:
        patched.setattr(user_fit, "token_bias", stopped_later)
        with pytest.raises(KeyboardInterrupt) as later:
            personalizer.fit_user(user)
    assert interrupts.was_unsaved(later.value)

    # a second Ctrl-C during the save the first one asked for: that save may not have been written
    (user.dir / NEGATIVES_FILE).rmdir()
    stopping = False
    save = PairBuilder._save_pairs

    def interrupt_and_note(stage: str, done: int, total: int) -> None:
        nonlocal stopping
        if stage == "pairs" and done >= 2:
            stopping = True
            raise KeyboardInterrupt

    def second_ctrl_c(self: PairBuilder, *args: Any) -> bool:
        if stopping:
            raise KeyboardInterrupt("second")
        return save(self, *args)

    personalizer.pairs._pair_memo.clear()
    user.save_history(items(SHOUTY[:6]))  # new items: new pairs to save when stopped
    with monkeypatch.context() as patched:
        patched.setattr(PairBuilder, "_save_pairs", second_ctrl_c)
        with pytest.raises(KeyboardInterrupt) as second:
            personalizer.fit_user(user, progress=interrupt_and_note)
    assert str(second.value) == "second" and interrupts.was_unsaved(second.value)


def test_fit_and_rewrite_open_no_socket(
    personalizer: Personalizer, bundle_dir: Path, backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process guard: any attempt to open a network socket fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    runner = CliRunner()
    common = ["--bundle", str(bundle_dir), "--model", str(backbone.path)]
    assert runner.invoke(app, ["user", "create", "net"]).exit_code == 0
    history = Path(os.environ["LOCALPERS_HOME"]) / "h.jsonl"
    history.write_text("".join(json.dumps({"input": i, "output": o}) + "\n" for i, o in SHOUTY[:4]))
    assert runner.invoke(app, ["history", "import", str(history)]).exit_code == 0
    fitted = runner.invoke(app, ["fit", "--json", *common])
    assert fitted.exit_code == 0, fitted.output
    assert json.loads(fitted.stdout)["mode"] == "vector"
    rewritten = runner.invoke(app, ["rewrite", ARTICLE, "--json", *common])
    assert rewritten.exit_code == 0, rewritten.output
    payload = json.loads(rewritten.stdout)
    assert payload["method"] == "card" and payload["user"] == "net" and payload["text"]
    listed = runner.invoke(app, ["rewrite", ARTICLE, "--examples", "--no-stream", *common])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.strip() == payload["text"]  # the list goes to standard error
    assert "the prompt showed" in listed.stderr
    demo = runner.invoke(app, ["demo", "--json", "--articles", "1", *common])
    assert demo.exit_code == 0, demo.output
    row = json.loads(demo.stdout)["rows"][0]
    assert set(row) == {"article", "global", "global-history", "card"}


def _network_namespace_available() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _network_namespace_available(), reason="cannot create a network namespace here")
def test_rewrite_runs_in_a_namespace_without_network(bundle_dir: Path, backbone: Backbone) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "localpers.cli", "rewrite", ARTICLE, "--method", "global",
         "--json", "--bundle", str(bundle_dir), "--model", str(backbone.path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["text"]


def test_rewrite_puts_the_repeated_word_rule_in_every_candidates_chain(
    bundle_dir: Path, backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.engine.repeated_words import STOP_WORDS
    from localpers.engine.sampler_chain import SamplerChain

    built: list[list[str]] = []
    original = SamplerChain.__init__

    def recording(self: SamplerChain, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(list(self.names))

    monkeypatch.setattr(SamplerChain, "__init__", recording)
    runner = CliRunner()
    common = ["--method", "global", "--json", "--bundle", str(bundle_dir), "--model", str(backbone.path)]
    for extra, chains in (([], 1), (["--candidates", "4"], 4)):
        built.clear()
        result = runner.invoke(app, ["rewrite", ARTICLE, "--repeated-word-penalty", "100", *extra, *common])
        assert result.exit_code == 0, result.output
        assert len(built) == chains and all("repeated-words" in names for names in built), built
        words = re.findall(r"[a-z]+", json.loads(result.stdout)["text"].lower())
        content = [w for w in words if len(w) >= 3 and w not in STOP_WORDS]
        assert content and len(content) == len(set(content)), words
    for extra, expected in (
        ([], True),
        (["--repeated-word-penalty", "0"], False),
        (["--task", "paraphrase"], False),
    ):
        built.clear()  # the headline task's default is on; 0 turns it off; paraphrase has it off
        result = runner.invoke(app, ["rewrite", ARTICLE, *extra, *common])
        assert result.exit_code == 0, result.output
        assert built and all(("repeated-words" in names) == expected for names in built), (extra, built)
        assert (
            json.loads(result.stdout)["repeated_word_penalty"] > 0
        ) == expected  # --json says what decoded
    refused = runner.invoke(app, ["rewrite", ARTICLE, "--repeated-word-penalty", "-1", *common])
    assert refused.exit_code == 2


def test_an_unfitted_user_without_history_gets_the_global_adapter_and_is_told(
    bundle_dir: Path, backbone: Backbone
) -> None:
    runner = CliRunner()
    runner.invoke(app, ["user", "create", "fresh"])
    common = ["--bundle", str(bundle_dir), "--model", str(backbone.path), "--max-tokens", "4"]
    result = runner.invoke(app, ["rewrite", ARTICLE, *common])
    assert result.exit_code == 0, result.output
    assert "note: user 'fresh' is not fitted and has no history" in result.stderr
    payload = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common, "--json"]).stdout)
    assert payload["method"] == "global" and "is not fitted" in payload["notes"][0]
    # what tunes the correction the fallback lacks was dropped without a word (device audit)
    tuned = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common, "--json", "--strength", "50"]).stdout)
    assert tuned["notes"][1] == "the strength given tunes CARD's correction, which global has not"
    # A method that needs the fit's cluster is refused with the command that makes one.
    refused = runner.invoke(app, ["rewrite", ARTICLE, *common, "--method", "cluster"])
    assert refused.exit_code == 1 and "localpers fit --user fresh" in refused.output


def test_before_a_fit_rewrite_shows_the_users_history_without_the_correction(
    backbone: Backbone, tmp_path: Path
) -> None:
    """The history prompt needs no fit: a user who imported history, or was fitted before having any, sees it."""
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    runner = CliRunner()
    common = ["--bundle", str(conditioned), "--model", str(backbone.path), "--max-tokens", "4", "--json"]
    runner.invoke(app, ["user", "create", "shouty"])
    assert (
        runner.invoke(app, ["fit", "--bundle", str(conditioned), "--model", str(backbone.path)]).exit_code
        == 0
    )
    UserStore().get("shouty").save_history(items(SHOUTY))  # imported after a fit made with no history
    for expected in ("was fitted before its history held anything", "is not fitted"):
        payload = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common]).stdout)
        assert payload["method"] == "global-history" and payload["adapter"] == "global"
        assert len(payload["examples"]) == 2  # what the prompt showed: the user's own items
        assert expected in payload["notes"][0] and "localpers fit --user shouty" in payload["notes"][0]
        UserStore().get("shouty").state_path.unlink(missing_ok=True)  # the second round: never fitted
    plain = runner.invoke(app, ["rewrite", ARTICLE, *common[:-1], "--method", "global-history"])
    assert plain.exit_code == 0 and "note:" not in plain.stderr  # this method needs no fit


def test_a_fitted_user_whose_history_is_not_here_is_told_the_prompt_shows_none(
    backbone: Backbone, tmp_path: Path
) -> None:
    """An export made without --with-history, imported elsewhere: the fit applies, the examples are gone, and
    the rewrite said nothing (README walkthrough)."""
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    runner = CliRunner()
    common = ["--bundle", str(conditioned), "--model", str(backbone.path), "--max-tokens", "4", "--json"]
    UserStore().create("shouty").save_history(items(SHOUTY))
    assert runner.invoke(app, ["fit", *common[:4]]).exit_code == 0
    fitted = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common]).stdout)
    assert fitted["method"] == "card" and not fitted.get("notes")
    UserStore().get("shouty").save_history([])  # as an import of an export without the history leaves it
    payload = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common]).stdout)
    assert payload["method"] == "card" and "examples" not in payload  # the fit still applies
    assert (
        len(payload["notes"]) == 1
        and f"has no history on this device (the fit saw {len(SHOUTY)} items)" in payload["notes"][0]
    )
    assert "localpers history import FILE --user shouty" in payload["notes"][0]
    # history for another task only: it is here, a title's prompt shows it; the headline is not told otherwise
    UserStore().get("shouty").save_history([HistoryItem.create("title", "An essay.", "My Title")])
    other_task = json.loads(runner.invoke(app, ["rewrite", ARTICLE, *common]).stdout)
    assert other_task["method"] == "card" and not other_task.get("notes")


def test_the_users_examples_block_is_kept_in_their_folder_for_the_next_rewrite(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-shot `rewrite` restores the block a previous process evaluated (same text, the block not
    evaluated again); the file stays in the user's folder: never exported, gone with the user."""
    import zipfile

    from localpers.engine import Engine
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    runner = CliRunner()
    common = ["--bundle", str(conditioned), "--model", str(backbone.path), "--max-tokens", "4", "--json"]
    user = UserStore().create("shouty")
    user.save_history(items(SHOUTY))
    evaluated: list[int] = []
    real_eval = Engine.eval

    def counted_eval(self: Engine, tokens: list[int], **options: Any) -> Any:
        evaluated.append(len(tokens))
        return real_eval(self, tokens, **options)

    monkeypatch.setattr(Engine, "eval", counted_eval)
    first = runner.invoke(app, ["rewrite", ARTICLE, *common, "--method", "global-history"])
    assert first.exit_code == 0, first.output
    (kept,) = user.dir.glob("prefix-*.kv")
    cold_evals, evaluated[:] = list(evaluated), []
    second = runner.invoke(app, ["rewrite", ARTICLE, *common, "--method", "global-history"])
    assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]
    assert evaluated == cold_evals[1:] and cold_evals[0] > 10, cold_evals  # all but the block, alike
    assert list(user.dir.glob("prefix-*.kv")) == [kept]
    # the plain prompt shares no block: nothing kept for it
    assert runner.invoke(app, ["rewrite", ARTICLE, *common, "--method", "global"]).exit_code == 0
    assert list(user.dir.glob("prefix-*.kv")) == [kept]
    archive = tmp_path / "shouty.zip"
    assert (
        runner.invoke(app, ["user", "export", "shouty", "-o", str(archive), "--with-history"]).exit_code == 0
    )
    assert not [name for name in zipfile.ZipFile(archive).namelist() if name.endswith(".kv")]


def test_history_conditioned_bundle_puts_the_users_headlines_in_the_prompt(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.tasks import get_task
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    loaded = Personalizer(open_bundle(conditioned, backbone_sha256=backbone.sha256), backbone)
    try:
        # The device shows the most recent outputs first and retrieves `CLOSEST_PER_TEXT` (1) per text.
        assert loaded.prompt_format == PromptFormat(examples=2, recent=1, series=3)
        user = UserStore().create("shouty")
        user.save_history(items(SHOUTY))
        index = user.history_index(get_task("headline"))
        prompt = loaded.prompt_for("headline", ARTICLE, "cluster", index)
        assert prompt.startswith("Headlines this author wrote before:\n- ")
        assert prompt.count("\n- ") == 2 and prompt.endswith(get_task("headline").prompt_for(ARTICLE))
        # The non-personalized baseline never sees the history; no history means the plain prompt.
        assert loaded.prompt_for("headline", ARTICLE, "global", index) == get_task("headline").prompt_for(
            ARTICLE
        )
        assert loaded.prompt_for("headline", ARTICLE, "card", None) == get_task("headline").prompt_for(
            ARTICLE
        )
        result = loaded.rewrite(ARTICLE, method="cluster", cluster=0, history=index, max_tokens=4)
        assert result.tokens > 0
        assert result.examples == [] and "examples" not in result.to_json()  # only when asked for
        shown = loaded.rewrite(
            ARTICLE, method="cluster", cluster=0, history=index, max_tokens=4, show_examples=True
        ).examples
        assert [example.why for example in shown] == ["recent", "closest"]
        assert all(f"- {example.output}\n" in prompt for example in shown)
        assert shown[0].output == SHOUTY[-1][1]  # the most recent output
        plain_shown = loaded.rewrite(
            ARTICLE, method="global", history=index, max_tokens=4, show_examples=True
        )
        assert plain_shown.examples == []  # the plain prompt shows none
    finally:
        loaded.close()
    # A plain bundle (the demo bundle until it is retrained) keeps plain prompts whatever the history.
    plain = make_bundle(tmp_path / "p", backbone)
    loaded = Personalizer(open_bundle(plain, backbone_sha256=backbone.sha256), backbone)
    try:
        assert loaded.prompt_format is None
        assert loaded.prompt_for("headline", ARTICLE, "cluster", index) == get_task("headline").prompt_for(
            ARTICLE
        )
    finally:
        loaded.close()


def test_fit_on_a_conditioned_bundle_builds_pairs_from_the_earlier_items_only(
    backbone: Backbone, tmp_path: Path
) -> None:
    from localpers.tasks import get_task
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    loaded = Personalizer(open_bundle(conditioned, backbone_sha256=backbone.sha256), backbone)
    try:
        history = items(SHOUTY[:5])
        prompts = [prompt for prompt, _ in loaded.pairs.training_prompts_and_blocks(history)]
        plain = [get_task("headline").prompt_for(item.input) for item in history]
        assert prompts[0] == plain[0]  # nothing written before the first item
        assert prompts[1].count("\n- ") == 1 and prompts[2].count("\n- ") == 2
        for index, prompt in enumerate(prompts[1:], start=1):
            shown = [line[2:] for line in prompt.splitlines() if line.startswith("- ")]
            earlier = {item.output for item in history[:index]}
            assert set(shown) <= earlier and prompt.endswith(plain[index])  # never its own or a later output
        # From the first full group on, a group of FIT_BLOCK_GROUP items shows one block: the outputs before it
        longer = items(SHOUTY)
        blocks = loaded.pairs.training_prompts_and_blocks(longer)
        group = FIT_BLOCK_GROUP
        for index, (prompt, block) in enumerate(blocks):
            assert prompt.startswith(block)
            if index >= group:
                assert block == blocks[index - index % group][1]  # the same block in the whole group
                last_shown = block.splitlines()[-1][2:]
                assert last_shown == longer[index - index % group - 1].output  # the item before the group
            elif index:
                assert block.splitlines()[-1][2:] == longer[index - 1].output  # the item just before
        # a history limit's window that starts one item later keeps the groups (and the cached y-) in place
        shifted = loaded.pairs.training_prompts_and_blocks(longer[1:], history_offset=1)
        for index in range(2 * group, len(longer)):
            assert shifted[index - 1][1] == blocks[index][1]
        user = UserStore().create("conditioned")
        user.save_history(history)
        report = loaded.fit_user(user)
        assert report.mode == "vector" and report.n_pairs >= 3
        cached = json.loads((user.dir / "negatives.json").read_text())
        keys = next(iter(cached.values()))
        assert history[0].id in keys  # plain prompt: keyed by the item id, as before
        assert (
            sum(key.startswith(history[1].id + ":") for key in keys) == 1
        )  # conditioned: id and prompt hash
    finally:
        loaded.close()


def test_a_refit_after_removing_the_oldest_item_generates_y_minus_only_for_prompts_that_showed_it(
    backbone: Backbone, tmp_path: Path
) -> None:
    """Counted by position, every later item changed its fit group: no cached y- matched (a 500-item refit took
    370 s instead of 21 s, scale audit). Counted by the items' ordinals, the others keep their prompts."""
    from localpers.users.history_prompt import PromptFormat

    conditioned = make_bundle(tmp_path / "b", backbone, prompt=PromptFormat(examples=2).to_manifest())
    loaded = Personalizer(open_bundle(conditioned, backbone_sha256=backbone.sha256), backbone)
    try:
        user = UserStore().create("trimmed")
        history = items(SHOUTY) + items(
            [(f"Item {n}: the council met about road {n}.", f"ROAD {n}, WOW!!!") for n in range(8)]
        )
        user.save_history(history)
        loaded.fit_user(user, choose=False)

        def keys() -> set[str]:
            return set(next(iter(json.loads((user.dir / "negatives.json").read_text()).values())))

        before = keys()
        user.save_history(history[1:])
        loaded.fit_user(user, choose=False)
        made_again = keys() - before
        assert len(made_again) <= len(history) // 2, (len(made_again), len(history))
    finally:
        loaded.close()


def test_a_global_base_bundle_corrects_the_global_adapter_and_takes_y_minus_from_it(
    backbone: Backbone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`head.base: global`: CARD decodes on the global adapter, and its fit (y-, features, choice) runs on it."""
    from localpers.users.history_prompt import PromptFormat

    prompt = PromptFormat(examples=2).to_manifest()
    bundle = make_bundle(tmp_path / "g", backbone, prompt=prompt, base="global")
    loaded = Personalizer(open_bundle(bundle, backbone_sha256=backbone.sha256), backbone)
    try:
        assert loaded.head_config.base == "global"
        assert loaded.adapter_for("card", 0) == loaded.adapter_for("card", 1) == "global"
        assert loaded.adapter_for("cluster", 1) == "cluster-1"  # the cluster baseline keeps its adapter
        user = UserStore().create("global-base")
        user.save_history(items(SHOUTY))
        used: list[str] = []
        switch = loaded.engine.set_adapter
        monkeypatch.setattr(loaded.engine, "set_adapter", lambda name: (used.append(name), switch(name))[1])
        report = loaded.fit_user(user)  # y-, pair features and the per-user choice
        assert report.mode == "vector" and user.state().get("choice") is not None
        assert set(used) == {"global"}  # no cluster adapter is ever switched to
        used.clear()
        result = loaded.rewrite(ARTICLE, method="card", cluster=report.cluster, max_tokens=4)
        assert result.adapter == "global" and used == ["global"]
    finally:
        loaded.close()
    # the same bundle published for the cluster base corrects the user's cluster adapter, as before
    clustered = make_bundle(tmp_path / "c", backbone, prompt=prompt)
    loaded = Personalizer(open_bundle(clustered, backbone_sha256=backbone.sha256), backbone)
    try:
        assert loaded.head_config.base == "cluster" and loaded.adapter_for("card", 1) == "cluster-1"
    finally:
        loaded.close()


def test_long_articles_in_the_history_and_the_text_are_read_from_their_start(
    backbone: Backbone, tmp_path: Path
) -> None:
    """One long article used to stop the whole fit ("text too long: ... exceed the context of 1024")."""
    from localpers.methods.card.method import fit_summary
    from localpers.tasks import get_task
    from localpers.users.history_prompt import PromptFormat

    bundle = make_bundle(
        tmp_path / "c", backbone, prompt=PromptFormat(examples=2).to_manifest(), base="global"
    )
    loaded = Personalizer(open_bundle(bundle, backbone_sha256=backbone.sha256), backbone)
    long_article = "The storm knocked out power across the region, officials said. " * 200  # ~3,000 tokens
    try:
        user = UserStore().create("long-articles")
        history = items(SHOUTY[:6])
        history.insert(
            3, HistoryItem.create("headline", long_article, "STORM CUTS POWER, WOW!!!", strict=True)
        )
        # emoji take several tokens each: 1,500 characters of them do not fit, so the fit reads fewer (as a
        # rewrite does; it left the item out, and a CJK user's every full article with it: text audit) ...
        emoji = HistoryItem.create("headline", "\U0001f389\u2728 " * 700, "PARTY TIME, YES!!!", strict=True)
        history.insert(5, emoji)
        # ... while a paraphrase must carry its whole text: one too dense for the context is left out
        dense = HistoryItem.create("paraphrase", "\ua66e" * 990, "PARTY!!!", strict=True)  # 3 tokens a letter
        history.insert(6, dense)
        user.save_history(history)
        report = loaded.fit_user(user)
        assert report.n_pairs >= 6 and report.n_too_long == 1
        assert "1 history item(s) left out: too long" in fit_summary("long-articles", report)
        index = user.history_index(get_task("headline"))
        result = loaded.rewrite(
            long_article, method="card", cluster=report.cluster, history=index, max_tokens=4
        )
        assert result.tokens > 0 and result.prompt_tokens < loaded.engine.n_ctx // 2
        assert result.text_chars_read == get_task("headline").max_input_chars
        # emoji take several tokens each: 1,500 of them would fill the context, so fewer are read
        dense = loaded.rewrite(
            "\U0001f389\u2728" * 1000, method="card", cluster=report.cluster, history=index
        )
        assert dense.text_chars_read is not None and dense.text_chars_read < 1000
        assert dense.prompt_tokens <= loaded.engine.n_ctx - get_task("headline").default_max_tokens
        with pytest.raises(LocalpersError, match="the paraphrase task takes at most"):
            loaded.rewrite(long_article, task="paraphrase", method="global", max_tokens=4)
    finally:
        loaded.close()
    command = ["rewrite", long_article, "--user", "long-articles", "--bundle", str(bundle)]
    command += ["--model", str(backbone.path), "--max-tokens", "4"]
    payload = json.loads(CliRunner().invoke(app, [*command, "--json"]).stdout)
    assert payload["text_chars_read"] == get_task("headline").max_input_chars
    shown = CliRunner().invoke(app, command)
    assert (
        shown.exit_code == 0
        and "note: the text has 12,599 characters; the headline task read its first 1,500" in shown.stderr
    )
    # as a terminal shows both streams: the streamed headline ends its line before the note (it was glued on)
    headline = shown.stdout.rstrip("\n")
    assert f"{headline}\nnote: the text has 12,599" in shown.output, shown.output


def test_a_bundle_missing_a_cluster_adapter_is_refused_before_the_model_loads(
    bundle_dir: Path, backbone: Backbone, tmp_path: Path
) -> None:
    from localpers.bundle.format import write_manifest

    copy = shutil.copytree(bundle_dir, tmp_path / "bundle")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.pop("files")
    manifest["clusters"]["k"] = 3
    write_manifest(copy, manifest)
    with pytest.raises(
        LocalpersError, match=r"'clusters.k' is 3, but 'adapters' has no cluster-2; copy the"
    ) as refused:
        Personalizer(open_bundle(copy, backbone_sha256=backbone.sha256), backbone)
    assert refused.value.exit_code == 2  # a directory given, never pulled: copied again, not "re-pull"


def test_a_kept_prefix_is_never_written_into_a_user_made_anew_or_while_their_folder_is_busy() -> None:
    """Like every write of a user's files, under their lock: a rewrite that began before the user was deleted
    and created again writes nothing into the new folder; a busy folder is skipped, not waited for."""
    from localpers.engine.prefix_files import PrefixStateFiles
    from localpers.tasks import get_task

    store = UserStore()
    old = store.create("anew")
    old.save_history(items(SHOUTY))
    index = old.history_index(get_task("headline"))
    files = PrefixStateFiles(index.user_dir, "engine", index.write_lock)
    import threading

    holding, done = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # another writer (an import, the TUI's accept) in the middle of its change
        with old.locked():
            holding.set()
            done.wait(10)

    other = threading.Thread(target=hold_the_lock)
    other.start()
    holding.wait(10)
    files.write(files.entry_for(None, 1.0, [1]), b"state")  # skipped at once, not waited for
    done.set()
    other.join()
    assert not list(old.dir.glob("prefix-*.kv"))
    store.delete("anew")
    store.create("anew")
    files.write(files.entry_for(None, 1.0, [1]), b"state")
    assert not list(store.get("anew").dir.glob("prefix-*.kv"))
    fresh = store.get("anew").history_index(get_task("headline"))
    kept = PrefixStateFiles(fresh.user_dir, "engine", fresh.write_lock)
    kept.write(kept.entry_for(None, 1.0, [1]), b"state")
    assert kept.read(kept.entry_for(None, 1.0, [1])) == b"state"


def test_a_history_change_removes_the_kept_blocks_and_a_block_read_before_it_is_never_kept() -> None:
    """`history remove` must not leave a removed item behind in another form: every change of the history
    removes the kept states, and a rewrite that read the history before the change writes none afterwards."""
    from localpers.engine.prefix_files import PrefixStateFiles
    from localpers.tasks import get_task

    user = UserStore().create("forgets")
    user.save_history(items(SHOUTY))
    index = user.history_index(get_task("headline"))
    files = PrefixStateFiles(index.user_dir, "engine", index.write_lock)
    files.write(files.entry_for(None, 1.0, [1]), b"state")
    assert len(list(user.dir.glob("prefix-*.kv"))) == 1
    user.save_history(items(SHOUTY[:-1]))  # the most recent item removed
    assert not list(user.dir.glob("prefix-*.kv"))
    files.write(files.entry_for(None, 1.0, [1]), b"state")  # read before the removal: not kept
    assert not list(user.dir.glob("prefix-*.kv"))
    fresh = user.history_index(get_task("headline"))
    kept = PrefixStateFiles(fresh.user_dir, "engine", fresh.write_lock)
    kept.write(kept.entry_for(None, 1.0, [2]), b"state")
    assert len(list(user.dir.glob("prefix-*.kv"))) == 1
