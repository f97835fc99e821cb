"""The package's shape: a one-way import graph, a declared public surface, test machinery kept
out of the runtime modules. Read from the source (AST), so these hold without importing."""

from __future__ import annotations

import ast
from pathlib import Path

import cubepack

PACKAGE = Path(cubepack.__file__).parent
#: Modules that import commands lazily on purpose: the CLI (``--help`` stays torch-free) and the
#: demo (the Hub client reads its environment at import, so the demo sets it first).
LAZY_BY_DESIGN = {"cubepack.cli", "cubepack.demo"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, node: ast.ImportFrom, is_package: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    targets = []
    for alias in node.names:  # ``from . import _lock`` imports the module, not the package
        candidate = f"{base}.{alias.name}"
        is_module = (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists()
        targets.append(candidate if is_module else base)
    return [t for t in targets if t.startswith("cubepack")]


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(top-level imports, function-level imports) between cubepack modules."""
    top: dict[str, set[str]] = {}
    nested: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        top[module], nested[module] = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = resolve(module, node, path.name == "__init__.py")
                where = top if node in tree.body else nested
                where[module].update(t for t in targets if t != module)
    return top, nested


def test_the_import_graph_has_no_cycle():
    top, _ = import_graph()
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(trail + [module])
        state[module] = "open"
        for target in sorted(top.get(module, ())):
            if target in top:
                visit(target, trail + [module])
        state[module] = "done"

    for module in top:
        visit(module, [])


def test_no_function_level_import_of_cubepack_modules_outside_the_cli_and_demo():
    _, nested = import_graph()
    offenders = {module: sorted(targets) for module, targets in nested.items()
                 if targets and module not in LAZY_BY_DESIGN}
    assert offenders == {}


def test_runtime_modules_never_import_the_test_machinery():
    top, nested = import_graph()
    for module in top:
        if module.startswith("cubepack.testing") or module in LAZY_BY_DESIGN:
            continue
        used = top[module] | nested[module]
        assert not any(t.startswith("cubepack.testing") for t in used), module


def test_public_modules_are_unprefixed_and_internal_ones_prefixed():
    public = {"__init__", "__main__", "errors", "identity", "fingerprints", "kvfile", "pack",
              "verify", "diff", "hub", "signing", "memos", "upgrade", "cli", "demo"}
    names = {path.stem for path in PACKAGE.glob("*.py")}
    assert names - public == {name for name in names if name.startswith("_")} - {"__init__",
                                                                               "__main__"}
    assert set(cubepack.__all__) >= {"fingerprint", "load_kv_cache", "save_kv_cache", "pack",
                                     "verify", "pull", "push", "diff", "__version__"}
