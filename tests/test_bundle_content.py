"""A bundle's content is read as the device reads it before `pull` installs it and by `bundle verify`.

Each damaged bundle below has its manifest re-hashed, as anyone can do to a bundle nobody signed: the file
checks pass, and before the content check these were installed and refused only at a user's first fit or
rewrite (or, for some, not refused at all). Now `pull --unsigned` refuses them in one line naming the
source's file, installs nothing and keeps the previous bundle; `bundle verify` exits 2 naming the file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from synthetic_bundle import make_bundle
from typer.testing import CliRunner

from localpers.bundle.format import MANIFEST_NAME, repair_advice, verify_bundle, write_manifest
from localpers.bundle.locations import embedded_bundle_dir, installed_bundle_dir
from localpers.cli import app
from localpers.engine.adapters import check_lora_adapter, linear_shapes, write_lora_gguf
from localpers.engine.backbone import Backbone
from localpers.engine.gguf_layout import gguf_layout
from localpers.errors import InputError, LocalpersError
from localpers.methods.card.bundle_content import backbone_shape, check_bundle_content

DEMO_BUNDLE = Path(__file__).resolve().parents[1] / "models" / "demo-bundle"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, backbone: Backbone) -> Path:
    return make_bundle(tmp_path_factory.mktemp("template") / "bundle", backbone)


@pytest.fixture
def bundle(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "bundle"))


def rehash(directory: Path) -> None:
    """Re-list every file's size and sha256, as an editor of an unsigned bundle would."""
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    write_manifest(directory, {key: value for key, value in manifest.items() if key != "files"})


def edit_manifest(directory: Path, section: str, field: str, value: object) -> None:
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest[section][field] = value
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def edit_tensor(path: Path, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    tensors = load_file(str(path))
    tensors[name] = change(tensors[name])
    save_file(tensors, str(path))


def with_nan(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flat[0] = np.nan
    return array


def lora_for(backbone: Path, path: Path, *, transposed: bool = False, value: float = 0.01) -> None:
    shapes = linear_shapes(backbone, ("attn_q",))
    tensors = {
        weight: (
            np.full((2, n_out if transposed else n_in), value),
            np.full((n_in if transposed else n_out, 2), 0.01),
        )
        for weight, (n_in, n_out) in shapes.items()
    }
    write_lora_gguf(path, tensors, alpha=4.0)


# (what is damaged, how, the file or field the one-line refusal must name)
DAMAGE: list[tuple[str, Callable[[Path, Path], None], str]] = [
    ("head holds NaN", lambda b, _: edit_tensor(b / "head.safetensors", "P", with_nan), "head.safetensors"),
    (
        "head lacks the global default vector",
        lambda b, _: edit_tensor(b / "head.safetensors", "default_vectors", lambda a: a[:2]),
        "default_vectors",
    ),
    (
        "head Q of another backbone's width",
        lambda b, _: edit_tensor(b / "head.safetensors", "Q", lambda a: a[:100]),
        "head.safetensors",
    ),
    (
        "centroids of the wrong width",
        lambda b, _: save_file(
            {"centroids": np.ones((2, 100), np.float32)}, str(b / "centroids.safetensors")
        ),
        "centroids.safetensors",
    ),
    (
        "adapter cut short",
        lambda b, _: (b / "adapters/cluster-1.gguf").write_bytes(
            (b / "adapters/cluster-1.gguf").read_bytes()[:300]
        ),
        "cluster-1.gguf",
    ),
    (
        "adapter with A and B transposed",
        lambda b, backbone: lora_for(backbone, b / "adapters/cluster-1.gguf", transposed=True),
        "cluster-1.gguf",
    ),
    (
        "adapter holding infinities",
        lambda b, backbone: lora_for(backbone, b / "adapters/global.gguf", value=np.inf),
        "global.gguf",
    ),
    (
        "head taps layer 40 of 18",
        lambda b, _: edit_manifest(b, "head", "layers", [14, 15, 16, 40]),
        "head.layers",
    ),
    ("k above the adapters", lambda b, _: edit_manifest(b, "clusters", "k", 3), "cluster-2"),
]


def test_real_bundles_pass(bundle: Path, backbone: Backbone) -> None:
    check_bundle_content(verify_bundle(bundle), backbone.path)
    check_bundle_content(verify_bundle(DEMO_BUNDLE), backbone.path)
    check_bundle_content(verify_bundle(DEMO_BUNDLE), None)
    assert backbone_shape(gguf_layout(backbone.path)) == (18, 640)


@pytest.mark.parametrize(("damage", "names"), [(d[1], d[2]) for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_content_is_refused_by_verify_and_by_pull_keeping_the_previous_bundle(
    bundle: Path, tmp_path: Path, backbone: Backbone, damage: Callable[[Path, Path], None], names: str
) -> None:
    runner = CliRunner()
    good = Path(shutil.copytree(bundle, tmp_path / "good"))
    installed = runner.invoke(app, ["pull", "--unsigned", str(good), "--model", str(backbone.path)])
    assert installed.exit_code == 0, installed.stderr
    previous = installed_bundle_dir()

    damage(bundle, backbone.path)
    rehash(bundle)
    verify_bundle(bundle)  # the files match the manifest: only their content is wrong

    verified = runner.invoke(app, ["bundle", "verify", str(bundle), "--model", str(backbone.path)])
    assert verified.exit_code == 2 and verified.stdout == ""
    assert (
        verified.stderr.startswith("error: ")
        and verified.stderr.count("\n") == 1
        and names in verified.stderr
    )
    # A directory the user gave: copied again or re-published, never "re-pull" (it was never pulled).
    assert "copy the bundle directory again" in verified.stderr
    assert "re-pull" not in verified.stderr and "pull it again" not in verified.stderr

    pulled = runner.invoke(app, ["pull", "--unsigned", str(bundle), "--model", str(backbone.path)])
    assert pulled.exit_code == 2 and pulled.stderr.count("\n") == 1 and names in pulled.stderr
    assert str(bundle) in pulled.stderr and ".staging-" not in pulled.stderr
    assert "nothing was installed" in pulled.stderr and "copy the bundle directory again" in pulled.stderr
    assert installed_bundle_dir() == previous
    assert not [p for p in previous.parent.parent.iterdir() if p.name.startswith(".staging-")]


@pytest.mark.parametrize(
    ("values", "tensors", "refusal"),
    [
        ({"general.type": "model"}, None, "not a LoRA adapter"),
        ({"general.architecture": "llama"}, None, "an adapter for 'llama'"),
        ({"adapter.lora.alpha": float("nan")}, None, "adapter.lora.alpha"),
        ({}, {"blk.0.attn_q.weight.lora_a": np.zeros((2, 640), np.float16)}, "has only its lora_a"),
        ({}, {"blk.99.attn_q.weight.lora_a": np.zeros((2, 640), np.float16)}, "no matrix of"),
        ({}, {"blk.0.attn_q.weight": np.zeros((2, 640), np.float16)}, "neither a LoRA A nor a B"),
        ({}, {}, "holds no LoRA tensors"),
    ],
)
def test_an_adapter_llama_cpp_would_refuse_is_refused_from_its_header(
    tmp_path: Path, backbone: Backbone, values: dict, tensors: dict | None, refusal: str
) -> None:
    import gguf

    path = tmp_path / "adapter.gguf"
    writer = gguf.GGUFWriter(str(path), values.pop("general.architecture", "gemma3"))
    writer.add_string("general.type", values.pop("general.type", "adapter"))
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", values.pop("adapter.lora.alpha", 4.0))
    if tensors is None:
        tensors = {
            "blk.0.attn_q.weight.lora_a": np.zeros((2, 640), np.float16),
            "blk.0.attn_q.weight.lora_b": np.zeros((1024, 2), np.float16),
        }
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(LocalpersError, match=refusal) as refused:
        check_lora_adapter(path, gguf_layout(backbone.path))
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_errors_are_input_errors_and_a_bad_backbone_is_not_blamed_on_the_bundle(
    bundle: Path, tmp_path: Path
) -> None:
    edit_tensor(bundle / "head.safetensors", "P", with_nan)
    rehash(bundle)
    with pytest.raises(InputError):
        check_bundle_content(verify_bundle(bundle), None)
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"nope")
    with pytest.raises(LocalpersError) as refused:
        check_bundle_content(verify_bundle(bundle), not_gguf)
    assert not isinstance(refused.value, InputError) and str(not_gguf) in str(refused.value)


def test_a_command_given_a_damaged_bundle_directory_refuses_it_before_loading_the_model(
    bundle: Path, backbone: Backbone
) -> None:
    lora_for(
        backbone.path, bundle / "adapters/global.gguf", value=np.inf
    )  # llama.cpp loads it: random tokens
    rehash(bundle)
    runner = CliRunner()
    assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    text = "The city council voted on Tuesday to expand the bike lane network across downtown."
    rewritten = runner.invoke(app, ["rewrite", "--bundle", str(bundle), "-m", "global", text])
    assert rewritten.exit_code == 2 and rewritten.stdout == ""
    assert (
        rewritten.stderr.count("\n") == 1
        and "global.gguf" in rewritten.stderr
        and "not finite" in rewritten.stderr
        and "copy the bundle directory again" in rewritten.stderr
    )


def test_doctor_reports_the_bundle_in_use_and_what_its_check_found(bundle: Path, backbone: Backbone) -> None:
    runner = CliRunner()
    assert (
        runner.invoke(app, ["pull", "--unsigned", str(bundle), "--model", str(backbone.path)]).exit_code == 0
    )
    healthy = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert healthy.exit_code == 0, healthy.stderr
    report = json.loads(healthy.stdout)["bundle"]
    assert (
        report["ok"] and report["origin"] == "pulled" and report["directory"] == str(installed_bundle_dir())
    )
    assert (
        report["pinned"] is True
        and "pinned      no" not in runner.invoke(app, ["doctor", "--model", str(backbone.path)]).stdout
    )

    from localpers.bundle.record import record_path

    record_path(installed_bundle_dir()).unlink()  # as an earlier localpers left it: no record of the manifest
    unpinned = runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)])
    assert unpinned.exit_code == 0 and json.loads(unpinned.stdout)["bundle"]["pinned"] is False
    shown = runner.invoke(app, ["doctor", "--model", str(backbone.path)]).stdout
    assert "pinned      no: an earlier localpers pulled it and kept no record of its manifest" in shown
    assert (
        runner.invoke(app, ["pull", "--unsigned", str(bundle), "--model", str(backbone.path)]).exit_code == 0
    )
    assert json.loads(runner.invoke(app, ["doctor", "--json", "--model", str(backbone.path)]).stdout)[
        "bundle"
    ]["pinned"]

    edit_tensor(installed_bundle_dir() / "head.safetensors", "P", with_nan)  # damaged after install
    damaged = runner.invoke(app, ["doctor", "--model", str(backbone.path)])
    assert damaged.exit_code == 1  # it reports everything, then exits 1 for a set-up that would not work
    assert any(line.startswith("problem       bundle: refused:") for line in damaged.stdout.splitlines())
    line = next(line for line in damaged.stdout.splitlines() if line.startswith("  content"))
    assert "refused:" in line and "head.safetensors" in line
    assert f"pull it again with `localpers pull {bundle} --unsigned`" in line  # where it was pulled from


def test_repo_add_refuses_to_sign_a_bundle_devices_would_refuse(
    bundle: Path, tmp_path: Path, backbone: Backbone
) -> None:
    runner = CliRunner()
    keys, repo = tmp_path / "keys", tmp_path / "repo"
    assert runner.invoke(app, ["repo", "keygen", str(keys)]).exit_code == 0
    assert runner.invoke(app, ["repo", "init", str(repo), "--keys", str(keys)]).exit_code == 0
    signed_before = sorted(p.relative_to(repo) for p in repo.rglob("*"))

    lora_for(backbone.path, bundle / "adapters/cluster-0.gguf", value=np.inf)
    rehash(bundle)
    refused = runner.invoke(app, ["repo", "add", str(repo), str(bundle), "--keys", str(keys)])
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1 and "cluster-0.gguf" in refused.stderr
    assert "build it again (`localpers publish`)" in refused.stderr and "re-pull" not in refused.stderr
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == signed_before  # nothing signed

    shutil.rmtree(bundle)
    shutil.copytree(DEMO_BUNDLE, bundle)
    edit_manifest(bundle, "backbone", "sha256", "0" * 64)  # a backbone this machine does not have
    rehash(bundle)
    added = runner.invoke(app, ["repo", "add", str(repo), str(bundle), "--keys", str(keys)])
    assert added.exit_code == 0, added.stderr
    assert "not checked against it" in added.stderr and added.stdout.startswith("published")
    other = tmp_path / "other.gguf"  # another backbone (only its sha256 is read before the refusal)
    other.write_bytes(b"GGUF" + bytes(64))
    wrong = runner.invoke(
        app, ["repo", "add", str(repo), str(bundle), "--keys", str(keys), "--model", str(other)]
    )
    assert wrong.exit_code == 2 and "the bundle names 000000000000" in wrong.stderr


def test_a_bundle_an_older_pull_installed_unchecked_is_refused_at_its_first_use(
    bundle: Path, backbone: Backbone
) -> None:
    from localpers.bundle.pull import pull_bundle

    edit_tensor(bundle / "head.safetensors", "P", with_nan)
    rehash(bundle)
    pull_bundle(str(bundle), unsigned=True, backbone_sha256=backbone.sha256)  # no content check, as before
    runner = CliRunner()
    assert runner.invoke(app, ["user", "create", "ann"]).exit_code == 0
    text = "The city council voted on Tuesday to expand the bike lane network across downtown."
    for _ in range(2):  # a refusal leaves no stamp: refused again
        rewritten = runner.invoke(app, ["rewrite", "-m", "global", "--model", str(backbone.path), text])
        assert rewritten.exit_code == 2 and rewritten.stdout == ""
        assert rewritten.stderr.count("\n") == 1 and "head.safetensors" in rewritten.stderr
        assert "installed before localpers checked this" in rewritten.stderr


def test_the_installed_bundle_is_read_once_per_manifest_backbone_and_revision(
    bundle: Path, backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.bundle.format import open_bundle
    from localpers.bundle.locations import bundles_root
    from localpers.methods.card import bundle_content

    reads: list[Path] = []
    real_check = bundle_content.check_bundle_content
    monkeypatch.setattr(
        bundle_content, "check_bundle_content", lambda b, m: (reads.append(b.directory), real_check(b, m))
    )

    def use(path: Path | None = None) -> None:
        opened = open_bundle(path, backbone_sha256=backbone.sha256)
        bundle_content.check_bundle_before_use(opened, backbone.path, given=path is not None)

    use()
    assert reads == []  # nothing pulled: the embedded demo bundle is part of the package, not read
    runner = CliRunner()
    assert (
        runner.invoke(app, ["pull", "--unsigned", str(bundle), "--model", str(backbone.path)]).exit_code == 0
    )
    assert len(reads) == 1 and reads[0].name.startswith(".staging-")  # pull's check, remembered
    use()
    use()
    assert len(reads) == 1
    (bundles_root() / bundle_content.CHECKED_STAMP).unlink()  # pulled by a localpers that kept no stamp
    use()
    use()
    assert reads[1:] == [installed_bundle_dir()]
    monkeypatch.setattr(bundle_content, "CHECK_REVISION", bundle_content.CHECK_REVISION + 1)
    use()
    use()
    assert len(reads) == 3  # a stricter check reads the installed bundle again, once
    (bundles_root() / bundle_content.CHECKED_STAMP).write_text("{not json")
    use()
    assert len(reads) == 4
    use(bundle)
    use(bundle)
    assert reads[4:] == [bundle, bundle]  # a directory given on the command line: every time


def test_what_to_do_about_a_bad_bundle_depends_on_where_it_came_from(
    bundle: Path, backbone: Backbone
) -> None:
    """The pulled bundle is pulled again from its recorded source, the demo bundle comes with a reinstall, and
    a directory given on the command line is copied again or re-published (it was never pulled)."""
    assert repair_advice(bundle).startswith("copy the bundle directory again")
    assert "reinstall localpers" in repair_advice(embedded_bundle_dir())
    pulled = CliRunner().invoke(app, ["pull", "--unsigned", str(bundle), "--model", str(backbone.path)])
    assert pulled.exit_code == 0, pulled.stderr
    assert repair_advice(installed_bundle_dir()) == f"pull it again with `localpers pull {bundle} --unsigned`"
    assert repair_advice(bundle).startswith("copy the bundle directory again")  # the source is not the copy
