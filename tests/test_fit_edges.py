"""A CARD fit's edges found by the eighty-second session's audit of the fit and the per-user choice: one dense output
must not leave every item out, a stored output longer than the task writes is scored cut, an item cut to the
context keys its y- by its prompt, the same vector makes the same file, and the fit says why no choice was made."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest
from synthetic_bundle import make_bundle
from test_personalize import SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures

from localpers.bundle.format import open_bundle
from localpers.engine.backbone import Backbone
from localpers.methods.card import choice as choice_module
from localpers.methods.card.method import fit_summary, profile_for_rewrite
from localpers.methods.card.pair_keys import negative_key
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_fit import fit_report
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat
from localpers.users.store import UserStore
from localpers.users.vector_file import vector_file_bytes

INSTRUCTION = "Generate a headline for the following article: "
# 199 characters, 191 tokens: a headline of emoji the import allows (the headline task writes up to 300)
DENSE = (
    "Parks Win "
    + "\U0001f389\U0001f525\U0001f4af\U0001f680\u2728\U0001f602\U0001f64c\U0001f44f\U0001f3fd" * 21
)


@pytest.fixture(scope="module")
def conditioned(backbone: Backbone, tmp_path_factory: pytest.TempPathFactory) -> Personalizer:
    """A bundle whose adapters read 5 of the user's outputs, as the demo bundle's do."""
    directory = make_bundle(
        tmp_path_factory.mktemp("conditioned") / "bundle",
        backbone,
        prompt=PromptFormat(examples=5).to_manifest(),
        base="global",
    )
    loaded = Personalizer(open_bundle(directory, backbone_sha256=backbone.sha256), backbone)
    yield loaded
    loaded.close()


def dense_item(n: int) -> HistoryItem:
    return HistoryItem.create("headline", f"{INSTRUCTION}The park reopened, story {n}.", DENSE, strict=True)


def test_one_dense_output_leaves_no_item_out(conditioned: Personalizer) -> None:
    """Room for examples was the longest output times the examples shown: one headline of emoji (191 tokens)
    left no item room in the 1,024-token context, and the whole fit became a cold start."""
    assert len(conditioned.engine.tokenize(" " + DENSE, add_bos=False)) > 180
    history = [*items(SHOUTY), dense_item(0)]
    kept, too_long = conditioned.pairs.items_within_context(history)
    assert too_long == 0 and [item.id for item in kept] == [item.id for item in history]


def test_a_fit_that_could_use_no_item_says_so_in_the_rewrite_note(conditioned: Personalizer) -> None:
    """Six such outputs do fill the context: the rewrite's note said the user "was fitted before its history held
    anything", and `fit` then answered "already fitted"; the summary said rewrites used the global adapter."""
    user = UserStore().create("emoji")
    user.save_history([dense_item(n) for n in range(6)])
    report = conditioned.fit_user(user)
    assert report.mode == "cold-start" and report.n_too_long == 6
    assert "so rewrites get no CARD correction; shorten them" in fit_summary("emoji", report)
    profile = profile_for_rewrite(user, "card", conditioned, user.history_index(get_task("headline")))
    assert profile.note is not None and "fit could use none of its history items" in profile.note
    assert "before its history held anything" not in profile.note


def test_a_stored_output_longer_than_the_task_writes_is_scored_cut(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    """The choice scored a stored item's whole output (history from before the import check, an archive, a
    hand-edited file): 6,000 characters overflowed the context and stopped every fit ("text too long")."""
    user = UserStore().create("long-output")
    long = HistoryItem.create("headline", INSTRUCTION + "The fair opens today.", "FAIR OPENS, WOW!!! " * 320)
    history = [*items(SHOUTY), long]
    user.save_history(history)
    chosen = choice_module.choose_correction(
        personalizer, user, history, regularisation=1.0, prior_weight=0.0
    )
    assert chosen is not None


def test_an_item_cut_to_the_context_keys_its_y_minus_by_its_prompt() -> None:
    """A plain prompt's y- was cached under the bare item id, though how far the fit cuts an item's article depends
    on the other items: after a removal the longer prompt reused the shorter one's y-."""
    task = get_task("headline")
    item = HistoryItem.create("headline", INSTRUCTION + "word " * 300, "A HEADLINE")
    assert negative_key(item, task.prompt_for(item.input)) == item.id
    cut = replace(item, input=task.content(item.input)[:200])
    assert negative_key(cut, task.prompt_for(cut.input)) != item.id
    shorter = replace(item, input=task.content(item.input)[:100])
    assert negative_key(shorter, task.prompt_for(shorter.input)) != negative_key(
        cut, task.prompt_for(cut.input)
    )


def test_the_same_vector_makes_the_same_file() -> None:
    """safetensors wrote the metadata in an order that varied from call to call: each refit of an unchanged user
    named its vector file anew and changed state.json."""
    vector = np.linspace(-1, 1, 128, dtype=np.float32)
    meta = {"bundle_sha256": "a" * 64, "mode": "vector", "fitted_by": "localpers 0.1"}
    made = {hashlib.sha256(vector_file_bytes(vector, meta)).hexdigest() for _ in range(24)}
    assert len(made) == 1
    data = vector_file_bytes(vector, meta)
    from safetensors.numpy import load

    assert np.array_equal(load(data)["lambda"], vector) and (8 + int.from_bytes(data[:8], "little")) % 8 == 0


def test_the_fit_says_why_no_choice_was_made() -> None:
    """With 8 items or more the summary still said "too few items" when the earlier items' fit had too few usable
    pairs to compare on."""
    report = fit_report("f" * 64, "vector", 0, [0.5, 0.1], 12, 12, 0, None, {})
    report.train_accuracy = 1.0
    assert "earlier items gave too few usable pairs" in fit_summary("ann", report, None)
    report.n_items = 5
    assert "too few items to choose a correction" in fit_summary("ann", report, None)


def test_the_fit_summary_escapes_a_stored_fits_habits_and_choice() -> None:
    # `fit` prints the stored fit when nothing is new: an imported or edited state.json's words reached the terminal
    from localpers.methods.reports import FitReport

    report = FitReport(
        mode="vector",
        cluster=0,
        cluster_similarities=[1.0],
        n_items=20,
        n_pairs=20,
        n_identical_skipped=0,
        train_accuracy=1.0,
        heldout_accuracy=None,
        heldout_accuracy_default=None,
        n_heldout=0,
        regularisation=1.0,
        vector_norm=1.0,
        seconds={"fit": 0.1},
        bundle_sha256="0" * 64,
        habits=["\x1b]0;hijacked\x07opens with X", "ok\nerror: your disk is failing"],
    )
    shown = fit_summary("ann", report, {"label": "\x1b[2Jvector", "reason": "fine\nerror: fake"})
    assert "\x1b" not in shown and "\\x1b]0;hijacked\\x07opens with X" in shown
    assert not any(line.startswith("error:") for line in shown.splitlines())


def test_cached_pair_features_a_fit_could_not_have_computed_read_as_absent(tmp_path) -> None:  # noqa: ANN001
    """NaN differences made the fit store a zero vector without a word, exit 0 (audit85)."""
    from localpers.methods.card import pair_cache

    whole = {"a": (np.ones(4, np.float32), -1.5)}
    assert pair_cache.write_features(tmp_path, "k", 4, whole)
    assert list(pair_cache.read_features(tmp_path, "k", 4)) == ["a"]
    for damaged in (
        (np.full(4, np.nan, np.float32), -1.5),
        (np.ones(4, np.float32), np.nan),
        (np.ones(4), 3.0),
    ):
        pair_cache.write_features(tmp_path, "k", 4, {"a": damaged})
        assert pair_cache.read_features(tmp_path, "k", 4) == {}


def test_an_opening_habit_survives_a_first_token_far_below_any_probability() -> None:
    """exp(-800) is 0, and logit(0) raised "math domain error" for any user with an opening habit (audit85)."""
    from localpers.methods.card.token_bias import _opening_habits

    habits = _opening_habits([[7, 1], [7, 2], [7, 3], [7, 4]], [-800.0, float("-inf"), -900.0, -1000.0])
    assert 7 in habits and np.isfinite(habits[7])


def test_a_cached_y_minus_longer_than_any_generation_is_generated_again(personalizer: Personalizer) -> None:  # noqa: F811
    """A 3,000-word y- in negatives.json passed the batch's size test and the engine raised ValueError (audit85)."""
    import json

    user = UserStore().create("longminus")
    user.save_history(items(SHOUTY[:4]))
    personalizer.fit_user(user)
    cache = json.loads((user.dir / "negatives.json").read_text())
    for entries in cache.values():
        for entry in entries:
            entries[entry] = " ".join(["word"] * 3000)
    (user.dir / "negatives.json").write_text(json.dumps(cache))
    (user.dir / "pair_features.safetensors").unlink()
    report = personalizer.fit_user(user)
    assert report.n_pairs == 4 and report.mode == "vector"
    regenerated = json.loads((user.dir / "negatives.json").read_text())  # replaced, for the loop's path too
    assert all(len(text) < 1000 for entries in regenerated.values() for text in entries.values())
