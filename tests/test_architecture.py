"""The package's shape: subpackages layered one way, a declared public surface per part, pure
parts that stay pure, an error tree that decides exit codes, test machinery kept out of the
runtime. Read from the source (AST) where possible, so these hold without importing."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import cubepack
from cubepack import errors

from envs import once_with_memos

pytestmark = once_with_memos

PACKAGE = Path(cubepack.__file__).parent
#: The page that states the error tree (a test checks it against the code).
ERRORS_PAGE = PACKAGE.parent / "docs" / "reference" / "errors.md"

#: The parts from the floor up: a module may import only parts of a lower layer, or its own part.
#: Parts on one layer do not import each other.
LAYERS = [
    {"cubepack.errors", "cubepack._version"},
    {"cubepack._util"},
    {"cubepack.identity", "cubepack.localhub"},
    {"cubepack.kv"},
    {"cubepack.format"},
    {"cubepack.memos_format"},
    {"cubepack.trust"},
    {"cubepack.kinds"},
    {"cubepack.ops"},
    {"cubepack.hub", "cubepack.mlx", "cubepack.llamacpp"},
    {"cubepack.memos"},
    {"cubepack", "cubepack.testing"},
    {"cubepack.cli", "cubepack.demo"},
    {"cubepack.__main__"},
]
#: Modules that import commands lazily on purpose: the CLI (``--help`` stays torch-free), its
#: entry point (``__main__`` answers a Ctrl-C while the CLI loads) and the demo (the Hub client
#: reads its environment at import, so the demo sets it first).
LAZY_BY_DESIGN = {"cubepack.__main__", "cubepack.cli", "cubepack.demo"}
#: Each face's public names, exactly: the surface changes only on purpose.
PUBLIC = {
    "cubepack": [
        "CompactResult", "CubepackError", "EncryptOptions", "FormatError", "HubError",
        "IdentityMismatch", "IntegrityError", "KVFileInfo", "MigrateOptions", "MigrateResult",
        "Mismatch", "ModelIdentity", "ModelNotFoundError", "PackOptions", "PackResult",
        "PartialCube", "PullOptions", "PullResult", "PushConflict", "PushOptions", "PushResult",
        "RecomputationFailed", "RefusedError", "RekeyOptions", "RemoteCube",
        "SignatureError", "TrustPolicy", "UnsafeInputError", "UnsupportedError", "UsageError",
        "VerificationFailed", "VerifyReport", "__version__", "compact", "diff", "encrypt",
        "fingerprint",
        "lineage", "load_adapter", "load_kv_cache", "migrate", "open_cube", "pack", "pull",
        "prefill", "push",
        "read_kv_header", "rekey", "save_kv_cache", "sign", "upgrade", "verify"],
    "cubepack.identity": ["STRICT_FIELDS", "ModelIdentity", "compare", "dtype_name",
                          "fingerprint", "require_same"],
    "cubepack.kv": ["KVFileInfo", "check_kv_file", "prefill", "read_kv_header", "save_kv_cache"],
    "cubepack.trust": ["POLICIES", "Check", "TrustPolicy", "VerifyReport", "unlock_identity"],
    "cubepack.ops": ["CompactResult", "EncryptOptions", "MigrateOptions", "MigrateResult",
                     "PackOptions", "PackResult", "RekeyOptions", "UpgradeResult", "compact",
                     "diff", "encrypt",
                     "load_adapter", "load_kv_cache", "migrate", "pack", "rekey", "sign",
                     "upgrade", "verify"],
    "cubepack.hub": ["HubClient", "LineageResult", "PullOptions", "PullResult", "PushOptions",
                     "PushResult", "RemoteCube", "SearchResult", "lineage", "open_cube",
                     "parse_repo_spec", "pull", "push", "resolve_revision", "search",
                     "verify_remote"],
    "cubepack.localhub": ["HubStore", "LocalHub", "collect_garbage"],
    "cubepack.mlx": ["export_prompt_cache", "import_prompt_cache", "load", "load_prompt_cache",
                     "model_identity", "prefill", "save_prompt_cache"],
    "cubepack.llamacpp": ["export_state", "import_state", "load", "load_state", "save_state"],
    "cubepack.memos": ["POLICIES", "HookReport", "init_from_dir", "register",
                       "init_from_remote_repo", "install", "installed", "pack_cube", "settings",
                       "uninstall"],
    "cubepack.errors": ["CubepackError", "FormatError", "HubError", "IdentityMismatch",
                        "IntegrityError", "Mismatch", "ModelNotFoundError", "PartialCube",
                        "PushConflict", "RecomputationFailed",
                        "RefusedError", "SignatureError", "Terminated", "UnsafeInputError",
                        "UnsupportedError",
                        "UsageError", "VerificationFailed"],
    "cubepack.testing": ["free_port"],
}
#: Names a face offers beside its ``__all__``, deliberately: ``cubepack.open`` is
#: ``cubepack.open_cube`` (issue #40's name), kept out of ``__all__`` so that
#: ``from cubepack import *`` never shadows the builtin ``open``.
ALIASES = {"cubepack": {"open": "open_cube"}}
#: Declared seams: the private module of a part that the parts above it may import, beside its
#: face (what they orchestrate with it that is no user's API). Any other import of the part's
#: private modules from outside it fails.
SEAMS = {"cubepack.ops": "cubepack.ops._seam"}
#: Modules holding pure logic: their imports (followed through cubepack) reach no HTTP, torch,
#: transformers or MemOS code.
#: (The provenance labels are read by the CLI as it starts: --require-provenance's choices.)
PURE = ["cubepack._util.checks", "cubepack.format._provenance",
        "cubepack.format._lock", "cubepack.kv._format", "cubepack.identity._identity",
        "cubepack.mlx._layout",
        "cubepack.llamacpp._layout",
        "cubepack.memos_format._records", "cubepack.memos_format._layout", "cubepack.format._diff",
        "cubepack.trust._attestation"]
HEAVY = ("torch", "transformers", "huggingface_hub", "httpx", "requests", "urllib.request",
         "http.client", "memos", "safetensors.torch", "tokenizers")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    base = PACKAGE.parent / Path(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


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
        targets.append(candidate if is_module(candidate) else base)
    return targets


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Every node that runs at import time: the module body, including inside ``try``, ``if``
    and ``with`` blocks, but not inside functions or classes' methods."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """(import-time imports, function-level imports) between cubepack modules, and each
    module's import-time imports of anything else. Plain ``import x`` statements, imports
    guarded by ``try``/``if``, and ``importlib.import_module("cubepack...")`` / ``__import__``
    calls with a literal name all count."""
    top: dict[str, set[str]] = {}
    nested: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        at_import = {id(node) for node in _module_level(tree)}
        top[module], nested[module], external[module] = set(), set(), set()
        for node in ast.walk(tree):
            where = top if id(node) in at_import else nested
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                ours = resolve(module, node, path.name == "__init__.py")
                names = ours if ours and ours[0].startswith("cubepack") else [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Call) and node.args and \
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and (getattr(node.func, "attr", None) == "import_module"
                         or getattr(node.func, "id", None) == "__import__"):
                names = [node.args[0].value]
            for name in names:
                if name.startswith("cubepack"):
                    if name != module:
                        where[module].add(name)
                elif where is top:
                    external[module].add(name)
    return top, nested, external


def part_of(module: str) -> str:
    """The part (a layer entry) a module belongs to; a new part must be placed in LAYERS."""
    parts = module.split(".")
    candidate = ".".join(parts[:2])
    if any(candidate in layer for layer in LAYERS):
        return candidate
    assert module == "cubepack", f"{module} belongs to no layer; add its part to LAYERS"
    return module


def layer_of(part: str) -> int:
    return next(index for index, layer in enumerate(LAYERS) if part in layer)


def test_every_import_goes_down_the_layers():
    top, nested, _ = import_graph()
    climbing = []
    for module in top:
        here = part_of(module)
        for target in top[module] | (nested[module] if module not in LAZY_BY_DESIGN else set()):
            there = part_of(target)
            if there != here and layer_of(there) >= layer_of(here):
                climbing.append(f"{module} -> {target}")
    assert climbing == []


def test_the_import_graph_has_no_cycle():
    top, _, _ = import_graph()
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
    _, nested, _ = import_graph()
    offenders = {module: sorted(targets) for module, targets in nested.items()
                 if targets and module not in LAZY_BY_DESIGN}
    assert offenders == {}


def test_runtime_modules_never_import_the_test_machinery():
    top, nested, _ = import_graph()
    for module in top:
        if module.startswith("cubepack.testing") or module in LAZY_BY_DESIGN:
            continue
        assert not any(t.startswith("cubepack.testing") for t in top[module] | nested[module]), \
            module


@pytest.mark.parametrize("part", sorted(SEAMS))
def test_a_part_with_a_seam_is_reached_only_through_its_face_or_its_seam(part):
    """From outside ``part``, at import time or lazily, only its face (``cubepack.ops``) and its
    declared seam are imported, never another of its private modules (the MemOS hook reached
    four of ``ops``'s, the Hub side and the CLI more)."""
    top, nested, _ = import_graph()
    reaching = sorted(f"{module} -> {target}" for module in top
                      for target in top[module] | nested[module]
                      if part_of(module) != part and target.startswith(part + ".")
                      and target != SEAMS[part])
    assert reaching == []


@pytest.mark.parametrize("part", sorted(SEAMS))
def test_a_seam_passes_on_only_what_its_part_defines(part):
    seam = importlib.import_module(SEAMS[part])
    for name in seam.__all__:
        defined_in = getattr(getattr(seam, name), "__module__", None) or SEAMS[part]  # a constant
        assert defined_in.startswith(part + "."), name
    stray = sorted(name for name, value in vars(seam).items() if not name.startswith("_")
                   and name not in seam.__all__ and not isinstance(value, type(importlib)))
    assert stray == [], f"{SEAMS[part]} passes on {stray} undeclared"


@pytest.mark.parametrize("module", PURE)
def test_pure_parts_import_no_http_torch_or_memos(module):
    """Followed through every cubepack module they import at top level (faces excluded: they
    only re-export), the pure modules never reach a heavy or networked library."""
    top, _, external = import_graph()
    seen, todo, reached = set(), [module], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        reached |= external.get(current, set())
        todo += [t for t in top.get(current, ()) if not (PACKAGE.parent / Path(
            *t.split(".")) / "__init__.py").exists()]
    heavy = sorted(name for name in reached if name.startswith(HEAVY))
    assert heavy == [], f"{module} reaches {heavy} through {sorted(seen)}"


def test_subpackages_and_private_modules():
    """The folder is the architecture: each part is a subpackage (the floor and the faces aside)
    and every module inside a part is private; the only public modules are the faces, errors,
    cli, demo and the test machinery."""
    top_level = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert top_level == ["__init__", "__main__", "_version", "cli", "demo", "errors"]
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(part.split(".")[1] for layer in LAYERS for part in layer
                             if part.count(".") == 1 and (PACKAGE / part.split(".")[1]).is_dir())
    for part in ("identity", "kv", "format", "memos_format", "trust", "kinds", "ops", "hub",
                 "localhub", "memos", "mlx", "llamacpp"):
        names = [path.stem for path in (PACKAGE / part).glob("*.py") if path.stem != "__init__"]
        assert names and all(name.startswith("_") for name in names), (part, names)


@pytest.mark.parametrize("face", sorted(PUBLIC))
def test_each_face_declares_exactly_its_public_names(face):
    module = __import__(face, fromlist=["_"])
    assert sorted(module.__all__) == sorted(PUBLIC[face])
    for name in module.__all__:
        assert hasattr(module, name), f"{face}.{name}"
    # Nothing else public by accident: every other attribute is private or a subpackage.
    stray = sorted(name for name, value in vars(module).items() if not name.startswith("_")
                   and name not in module.__all__
                   and name not in getattr(module, "_ALIASES", {})  # cubepack.open, once used
                   and not getattr(value, "__name__", "").startswith(face + "."))
    assert stray == [], f"{face} exposes {stray}"


@pytest.mark.parametrize("face", sorted(set(PUBLIC) - {"cubepack", "cubepack.testing"}))
def test_a_face_exports_only_names_its_own_part_defines(face):
    """Nothing public re-exports a helper through the wrong module: each name a part exports is
    defined in that part (or is a shared constant of the layer below it, as POLICIES is for the
    hook, and named so in PUBLIC)."""
    module = __import__(face, fromlist=["_"])
    borrowed = {"cubepack.memos": {"POLICIES"},
                # what pack and migrate take and return holds each memory kind's fields
                "cubepack.ops": {"MigrateOptions", "MigrateResult", "PackOptions",
                                 "PackResult"}}
    for name in module.__all__:
        defined_in = getattr(getattr(module, name), "__module__", face) or face
        if name in borrowed.get(face, ()):
            continue
        assert defined_in.startswith(face), f"{face}.{name} comes from {defined_in}"


def test_the_top_level_face_takes_each_name_from_its_part():
    # cubepack.mlx is reached as a subpackage only (an optional runtime: its prefill is MLX's)
    parts = {name: face for face, names in PUBLIC.items()
             if face not in ("cubepack", "cubepack.errors", "cubepack.mlx", "cubepack.llamacpp")
             for name in names}  # the runtimes' faces: optional, reached by name
    for name in cubepack.__all__:
        if name == "__version__" or hasattr(errors, name):
            continue
        assert getattr(cubepack, name) is getattr(__import__(parts[name], fromlist=["_"]), name)


def _error_classes() -> list[type]:
    return [obj for obj in vars(errors).values()
            if isinstance(obj, type) and issubclass(obj, errors.CubepackError)]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_the_error_tree_decides_the_exit_code(cls):
    expected = 1 if issubclass(cls, errors.RefusedError) else \
        2 if issubclass(cls, errors.UsageError) else \
        4 if issubclass(cls, errors.PartialCube) else 3
    assert cls.exit_code == expected
    assert cls.__doc__, f"{cls.__name__} says when it is raised"


def test_the_docs_error_table_lists_every_class_with_its_base_and_exit_code():
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)`(?: \(\+ `(\w+)`\))? \| (\d) \|",
                      ERRORS_PAGE.read_text(), re.MULTILINE)
    table = {name: (base, stdlib, int(code)) for name, base, stdlib, code in rows}
    expected = {}
    for cls in _error_classes():
        if cls is errors.CubepackError:
            expected[cls.__name__] = ("Exception", "", cls.exit_code)
            continue
        ours = [b for b in cls.__bases__ if issubclass(b, errors.CubepackError)]
        stdlib = [b for b in cls.__bases__ if not issubclass(b, errors.CubepackError)]
        expected[cls.__name__] = (ours[0].__name__, stdlib[0].__name__ if stdlib else "",
                                  cls.exit_code)
    assert table == expected


def test_the_docs_teach_one_import_path_per_name():
    """In the Python examples of the README and the docs site each public name is reached one
    way only (e.g. ``push`` as ``cubepack.push``, never also as ``cubepack.hub.push``)."""
    from docs_pages import python_code

    code = python_code()
    paths: dict[str, set[str]] = {}
    for face, names in re.findall(r"from (cubepack(?:\.\w+)?) import (\([^)]*\)|[^\n#]+)", code):
        for item in re.split(r"[,\s()]+", names.strip()):
            if item:
                paths.setdefault(item, set()).add(face)
    faces = "identity|kv|format|trust|ops|hub|memos|mlx|llamacpp"
    for face, name in re.findall(rf"\b(cubepack(?:\.(?:{faces}))?)\.(\w+)\(", code):
        paths.setdefault(name, set()).add(face)
    # One object reached two ways is taught twice; two objects of one name are two things
    # (``cubepack.prefill`` runs transformers, ``cubepack.mlx.prefill`` runs MLX).
    taught_twice = {name: sorted(faces) for name, faces in paths.items()
                    if len(faces) > 1 and len({id(getattr(importlib.import_module(face), name))
                                               for face in faces}) < len(faces)}
    assert taught_twice == {}
    for name, faces in paths.items():
        face = next(iter(faces))
        submodule = not name.startswith("_") and importlib.util.find_spec(f"{face}.{name}")
        assert name in PUBLIC.get(face, []) or name in ALIASES.get(face, {}) \
            or face not in PUBLIC or submodule, \
            f"{face}.{name} is not public"


def test_each_alias_is_the_public_name_it_stands_for_and_not_in_all():
    for face, aliases in ALIASES.items():
        module = importlib.import_module(face)
        for alias, name in aliases.items():
            assert alias not in module.__all__ and name in module.__all__
            assert getattr(module, alias) is getattr(module, name)
