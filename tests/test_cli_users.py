"""`localpers user ...` and `localpers history ...` through Typer's CliRunner: exit codes and --json."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.users.history import HistoryItem, demo_history_path, history_digest
from localpers.users.store import UserStore

runner = CliRunner()


def run(*args: str, input: str | None = None, code: int = 0):
    result = runner.invoke(app, list(args), input=input)
    assert result.exit_code == code, (result.stdout, result.stderr)
    return result


def run_json(*args: str) -> dict:
    return json.loads(run(*args, "--json").stdout)


def assert_one_line_error(result, fragment: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["user"],
        ["history"],
        *[["user", verb] for verb in ("create", "list", "use", "show", "delete", "export", "import")],
        *[["history", verb] for verb in ("import", "add", "list", "remove")],
    ],
)
def test_every_command_has_help(command: list[str]) -> None:
    result = run(*command, "--help")
    assert "Usage" in result.stdout


def test_no_active_user_is_a_one_line_error() -> None:
    result = run("history", "list", code=1)
    assert_one_line_error(result, "no active user: run `localpers user create NAME`")


def test_user_lifecycle() -> None:
    assert run_json("user", "create", "ann") == {
        "ok": True,
        "name": "ann",
        "dir": str(UserStore().get("ann").dir),
        "active": True,
    }
    run("user", "create", "bob")  # a new user becomes active by default
    assert run_json("user", "list") == {
        "ok": True,
        "users": [{"name": "ann", "active": False}, {"name": "bob", "active": True}],
        "active": "bob",
    }
    run("user", "create", "cy", "--no-use")
    assert "* bob" in run("user", "list").stdout
    run("user", "use", "ann")
    shown = run_json("user", "show")
    assert (
        shown["name"] == "ann" and shown["active"] and shown["vector"] is None and shown["history_items"] == 0
    )
    assert_one_line_error(run("user", "create", "ann", code=1), "already exists")
    assert_one_line_error(run("user", "use", "nobody", code=1), "no user named 'nobody'")
    assert_one_line_error(run("user", "create", "Bad Name", code=2), "invalid user name")


def test_delete_asks_first() -> None:
    run("user", "create", "ann")
    refused = run("user", "delete", "ann", input="n\n", code=1)
    assert "Delete user 'ann'" in refused.stdout and UserStore().list() == ["ann"]
    run("user", "delete", "ann", input="y\n")
    assert UserStore().list() == []
    run("user", "create", "bob")
    UserStore().get("bob").history_path.write_text("{damaged")
    run("user", "delete", "bob", input="y\n")  # a damaged user can still be deleted
    run("user", "create", "cy")
    run("user", "delete", "cy", "--yes")
    assert run_json("user", "list") == {"ok": True, "users": [], "active": None}


def test_a_ctrl_c_at_the_delete_question_is_an_interrupt_and_an_ended_input_a_no(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Click turned a Ctrl-C at the question into "Aborted." and exit 1; README promises `interrupted`, 130."""
    import typer

    run("user", "create", "ann")
    real_confirm = typer.confirm

    def stopped(
        *args: object, **kwargs: object
    ) -> bool:  # what click.confirm does with a Ctrl-C at its prompt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise typer.Abort() from None

    monkeypatch.setattr(typer, "confirm", stopped)
    interrupted = run("user", "delete", "ann", code=130)
    assert "interrupted" in interrupted.stderr and UserStore().list() == ["ann"]
    monkeypatch.setattr(typer, "confirm", real_confirm)
    ended = run("user", "delete", "ann", input="", code=1)
    assert "user 'ann' was not deleted" in ended.stderr and UserStore().list() == ["ann"]


def test_history_import_add_list_remove(tmp_path: Path) -> None:
    run("user", "create", "ann")
    demo = str(demo_history_path())
    first = run_json("history", "import", demo)
    assert first["added"] == 24 and first["total"] == 24
    again = run_json("history", "import", demo)
    assert again["added"] == 0 and len(again["already_in_history"]) == 24

    added = run_json(
        "history", "add", "--input", "A cat won a prize.", "--output", "Purr-fect: Cat Wins, Here's Why"
    )
    assert added["added"] is True and added["total"] == 25
    duplicate = run(
        "history", "add", "--input", "A cat won a prize.", "--output", "Purr-fect: Cat Wins, Here's Why"
    )
    assert "nothing added" in duplicate.stderr

    listed = run_json("history", "list")
    assert len(listed["items"]) == 25 and listed["items"][-1]["id"] == added["item"]["id"]
    assert added["item"]["output"] in run("history", "list").stdout

    run("history", "remove", added["item"]["id"][:6])
    assert len(run_json("history", "list")["items"]) == 24
    assert_one_line_error(run("history", "remove", "zzzzzz", code=1), "no history item 'zzzzzz'")


def test_history_import_errors_and_duplicates(tmp_path: Path) -> None:
    run("user", "create", "ann")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "a", "output": "A"}\n{"input": "b"}\n')
    assert_one_line_error(
        run("history", "import", str(bad), code=2), "bad.jsonl line 2: missing field 'output'"
    )
    assert run_json("history", "list")["items"] == []  # nothing was imported

    dupes = tmp_path / "dupes.jsonl"
    dupes.write_text('{"input": "a", "output": "A"}\n\n{"input": "a", "output": "A"}\n')
    result = run("history", "import", str(dupes))
    assert "skipped line 3: same text as line 1" in result.stderr
    assert "imported 1 item into user 'ann' (1 duplicate skipped);" in result.stdout  # was "1 duplicates"

    archive = tmp_path / "archive.jsonl"
    archive.write_text("".join(f'{{"input": "article {k}", "output": "Headline {k}"}}\n' for k in range(503)))
    assert_one_line_error(run("history", "import", str(archive), code=2), "--keep-latest 500")
    # the user has 1 item: the latest 500 would make 501, the latest 499 fit
    too_many = run("history", "import", str(archive), "--keep-latest", "500", code=2)
    assert_one_line_error(too_many, "user 'ann' would have 501")
    assert (
        "make room with `localpers history remove --oldest 1 --user ann`, or import the file's latest with"
        " `--keep-latest 499`" in (too_many.stderr)
    )
    kept = run("history", "import", str(archive), "--keep-latest", "499")
    assert "left out the file's 4 items before its latest 499" in kept.stderr
    listed = run_json("history", "list")["items"]
    assert (
        len(listed) == 500 and listed[1]["output"] == "Headline 4" and listed[-1]["output"] == "Headline 502"
    )
    one_more = run("history", "add", "-i", "x", "-o", "Y", code=2)
    assert_one_line_error(one_more, "make room with `localpers history remove --oldest 1 --user ann`")
    # a full history makes room for newer items without 500 removals by id (scale audit)
    trimmed = run("history", "remove", "--oldest", "3")
    assert "removed the oldest 3 items from user 'ann'" in trimmed.stdout
    listed = run_json("history", "list")["items"]
    assert (
        len(listed) == 497 and listed[0]["output"] == "Headline 6" and listed[-1]["output"] == "Headline 502"
    )
    run("history", "add", "-i", "x", "-o", "Y")
    assert_one_line_error(run("history", "remove", code=2), "give an item ID or --oldest N")
    assert_one_line_error(run("history", "remove", listed[0]["id"], "--oldest", "1", code=2), "not both")


def test_history_import_per_user_file_needs_user_id(tmp_path: Path) -> None:
    run("user", "create", "ann")
    path = tmp_path / "users.jsonl"
    rows = [
        {"user_id": uid, "history": [{"input": f"{uid} news", "output": f"{uid} Headline"}]}
        for uid in ("u1", "u2")
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_one_line_error(run("history", "import", str(path), code=2), "choose one with --user-id")
    assert run_json("history", "import", str(path), "--user-id", "u2")["added"] == 1


def test_history_of_another_user_and_empty_add_is_refused() -> None:
    run("user", "create", "ann")
    run("user", "create", "bob")
    run("history", "add", "--user", "ann", "-i", "x", "-o", "Y")
    assert len(run_json("history", "list", "--user", "ann")["items"]) == 1
    assert run_json("history", "list")["items"] == []  # bob, the active user, is untouched
    assert_one_line_error(run("history", "add", "-i", "x", "-o", "  ", code=2), "field 'output' is empty")


def test_export_and_import_commands(tmp_path: Path) -> None:
    run("user", "create", "ann")
    run("history", "add", "-i", "x", "-o", "Private Words")
    UserStore().get("ann").save_fit(np.ones(4, np.float32), {"cluster": 7})
    exported = run_json("user", "export", "-o", str(tmp_path))
    archive = Path(exported["archive"])
    assert archive.is_file() and exported["with_history"] is False
    assert_one_line_error(run("user", "export", "-o", str(archive), code=1), "already exists")
    run("user", "export", "-o", str(archive), "--with-history", "--force")

    imported = run_json("user", "import", str(archive), "--as", "ann2")
    assert imported["name"] == "ann2" and imported["active"] is False
    shown = run_json("user", "show", "ann2")
    assert shown["cluster"] == 7 and shown["vector"]["dim"] == 4 and shown["history_items"] == 1
    assert_one_line_error(run("user", "import", str(archive), code=1), "already exists")


def test_export_to_a_name_ending_in_a_slash_needs_that_folder(tmp_path: Path) -> None:
    """`user export -o backups/` wrote a zip file named `backups` (Typer's Path drops the slash; device audit)."""
    run("user", "create", "ann")
    missing = tmp_path / "backups"
    assert_one_line_error(
        run("user", "export", "-o", f"{missing}/", code=2),
        f"--output {missing}/: no such folder; create it first",
    )
    assert not missing.exists()
    missing.mkdir()
    exported = run_json("user", "export", "-o", f"{missing}/")
    assert Path(exported["archive"]).parent == missing and Path(exported["archive"]).is_file()


def test_export_says_which_fits_it_leaves_out(tmp_path: Path) -> None:
    """CoPe's LoRA and EXACT's index are not archived; the export said nothing, and after an import or a delete
    they were gone (upgrade audit)."""
    run("user", "create", "ann")
    assert run_json("user", "export", "-o", str(tmp_path / "a.zip"))["not_exported"] == []
    folder = UserStore().get("ann").dir
    (folder / "cope.json").write_text(json.dumps({"rank": 8, "n_items": 20}), encoding="utf-8")
    (folder / "exact-index.safetensors").write_bytes(b"x")
    shown = run("user", "export", "-o", str(tmp_path / "b.zip")).stdout
    assert (
        "not exported: CoPe's LoRA and EXACT's index; after importing, refit with `localpers fit --method cope"
        " --user ann` and `localpers fit --method exact --user ann`" in shown
    )
    assert run_json("user", "export", "-o", str(tmp_path / "c.zip"))["not_exported"] == ["cope", "exact"]


def test_an_export_without_history_says_when_a_fit_after_the_import_would_not_keep_its_fit(
    tmp_path: Path,
) -> None:
    """An export without the history carries a fit that `fit` keeps after the import only when it is a fit of the
    history as it is; of items removed or added since, a fit there has nothing to fit and replaces it with the
    global adapter's, and the export did not say so (seventy-ninth session's final read)."""
    run("user", "create", "ann")
    user = UserStore().get("ann")
    items = [HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(3)]
    user.save_history(items)
    assert run_json("user", "export", "-o", str(tmp_path / "none.zip"))["fit_kept_on_refit"] is None  # no fit
    fit = {"mode": "vector", "n_items": 3, "history_sha256": history_digest(items)}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": fit})
    assert run_json("user", "export", "-o", str(tmp_path / "a.zip"))["fit_kept_on_refit"] is True
    assert (
        "is not of the history as it is now"
        not in run("user", "export", "-o", str(tmp_path / "b.zip")).stdout
    )
    user.save_history(items[:2])  # an item removed since the fit
    shown = run("user", "export", "-o", str(tmp_path / "c.zip")).stdout
    assert (
        "the fit is not of the history as it is now (items were added or removed since it was made): on the other"
        " device rewrites use it, but `localpers fit` there has no items to fit and replaces it with the global"
        " adapter's; `localpers fit --user ann` here first and export again, or export --with-history"
        in shown
    )
    assert run_json("user", "export", "-o", str(tmp_path / "d.zip"))["fit_kept_on_refit"] is False
    exported = run_json("user", "export", "--with-history", "-o", str(tmp_path / "e.zip"))
    assert exported["fit_kept_on_refit"] is None  # the history goes along: a fit there fits it


def test_an_export_without_history_says_so_and_the_import_says_what_to_add(tmp_path: Path) -> None:
    """An import without the history kept the fit, and rewrites lost their examples with nothing said; `user
    show` advised a refit of no history (README walkthrough)."""
    run("user", "create", "ann")
    run("history", "add", "-i", "x", "-o", "Private Words")
    digest = history_digest(UserStore().get("ann").history())  # a fit of the history as it is
    UserStore().get("ann").save_fit(
        np.ones(4, np.float32),
        {"cluster": 1, "fit": {"mode": "vector", "n_items": 1, "history_sha256": digest}},
    )
    shown = run("user", "export", "-o", str(tmp_path / "a.zip")).stdout
    assert "not exported: the history (1 item)" in shown and "--with-history includes it" in shown
    assert (
        "not exported: the history"
        not in run("user", "export", "-o", str(tmp_path / "b.zip"), "--with-history").stdout
    )
    UserStore().get("ann").history_path.write_text(
        "not json\n"
    )  # a damaged history: the export needs none of it
    run("user", "export", "-o", str(tmp_path / "c.zip"))
    run("user", "import", str(tmp_path / "a.zip"), "--as", "ann2")
    fitted = next(
        line for line in run("user", "show", "ann2").stdout.splitlines() if line.startswith("fitted")
    )
    assert (
        "on 1 item, but the history holds none now (add it: `localpers history import FILE --user ann2`"
        in fitted
    )
    assert "refits" not in fitted


def test_history_changes_name_the_user_to_refit() -> None:
    """A bare `localpers fit` fits the active user, not the one whose history changed."""
    run("user", "create", "ann")
    run("user", "create", "bob")
    run("user", "use", "ann")
    added = run("history", "add", "--user", "bob", "-i", "x", "-o", "Words").stdout
    assert "run `localpers fit --user bob` to refit" in added
    item = run_json("history", "list", "--user", "bob")["items"][0]["id"]
    removed = run("history", "remove", item, "--user", "bob").stdout
    assert "rewrites no longer show what was removed; run `localpers fit --user bob`" in removed
    assert "`localpers history import FILE --user bob`" in run("history", "list", "--user", "bob").stderr


def test_damaged_vector_gives_one_line_error_in_show() -> None:
    run("user", "create", "ann")
    user = UserStore().get("ann")
    user.save_fit(np.ones(4, np.float32), {"cluster": 1})
    user.vector_path().write_bytes(b"garbage")
    result = run("user", "show", code=2)  # a damaged file exits 2 (tests/test_damage_exit_codes.py)
    assert_one_line_error(result, "run `localpers fit --user ann` again")


def test_show_says_whether_the_fit_saw_the_history_as_it_is_now() -> None:
    run("user", "create", "ann")
    assert "fitted      no (no history yet)" in run("user", "show").stdout
    user = UserStore().get("ann")
    user.save_history([HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(3)])
    assert "until `localpers fit --user ann`" in run("user", "show").stdout
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": {"mode": "vector", "n_items": 2}})
    assert (
        "on 2 items; the history holds 3 now (`localpers fit --user ann` refits)"
        in run("user", "show").stdout
    )
    # a fit by an earlier localpers recorded no digest: the same count may hide removed and added items
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": {"mode": "vector", "n_items": 3}})
    shown = run("user", "show").stdout
    assert "on 3 items, as many as the history holds (an earlier localpers did not record which" in shown
    assert "the history holds)" not in shown


def test_show_compares_the_fitted_items_not_only_their_number() -> None:
    """An item removed and another added kept the count, and show said the fit was on the history it holds."""
    from localpers.users.history import history_digest

    run("user", "create", "ann")
    user = UserStore().get("ann")
    items = [HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(3)]
    user.save_history(items)
    fit = {"mode": "vector", "n_items": 3, "history_sha256": history_digest(items)}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": fit})
    assert "fitted      on the 3 items the history holds" in run("user", "show").stdout
    user.save_history([*items[:2], HistoryItem.create("headline", "Article 9.", "Headline 9")])
    shown = run("user", "show").stdout
    assert (
        "fitted      on 3 items, but the history has changed since (it holds 3 now; `localpers fit --user ann`"
        " refits)" in shown
    )
    limited = {"mode": "vector", "n_items": 2, "history_sha256": history_digest(user.history())}
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": limited})  # a fit with --history-limit 2
    assert "on 2 of the 3 items the history holds (unchanged since the fit)" in run("user", "show").stdout


def test_fit_records_the_digest_of_the_history_it_was_made_from() -> None:
    from localpers.methods.card import user_fit
    from localpers.users.history import history_digest

    user = UserStore().create("ann")
    items = [HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(2)]
    user.save_history(items)

    class NoPairsFit:  # every item too long: the cold-start path, which needs no model
        bundle_sha256 = "b" * 64

        class pairs:
            @staticmethod
            def items_within_context(given: list[HistoryItem]) -> tuple[list[HistoryItem], int]:
                return [], len(given)

    report = user_fit.fit_user(NoPairsFit(), user)  # type: ignore[arg-type]
    assert report.history_sha256 == history_digest(items) == user.state()["fit"]["history_sha256"]


def test_show_summarises_the_fit_instead_of_printing_its_tables() -> None:
    run("user", "create", "ann")
    state = {
        "cluster": 1,
        "bundle_sha256": "ab" * 32,
        "fit": {
            "mode": "vector",
            "n_items": 0,
            "n_pairs": 12,
            "heldout_accuracy": 0.75,
            "n_heldout": 4,
            "heldout_accuracy_default": 0.5,
            "habits": ["opens with 'Opinion' (+9.1 nats over the model)"],
            "seconds": {"negatives": 2.5, "choice": 1.0},
        },
        "choice": {"label": "bias x0.1", "reason": "it scored best", "scores": {"adapter": -3.1}},
        "token_bias": {"first": [[562, 0.693], [756, -0.693]], "rest": [[500, -0.694]] * 300, "opening": []},
        "extra_key": list(range(200)),
    }
    UserStore().get("ann").save_fit(np.ones(4, np.float32), state)
    shown = run("user", "show").stdout
    assert (
        "fit         vector; 12 pairs, held-out pair accuracy 0.75 on 4 (cluster default 0.50); 3.5 s"
        in shown
    )
    assert "correction  bias x0.1: it scored best" in shown
    assert "habits      opens with 'Opinion' (+9.1 nats over the model)" in shown
    assert "token bias  2 first-word, 300 later-word tokens" in shown
    # a fit made with another bundle (before an upgrade or a pull) says so, with the refit that mends it
    assert f"bundle      sha256 {'ab' * 8}, not the bundle in use (" in shown
    assert "without CARD's correction until `localpers fit --user ann`" in shown
    assert "[562" not in shown and "-3.1" not in shown  # no token ids, no candidate scores
    extra = next(line for line in shown.splitlines() if line.startswith("extra_key"))
    assert len(extra) < 120 and extra.endswith("…")
    assert run_json("user", "show")["state"]["token_bias"]["rest"][0] == [500, -0.694]  # --json keeps it all


def test_show_says_a_fit_made_with_the_bundle_in_use_is_current() -> None:
    from localpers.bundle.format import default_bundle_dir, sha256_of_file

    run("user", "create", "ann")
    in_use = sha256_of_file(default_bundle_dir() / "manifest.json")
    UserStore().get("ann").save_fit(np.ones(4, np.float32), {"cluster": 1, "bundle_sha256": in_use})
    assert f"bundle      sha256 {in_use[:16]} (the bundle in use)" in run("user", "show").stdout


def test_show_names_cope_and_exact_fits_and_a_damaged_cope_state() -> None:
    run("user", "create", "ann")
    folder = UserStore().get("ann").dir
    assert "\ncope " not in run("user", "show").stdout
    (folder / "cope.json").write_text(json.dumps({"rank": 8, "n_items": 20}), encoding="utf-8")
    (folder / "exact-index.safetensors").write_bytes(b"x")
    shown = run("user", "show").stdout
    assert "cope        LoRA rank 8 fitted on 20 items" in shown
    assert "exact       " in shown and "exact-index.safetensors is damaged" in shown  # b"x" is no index
    assert set(run_json("user", "show")["other_fits"]) == {"cope", "exact"}
    (folder / "cope.json").write_text("{not json", encoding="utf-8")
    assert (
        "cope        cope.json is damaged; run `localpers fit --method cope --user ann`"
        in run("user", "show").stdout
    )


def test_show_names_a_cluster_rewrites_refuse() -> None:
    """A cluster stored as text ('2') was shown as cluster 2, while every rewrite refused the fit (hand-edit audit)."""
    run("user", "create", "ann")
    UserStore().get("ann").save_fit(np.ones(4, np.float32), {"cluster": "2", "fit": {"mode": "vector"}})
    assert (
        "cluster     '2', not a cluster number (state.json is damaged): rewrites refuse this fit; run"
        " `localpers fit --user ann`" in run("user", "show").stdout
    )


def test_show_names_a_token_bias_rewrites_refuse() -> None:
    """doctor sends a user whose rewrites are refused to `user show`, which printed a damaged bias as 'no tokens'."""
    run("user", "create", "ann")
    fit = {"cluster": 1, "fit": {"mode": "vector"}, "token_bias": {"first": "x"}}
    UserStore().get("ann").save_fit(np.ones(4, np.float32), fit)
    assert (
        "token bias  damaged (token bias field 'first' must be a list of [token, bias]): rewrites refuse this fit;"
        " run `localpers fit --user ann`" in run("user", "show").stdout
    )


def test_show_says_when_the_exact_index_is_one_rewrites_refuse() -> None:
    from localpers.bundle.format import default_bundle_dir, sha256_of_file
    from localpers.methods.exact_index import ExactIndex, index_path
    from localpers.methods.stored_files import fit_mark

    run("user", "create", "ann")
    user = UserStore().get("ann")
    in_use = sha256_of_file(default_bundle_dir() / "manifest.json")
    for meta, due in (
        ({"bundle_sha256": in_use, "fitted_by": fit_mark()}, ""),
        ({"bundle_sha256": "0" * 64}, "; made with another bundle than the one in use: refit due, run"),
        ({"bundle_sha256": in_use, "fitted_by": "localpers 0.1.0, fit format 9"}, "; made by a localpers of"),
    ):
        ExactIndex([], np.zeros((0, 384), np.float32), meta).save(index_path(user))
        line = next(line for line in run("user", "show").stdout.splitlines() if line.startswith("exact "))
        assert line.startswith("exact       attribute index stored (`localpers profile` shows it)" + due), (
            line
        )


def test_show_says_when_the_cope_fit_is_one_rewrites_refuse() -> None:
    """`rewrite --method cope` refuses a CoPe fit of another bundle or fit format; `user show` listed it as any."""
    from localpers.bundle.format import default_bundle_dir, sha256_of_file
    from localpers.methods.stored_files import fit_mark

    run("user", "create", "ann")
    cope_state = UserStore().get("ann").dir / "cope.json"
    in_use = sha256_of_file(default_bundle_dir() / "manifest.json")
    current = {"rank": 8, "n_items": 20, "bundle_sha256": in_use, "fitted_by": fit_mark()}
    for fields, due in (
        ({}, None),
        ({"fitted_by": "localpers 0.1.0, fit format 9"}, "made by a localpers of another fit format"),
        ({"bundle_sha256": "0" * 64}, "made with another bundle than the one in use"),
    ):
        cope_state.write_text(json.dumps({**current, **fields}), encoding="utf-8")
        line = next(line for line in run("user", "show").stdout.splitlines() if line.startswith("cope "))
        if due is None:
            assert line == "cope        LoRA rank 8 fitted on 20 items", line
        else:
            assert line.endswith(f"; {due}: refit due, run `localpers fit --method cope --user ann`"), line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["user", "create", "a b"], "invalid user name 'a b'"),
        (["user", "create", "../x"], "invalid user name '../x'"),
        (["user", "create", ""], "invalid user name ''"),
        (["user", "create", "a" * 33], "invalid user name"),
        (["user", "use", "A"], "invalid user name 'A'"),
        (["history", "add", "-t", "poem", "-i", "x", "-o", "y"], "unknown task 'poem'"),
        (["history", "add", "-i", "Article \udcff bytes", "-o", "Head"], "--input is not UTF-8 (byte 8"),
        (["history", "add", "-i", "Article", "-o", "H\udce9ad"], "--output is not UTF-8 (byte 1"),
    ],
)
def test_bad_arguments_exit_with_code_2(args: list[str], fragment: str) -> None:
    """The README's rule: a malformed argument exits 2 (these exited 1, while `history import -t poem` exited 2)."""
    run("user", "create", "ann")
    assert_one_line_error(run(*args, code=2), fragment)


def test_importing_a_user_under_a_bad_name_exits_with_code_2(tmp_path: Path) -> None:
    run("user", "create", "ann")
    archive = Path(run_json("user", "export", "-o", str(tmp_path))["archive"])
    assert_one_line_error(run("user", "import", str(archive), "--as", "../evil", code=2), "invalid user name")


def test_a_lone_surrogate_escape_in_a_history_file_names_the_line_and_the_field(tmp_path: Path) -> None:
    """It was the raw codec text: "'utf-8' codec can't encode character '\\ud800' ... surrogates not allowed"."""
    run("user", "create", "ann")
    file = tmp_path / "h.jsonl"
    file.write_text(
        '{"input": "An article.", "output": "Fine"}\n{"input": "Caf\\ud800 news", "output": "X"}\n'
    )
    result = run("history", "import", str(file), code=2)
    assert_one_line_error(result, "line 2: field 'input' is not Unicode text (a lone surrogate \\ud800")
    assert "save the text as UTF-8" in result.stderr and "codec" not in result.stderr


def test_without_an_active_user_the_error_names_the_users_there_are(localpers_home: Path) -> None:
    """It said "run `localpers user create NAME`" although users existed (the active one was deleted)."""
    run("user", "create", "a")
    run("user", "create", "b")
    run("user", "delete", "b", "-y")
    expected = "no active user; choose one with `localpers user use NAME` (users: a)"
    assert_one_line_error(run("history", "list", code=1), expected)
    (localpers_home / "data" / "active.json").write_text('{"user": "gone"}\n')
    assert_one_line_error(run("user", "show", code=1), expected)


def test_a_damaged_active_pointer_does_not_hide_the_users(localpers_home: Path) -> None:
    run("user", "create", "a")
    run("user", "create", "b")
    (localpers_home / "data" / "active.json").write_text("{not json")
    listed = run("user", "list")
    assert listed.stdout.splitlines() == ["  a", "  b"]
    assert listed.stderr.startswith("note: no user is marked active:") and "active.json" in listed.stderr
    as_json = run_json("user", "list")
    assert as_json["active"] is None and [u["name"] for u in as_json["users"]] == ["a", "b"]
    assert "active.json is damaged" in as_json["note"]


def test_text_of_control_characters_only_counts_as_empty() -> None:
    result = runner.invoke(app, ["rewrite", "-"], input="\x00\x01\x1b\n")
    assert result.exit_code == 2 and result.stderr.startswith("error: standard input was empty"), (
        result.output
    )
    argument = runner.invoke(app, ["generate", "\x07\x00 "])
    assert argument.exit_code == 2 and argument.stderr.startswith("error: the text is empty"), argument.output


def test_localpers_home_that_is_a_file_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "error: Not a directory (/tmp/x/data)"."""
    home = tmp_path / "a-file"
    home.write_text("")
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    result = run("user", "list", code=1)
    assert_one_line_error(result, f"LOCALPERS_HOME={home} cannot hold localpers' folders (")
    assert "point it at a folder you can write in, or unset it" in result.stderr


def test_refit_hints_keep_the_user_inside_the_command(tmp_path: Path) -> None:
    """ "run `localpers fit --method cope` --user demo" had the backtick before --user."""
    from localpers.errors import LocalpersError
    from localpers.methods.cope import load_state
    from localpers.methods.exact_index import ExactIndex

    user = UserStore().create("demo")
    with pytest.raises(LocalpersError, match=r"run `localpers fit --method cope --user demo`$"):
        load_state(user)
    with pytest.raises(LocalpersError, match=r"run `localpers fit --method exact --user demo`$"):
        ExactIndex.load(tmp_path / "none.safetensors", "demo")


def test_history_can_come_from_standard_input_so_private_text_stays_out_of_argv_and_files() -> None:
    """`ps` shows every account a command's arguments (privacy audit): a pipe keeps the text out of them."""
    run("user", "create", "piper")
    lines = '{"input": "A park opens downtown.", "output": "Green Days"}\n{"input": "Rates rise.", "output": "Up"}\n'
    imported = run("history", "import", "-", "--json", input=lines)
    assert json.loads(imported.stdout)["added"] == 2
    assert [item.source for item in UserStore().get("piper").history()] == [
        "standard input:1",
        "standard input:2",
    ]
    assert_one_line_error(run("history", "import", "-", input="not json\n", code=2), "standard input line 1")
    run("history", "add", "-i", "-", "-o", "Bread Winner", input="A bakery halves its prices.\n")
    run("history", "add", "-i", "A storm cuts power.", "-o", "-", input="Lights Out\n")
    added = {(item.input, item.output) for item in UserStore().get("piper").history()}
    assert {("A bakery halves its prices.", "Bread Winner"), ("A storm cuts power.", "Lights Out")} <= added
    both = run("history", "add", "-i", "-", "-o", "-", input="text\n", code=2)
    assert_one_line_error(both, "only one of --input and --output can be -")


def test_user_show_says_how_many_rejected_outputs_are_kept_and_how_to_forget_them() -> None:
    """The TUI keeps each rejected output with its input, and nothing said so outside the TUI (privacy audit)."""
    from localpers.tui.userdata import reject_output

    run("user", "create", "rex")
    assert "rejected" not in run("user", "show", "rex").stdout
    assert run_json("user", "show", "rex")["rejected_outputs"] == 0
    user = UserStore().get("rex")
    for n in range(2):
        reject_output(
            user,
            task="headline",
            input_text=f"article {n}",
            output=f"headline {n}",
            method="card",
            strength=1.0,
            top_k=20,
        )
    shown = run("user", "show", "rex").stdout
    assert "rejected    2 outputs turned down in the TUI" in shown and "negatives_user.jsonl" in shown
    assert run_json("user", "show", "rex")["rejected_outputs"] == 2


def test_a_reimported_archive_names_20_skipped_items_and_counts_the_rest(tmp_path: Path) -> None:
    """Re-importing a 500-item archive printed 500 'skipped' lines (scale audit); --json still lists every one."""
    run("user", "create", "arc")
    archive = tmp_path / "archive.jsonl"
    archive.write_text("".join(f'{{"input": "article {k}", "output": "Headline {k}"}}\n' for k in range(30)))
    run("history", "import", str(archive))
    again = run("history", "import", str(archive))
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 21 and lines[-1] == "... and 10 more skipped (`--json` lists them all)"
    assert len(run_json("history", "import", str(archive))["already_in_history"]) == 30
    listed = run("history", "list", "--last", "2").stdout
    assert "Headline 29" in listed and "Headline 28" in listed and "Headline 27" not in listed
    assert [item["output"] for item in run_json("history", "list", "--last", "1")["items"]] == ["Headline 29"]


def test_a_history_over_the_limit_can_be_reduced(tmp_path: Path) -> None:
    """A history made longer than 500 by hand was used everywhere but every removal was refused (scale audit)."""
    from localpers.users.history import MAX_HISTORY_ITEMS, serialize_history

    user = UserStore().create("big")
    items = [
        HistoryItem.create("headline", f"article {n}", f"Headline {n}") for n in range(MAX_HISTORY_ITEMS + 3)
    ]
    user.history_path.write_text(serialize_history(items), encoding="utf-8")
    run("history", "remove", items[-1].id, "--user", "big")
    run("history", "remove", "--oldest", "1", "--user", "big")
    assert len(user.history()) == MAX_HISTORY_ITEMS + 1
    run("history", "remove", "--oldest", "1", "--user", "big")
    assert len(user.history()) == MAX_HISTORY_ITEMS
    too_many = run("history", "add", "-i", "x", "-o", "Y", "--user", "big", code=2)
    assert_one_line_error(too_many, "make room with")


def test_user_show_prints_the_state_files_dates_escaped() -> None:
    user = UserStore().create("ann")
    state = json.loads(user.state_path.read_text())
    state["created_at"] = (
        "\x1b]0;retitled\x07\x1b[2J2025-01-01"  # an imported archive's state.json, unchecked
    )
    state["note"] = "\x9b2J"  # a C1 control (CSI), which json.dumps keeps
    user.state_path.write_text(json.dumps(state))
    shown = runner.invoke(app, ["user", "show", "ann"])
    assert shown.exit_code == 0, shown.output
    assert (
        "\x1b" not in shown.stdout and "\x9b" not in shown.stdout and "\\x1b]0;retitled\\x07" in shown.stdout
    )


@pytest.mark.parametrize(
    "args",
    [
        ["history", "list"],
        ["user", "show", "nobody"],
        ["history", "import", "/no/such/file.jsonl"],
        ["profile"],
    ],
)
def test_a_refused_command_given_json_prints_its_verdict_as_json(args: list[str]) -> None:
    # stdout stayed empty, which no script can parse as JSON (only `bundle info`/`verify` printed a verdict)
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code in (1, 2), result.output
    error = result.stderr.strip().removeprefix("error: ")
    assert json.loads(result.stdout) == {"ok": False, "error": error}


def test_user_show_escapes_the_fit_choice_and_habits_of_an_imported_state() -> None:
    # these fields reached the terminal raw: a retitled window, a cleared screen, a fake `error:` line
    user = UserStore().create("ann")
    state = json.loads(user.state_path.read_text())
    state["fit"] = {"mode": "\x1b]0;hijacked\x07vector", "habits": ["\x1b[5mblink\x1b[0m"]}
    state["choice"] = {"label": "\x1b[2Jvector", "reason": "ok\nerror: your disk is failing"}
    user.state_path.write_text(json.dumps(state))
    shown = runner.invoke(app, ["user", "show", "ann"], color=True)  # color: click strips nothing
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.stdout and "\\x1b]0;hijacked\\x07vector" in shown.stdout
    assert not any(line.startswith("error:") for line in shown.stdout.splitlines())


def test_history_import_escapes_the_user_id_it_names_in_a_skipped_line(tmp_path: Path) -> None:
    UserStore().create("ann")
    item = {"input": "Some article text", "output": "A headline"}
    source = tmp_path / "h.jsonl"
    source.write_text(json.dumps({"user_id": "u1\x1b[2J\nerror: fake", "history": [item, item]}) + "\n")
    result = runner.invoke(app, ["history", "import", str(source)], color=True)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stderr and "skipped" in result.stderr
    assert not any(line.startswith("error:") for line in result.stderr.splitlines())


def test_a_blank_localpers_home_is_unset_and_a_relative_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blank value made a folder named " " in the current directory; a relative one named another folder
    in each directory a command ran from."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LOCALPERS_HOME", " ")
    run("user", "list")
    assert not (tmp_path / " ").exists() and (tmp_path / "xdg" / "localpers").is_dir()
    monkeypatch.setenv("LOCALPERS_HOME", "rel home")
    result = run("user", "list", code=2)
    assert_one_line_error(result, "LOCALPERS_HOME=rel home is a relative path")
    assert f"give an absolute one (e.g. {tmp_path / 'rel home'})" in result.stderr
    assert not (tmp_path / "rel home").exists()


def test_paths_given_with_a_tilde_the_shell_left_are_read_from_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--output=~/x.zip` and quoted "~/f" reach the command unexpanded: they were "no such file"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mine.jsonl").write_text(json.dumps({"input": "an article", "output": "A Headline"}) + "\n")
    run("user", "create", "ann")
    run("history", "import", "~/mine.jsonl")
    run("user", "export", "--with-history", "--output=~/ann.zip")
    assert (tmp_path / "ann.zip").is_file()
    run("user", "import", "~/ann.zip", "--as", "ann2")
    assert len(UserStore().get("ann2").history()) == 1


def test_a_dated_file_out_of_order_is_imported_oldest_first(tmp_path: Path) -> None:
    """Dates were dropped and the file's order kept: "recent" examples and --keep-latest followed the file."""
    entries = [
        {"input": f"article {day}", "output": f"Headline {day}", "date": f"2018-05-{day:02d}"}
        for day in (3, 1, 9, 2)
    ]
    dated = tmp_path / "dated.jsonl"
    dated.write_text(json.dumps({"user_id": "u1", "history": entries}) + "\n")
    run("user", "create", "ann")
    imported = run("history", "import", str(dated), "--keep-latest", "3")
    assert "out of date order: taken oldest first" in imported.stderr
    outputs = [item.output for item in UserStore().get("ann").history()]
    assert outputs == ["Headline 2", "Headline 3", "Headline 9"]  # the 3 newest, oldest first
    entries[0].pop("date")  # one undated item: the file's own order stands
    dated.write_text(json.dumps({"user_id": "u1", "history": entries}) + "\n")
    run("user", "create", "bob")
    kept = run_json("history", "import", str(dated), "--user", "bob")
    assert kept["sorted_by_date"] is False and kept["undated"] == 1
    assert [item.output for item in UserStore().get("bob").history()] == [e["output"] for e in entries]
    run("user", "create", "cay")
    said = run("history", "import", str(dated), "--user", "cay")
    assert "1 item of the file has no 'date' where others have one: the file's order is kept" in said.stderr


def test_a_user_id_on_two_lines_is_refused_with_the_format_a_per_user_file_has(tmp_path: Path) -> None:
    """One item per line with a user_id, the natural reading of "a file of several users' lines", was refused
    without saying what the format is (first-time-user audit, seventy-ninth session)."""
    run("user", "create", "ann")
    lines = tmp_path / "authors.jsonl"
    lines.write_text(
        json.dumps({"user_id": "u1", "input": "a", "output": "A"})
        + "\n"
        + json.dumps({"user_id": "u1", "input": "b", "output": "B"})
        + "\n"
    )
    refused = CliRunner().invoke(app, ["history", "import", str(lines), "--user-id", "u1"])
    assert refused.exit_code == 2
    assert 'one line per user, holding all of their items: {"user_id": ..., "history": [' in refused.output


def test_a_date_that_is_not_one_is_refused_by_line(tmp_path: Path) -> None:
    """A "date" such as 2024/03/01 or "yesterday" turned off the date order of the whole file without a word
    (first-time-user audit, seventy-ninth session)."""
    run("user", "create", "ann")
    # the last two: a moment before or after what a datetime holds in UTC (a traceback until the 84th session)
    for value in (
        "2024/03/01",
        "yesterday",
        20240301,
        "2024-02-30",
        "0001-01-01T00:00+01:00",
        "9999-12-31T23:59-01:00",
    ):
        dated = tmp_path / "dated.jsonl"
        lines = [
            {"input": "article a", "output": "Headline A", "date": "2024-05-01"},
            {"input": "article b", "output": "Headline B", "date": value},
        ]
        dated.write_text("".join(json.dumps(line) + "\n" for line in lines))
        refused = CliRunner().invoke(app, ["history", "import", str(dated)])
        assert refused.exit_code == 2
        assert f"dated.jsonl line 2: field 'date' is {value!r}, not a valid ISO 8601 date" in refused.output
    assert UserStore().get("ann").history() == []
    in_order = tmp_path / "in-order.jsonl"  # an empty date (a CSV export's empty column) is no date
    lines = [{"input": "a", "output": "A", "date": "2024-01-01"}, {"input": "b", "output": "B", "date": ""}]
    in_order.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert run_json("history", "import", str(in_order))["undated"] == 0  # in order: nothing to say


def test_history_remove_json_names_what_it_removed() -> None:
    run("user", "create", "ann")
    for day in range(3):
        run("history", "add", "-i", f"article {day}", "-o", f"Headline {day}")
    ids = [item.id for item in UserStore().get("ann").history()]
    assert run_json("history", "remove", ids[1]) == {
        "ok": True,
        "user": "ann",
        "removed": [ids[1]],
        "total": 2,
    }
    assert run_json("history", "remove", "--oldest", "5", "--yes") == {  # all of it: --yes, or it asks
        "ok": True,
        "user": "ann",
        "removed": [ids[0], ids[2]],
        "total": 0,
    }


def test_show_says_a_cope_fit_learned_from_another_history() -> None:
    """A CoPe fit whose history changed since (an item added or removed in another shell while it trained) was
    listed like a current one (concurrency audit, seventy-eighth session)."""
    from localpers.bundle.format import default_bundle_dir, sha256_of_file
    from localpers.methods.stored_files import fit_mark
    from localpers.users.history import history_digest

    run("user", "create", "ann")
    ann = UserStore().get("ann")
    items = [HistoryItem.create("headline", f"Article {i}.", f"Headline {i}") for i in range(3)]
    ann.save_history(items)
    in_use = sha256_of_file(default_bundle_dir() / "manifest.json")
    state = {"rank": 8, "n_items": 3, "history_sha256": history_digest(items), "bundle_sha256": in_use}
    state["fitted_by"] = fit_mark()  # a fit this build makes (another fit format would be refit due anyway)
    (ann.dir / "cope.json").write_text(json.dumps(state), encoding="utf-8")
    assert "cope        LoRA rank 8 fitted on 3 items\n" in run("user", "show").stdout
    ann.save_history(items[:2])
    assert (
        "cope        LoRA rank 8 fitted on 3 items, but the history has changed since (run `localpers fit --method"
        " cope --user ann` to refit)" in run("user", "show").stdout
    )


def test_remove_of_one_oldest_item_names_it_and_user_show_prints_text_unquoted() -> None:
    """ "removed the oldest 1 item ... (the newest of them ID)", and `user show` printed a text field with JSON's
    quotes (`fitted_by "localpers 0.1.0, fit format 1"`; first-time-user audit, seventy-ninth session)."""
    run("user", "create", "ann")
    for day in range(2):
        run("history", "add", "-i", f"article {day}", "-o", f"Headline {day}")
    oldest = UserStore().get("ann").history()[0].id
    removed = run("history", "remove", "--oldest", "1").stdout
    assert f"removed the oldest 1 item from user 'ann' ({oldest}); 1 item left" in removed
    assert "newest of them" not in removed
    ann = UserStore().get("ann")
    ann.save_fit(
        np.ones(4, np.float32), {"cluster": 1, "fitted_by": "localpers 9.9, fit format 1", "extra": [1]}
    )
    shown = run("user", "show", "ann").stdout.splitlines()
    assert any(line.split(None, 1) == ["fitted_by", "localpers 9.9, fit format 1"] for line in shown), shown
    assert any(line.split(None, 1) == ["extra", "[1]"] for line in shown), shown


def test_user_show_of_an_emptied_history_says_a_fit_replaces_it() -> None:
    """`user show` advised importing the history back for a user whose history `history remove` emptied, as for
    one imported without it; a fit replaces what the removed items taught (review, seventy-ninth session)."""
    run("user", "create", "ann")
    run("history", "add", "-i", "an article", "-o", "A Headline")
    ann = UserStore().get("ann")
    ann.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": {"mode": "vector", "n_items": 1}})
    run("history", "remove", "--oldest", "1", "--yes")
    fitted = next(
        line for line in run("user", "show", "ann").stdout.splitlines() if line.startswith("fitted")
    )
    assert "`localpers fit --user ann` replaces this fit with the global adapter's" in fitted
    assert "history import" not in fitted


def test_history_add_of_a_duplicate_reports_the_item_as_stored(tmp_path: Path) -> None:
    """`history add --json` of an item already imported reported the candidate (`source: cli`), not the stored
    item (its import file's source; device audit)."""
    run("user", "create", "ann")
    items = tmp_path / "items.jsonl"
    items.write_text('{"input": "The council approved the budget.", "output": "Budget Passes"}\n')
    run("history", "import", str(items))
    stored = run_json("history", "list")["items"][0]
    again = run_json("history", "add", "-i", "The council approved the budget.", "-o", "Budget Passes")
    assert again["added"] is False and again["total"] == 1
    assert again["item"]["source"] == stored["source"] != "cli"


def test_import_refuses_a_fit_every_rewrite_would_refuse(tmp_path: Path) -> None:
    """`user import` took a state.json whose choice was garbage or whose cluster was past the bundle in use
    (manifest hashes recomputed), and every rewrite then refused the user as damaged; doctor missed both. The
    refusal's advice was for a user on this device (device audit)."""
    from localpers.bundle.format import bundle_in_use_sha256, open_bundle
    from localpers.users.archive import pack_archive, read_archive

    bundle = open_bundle(None)
    in_use, clusters, head_d = bundle_in_use_sha256(), bundle.k, bundle.manifest["head"]["d"]
    run("user", "create", "ann")
    # a vector the head takes: the export refuses one it does not (test_export_refuses_a_fit_its_import_would)
    UserStore().get("ann").save_fit(np.ones(head_d, np.float32), {"cluster": 1, "bundle_sha256": in_use})
    archive = Path(run_json("user", "export", "-o", str(tmp_path))["archive"])
    _, members = read_archive(archive)
    state = json.loads(members["state.json"])
    for name, changed in (
        ("badchoice", {**state, "choice": "garbage"}),
        ("badcluster", {**state, "cluster": clusters + 96}),
    ):
        tampered = tmp_path / f"{name}.zip"
        edited = {**members, "state.json": json.dumps(changed).encode()}
        tampered.write_bytes(pack_archive(name, changed["cluster"], edited))
        refused = run("user", "import", str(tampered), code=2)
        assert_one_line_error(refused, f"{tampered} holds a damaged user: ")
        assert refused.stderr.rstrip().endswith("; export it again on the device it came from")
        assert "localpers fit" not in refused.stderr and name not in UserStore().list()
    elsewhere = {
        **state,
        "cluster": clusters + 96,
        "bundle_sha256": "0" * 64,
    }  # another bundle's: refitted here
    other = tmp_path / "other.zip"
    other.write_bytes(
        pack_archive("other", elsewhere["cluster"], {**members, "state.json": json.dumps(elsewhere).encode()})
    )
    run("user", "import", str(other))
    assert "other" in UserStore().list()


def test_export_refuses_a_fit_its_import_would_and_writes_nothing(tmp_path: Path) -> None:
    """With state.json's cluster past the bundle's, export wrote an archive (exit 0) that import refused (exit 2),
    telling the user to export it again on the device it came from: a loop (audit88)."""
    from localpers.bundle.format import bundle_in_use_sha256, open_bundle

    bundle = open_bundle(None)
    in_use, head_d = bundle_in_use_sha256(), bundle.manifest["head"]["d"]
    run("user", "create", "ann")
    out = tmp_path / "out"
    out.mkdir()
    user = UserStore().get("ann")
    user.save_fit(np.ones(head_d, np.float32), {"cluster": bundle.k + 96, "bundle_sha256": in_use})
    user.history_path.write_text('{"input": "An article."}\n')  # damaged, but only exported when asked
    for extra in ([], ["--with-history"]):
        refused = run("user", "export", "-o", str(out / "ann.zip"), *extra, code=2)
        assert_one_line_error(
            refused, f"user 'ann' was not exported: {user.state_path} is damaged: field 'cluster'"
        )
        assert refused.stderr.rstrip().endswith("run `localpers fit --user ann` again")
        assert list(out.iterdir()) == []  # no archive, no partial one
    user.save_fit(np.ones(head_d, np.float32), {"cluster": 1, "bundle_sha256": in_use})
    archive = Path(run_json("user", "export", "-o", str(out))["archive"])  # the history is not read
    run("user", "import", str(archive), "--as", "bob")
    assert UserStore().get("bob").state()["cluster"] == 1


def test_doctor_names_a_user_whose_choice_or_cluster_a_rewrite_refuses(backbone: Backbone) -> None:
    """doctor said it makes the checks a rewrite makes, and missed a garbage choice and a cluster past the
    bundle's (device audit)."""
    from localpers.bundle.format import bundle_in_use_sha256, open_bundle

    bundle = open_bundle(None)
    in_use, clusters, head_d = bundle_in_use_sha256(), bundle.k, bundle.manifest["head"]["d"]
    for name, extra in (
        ("badchoice", {"cluster": 1, "choice": "garbage"}),
        ("badcluster", {"cluster": clusters}),
    ):
        UserStore().create(name).save_fit(np.ones(head_d, np.float32), {"bundle_sha256": in_use, **extra})
    # the vector as wide as the bundle's head (one of another width is damaged too: test_damage_exit_codes)
    UserStore().create("fine").save_fit(np.ones(head_d, np.float32), {"cluster": 1, "bundle_sha256": in_use})
    result = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert sorted(json.loads(result.stdout)["users"]["unreadable"]) == ["badchoice", "badcluster"], (
        result.output
    )


def test_a_file_where_the_users_folder_goes_is_named_by_every_command() -> None:
    """`user list` said "no users yet" (exit 0) and `user create` blamed permissions or disk space (device audit)."""
    users_dir = UserStore().users_dir
    users_dir.parent.mkdir(parents=True, exist_ok=True)
    users_dir.write_text("not a folder")
    for command in (["user", "list"], ["user", "create", "ann"]):
        assert_one_line_error(run(*command, code=1), f"{users_dir} is not a folder (a file is in its place)")
    assert users_dir.read_text() == "not a folder"


def test_an_archive_over_the_history_limit_keeps_the_limits_advice(tmp_path: Path) -> None:
    """The archive advice replaced every refusal's own, so a 501-item archive was told to be exported again
    (the session's diff review); only a damaged file's advice is for a user on this device."""
    from localpers.users.archive import pack_archive

    lines = [
        json.dumps(HistoryItem.create("headline", f"article {i}", f"Headline {i}").to_json())
        for i in range(501)
    ]
    archive = tmp_path / "big.zip"
    archive.write_bytes(
        pack_archive("big", None, {"state.json": b"{}", "history.jsonl": "\n".join(lines).encode()})
    )
    refused = run("user", "import", str(archive), code=2)
    assert_one_line_error(refused, "501 history items, more than the limit of 500; keep your 500 most")
    assert "export it again" not in refused.stderr and "big" not in UserStore().list()
