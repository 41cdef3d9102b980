"""The package's import structure: no import circle, and imports that only flow down the layers.

Every import of every module of `localpers` counts, wherever it is written (at the top, inside a function,
under `TYPE_CHECKING`): a lazy import hides a circle from Python, not from a reader. The layers, top to bottom
(docs/ARCHITECTURE.md draws them):

    cli                                   the command line (one module per command group)
    tui, api                              the other front ends
    device, publish, bench                what the device does for a user / the publisher / the benchmark
    methods                               CARD, CoPe, EXACT, the baselines, and their registry
    users, bundle                         users' stored text / bundle files (pull installs a backbone)
    engine                                llama.cpp, the backbone files, the sentence encoder
    base                                  errors, paths, atomic, tasks, untrusted (the package's root modules)

A module may import its own package and any lower layer; two packages of one layer stay independent.
Read with `ast` only: nothing of localpers is imported here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "localpers"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("base",),
    ("engine",),
    ("users", "bundle"),
    ("methods",),
    ("device", "publish", "bench"),
    ("tui", "api"),
    ("cli",),
)
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The localpers modules `name` imports (a `from package import submodule` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "localpers")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "localpers":
                continue
            submodules = {f"{target}.{alias.name}" for alias in node.names} & modules.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(target)
    found.discard(name)
    return {target for target in found if target in modules}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_package(module: str) -> str:
    """`localpers.methods.card.head` -> `methods`; a module at the package's root -> `base`, except
    `localpers.__main__` (`python -m localpers`), which is the command line's entry point."""
    if module == "localpers.__main__":
        return "cli"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in RANK:
        return parts[1]
    return "base"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_layer() -> None:
    packages = {path.name for path in PACKAGE_DIR.iterdir() if (path / "__init__.py").exists()}
    assert packages <= RANK.keys(), f"give these packages a layer in LAYERS: {sorted(packages - RANK.keys())}"


def test_there_is_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_flow_down_the_layers() -> None:
    wrong = []
    for module, targets in import_graph().items():
        own = layer_package(module)
        for target in sorted(targets):
            other = layer_package(target)
            if other != own and RANK[other] >= RANK[own]:
                wrong.append(f"{module} ({own}) -> {target} ({other})")
    assert not wrong, "imports that run up or across a layer:\n" + "\n".join(wrong)


def test_cli_helpers_import_no_command() -> None:
    """`localpers.cli.common` may lean on leaf helpers (modules that import nothing else of the CLI, such as the
    shell completion's value lists), never on a command module."""
    graph = import_graph()
    cli_modules = {name for name in graph["localpers.cli.common"] if name.startswith("localpers.cli.")}
    commands = {
        name for name in cli_modules if any(target.startswith("localpers.cli.") for target in graph[name])
    }
    assert not commands, f"localpers.cli.common must import no command module: {sorted(commands)}"


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert circles(graph) == expected


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "localpers" / "x" / "y.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    from localpers.engine import model\n    from . import z\n")
    modules = {"localpers.engine.model": Path(), "localpers.x.z": Path(), "localpers.engine": Path()}
    assert imports_of("localpers.x.y", source, modules) == {"localpers.engine.model", "localpers.x.z"}


def test_pyproject_ships_every_package() -> None:
    import tomllib

    config = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {module_name(path.parent / "__init__.py") for path in PACKAGE_DIR.rglob("__init__.py")}
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
