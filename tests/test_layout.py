"""The package's layout rules: few top-level modules, small files, no import cycle, a torch-free solver."""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_ckpt

PACKAGE = Path(lightning_ckpt.__file__).resolve().parent
MAX_TOP_LEVEL_MODULES = 10
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Package modules imported anywhere in the file (inside functions and TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import submodule` imports the submodule; `from pkg import name`, the package
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [sub if sub in known else node.module for sub in subs]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, [*stack, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_at_most_ten_modules_directly_in_the_package():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_folders_are_at_most_two_levels_deep():
    deep = [path for path in PACKAGE.rglob("*.py") if len(path.relative_to(PACKAGE).parts) > 3]
    assert not deep


def test_no_file_over_400_lines():
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycle_type_only_imports_included():
    assert _cycle(_graph()) is None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_solver_imports_neither_torch_nor_lightning():
    for path in (PACKAGE / "solver").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                roots = {name.split(".")[0] for name in names}
                assert not roots & {"torch", "lightning", "pytorch_lightning"}, (path, roots)
                assert not any(n.startswith("lightning_ckpt.") and ".solver" not in n for n in names), path


def test_solver_engines_stand_on_its_runtime_alone():
    """solver/runtime imports no engine; the one engine (capped/) stands on its dense pass without caps
    (dense/) and the shared sparse layer (sparse/), never the reverse, and none imports the public face
    (api)."""
    engine, dense, sparse = (f"lightning_ckpt.solver.{room}" for room in ("capped", "dense", "sparse"))
    api = "lightning_ckpt.solver.api"
    rules = {
        "lightning_ckpt.solver.runtime": (engine, dense, sparse, api),
        dense: (engine, api),
        engine: (api,),
        sparse: (engine, dense, "lightning_ckpt.solver.runtime", api),
    }
    graph = _graph()
    assert all(any(name.startswith(f"{room}.") for name in graph) for room in rules)  # the rooms exist
    for name, imported in graph.items():
        for room, forbidden in rules.items():
            if name == room or name.startswith(f"{room}."):
                assert not [m for m in imported if m.startswith(forbidden)], name


def test_lower_layers_do_not_import_upper_ones():
    """core/ and solver/ import nothing from the planning, Lightning, offline or top-level layers."""
    upper = (
        "lightning_ckpt.lightning",
        "lightning_ckpt.offline",
        "lightning_ckpt.callback",
        "lightning_ckpt.planning",
        "lightning_ckpt.config",
    )
    for name, imported in _graph().items():
        if name.startswith(("lightning_ckpt.core", "lightning_ckpt.solver")):
            assert not [m for m in imported if m.startswith(upper)], name


def test_one_direction_between_lightning_and_offline():
    """The offline planner builds on the Lightning layer (the fake run, the run spec), never the reverse."""
    for name, imported in _graph().items():
        if name.startswith("lightning_ckpt.lightning"):
            assert not [m for m in imported if m.startswith("lightning_ckpt.offline")], name


def _third_party_roots(path: Path) -> set[str]:
    """Top-level names of everything the file imports (inside functions too)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_is_the_memory_model_only():
    """core/ (profiling, memory model, wrapping) imports neither the solver nor scipy: deciding is
    planning's job."""
    for name, imported in _graph().items():
        if name.startswith("lightning_ckpt.core"):
            assert not [m for m in imported if m.startswith("lightning_ckpt.solver")], name
    for path in (PACKAGE / "core").rglob("*.py"):
        assert "scipy" not in _third_party_roots(path), path


def test_every_public_name_imports_from_the_package():
    for name in lightning_ckpt.__all__:
        assert getattr(lightning_ckpt, name) is not None, name
