"""``ops/`` holds the order of the phases, never a memory kind's code: every kind-specific
rule is its kind's (``cubepack/kinds/<kind>/``), reached through the registry (``KINDS``) and
the :class:`~cubepack.kinds.Kind` phases. Read from the source (AST), so a new kind-specific
line in a verb fails here, not in review.

The rule an AST can check: an ``ops`` module
- imports ``cubepack.kinds`` only through its face (no kind folder, no private module), and
  nothing of ``cubepack.kv`` (a KV file is the activations kind's);
- spells no kind in a code identifier (a name, an attribute, a function, class or parameter,
  an import): no word of :data:`KIND_WORDS` in it, split at ``_`` and case. Exempt: the
  public verbs' names (``load_adapter``, pinned by ``tests/test_architecture.py``) and their
  own parameters (``migrate(embedder=...)``: their signatures are public, kept as they were),
  used inside that verb;
- names no kind by a key: no string that is a kind's name, lock section or ``cubepack.yaml``
  key (``lock.entries("adapters")`` is a kind's code spelled as data). Other strings and
  comments are words to a reader, not code: free.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import cubepack
import cubepack.ops
from cubepack.kinds import KINDS

OPS = Path(cubepack.__file__).parent / "ops"
#: The words that name a memory kind or what only one kind holds.
KIND_WORDS = {"activation", "activations", "adapter", "adapters", "embedder", "embedders",
              "vector", "vectors", "kv", "lora", "peft", "prompt", "prompts", "reprefill",
              "reembed", "parametric", "textual", "act"}
PUBLIC_VERBS = set(cubepack.ops.__all__)
#: The keys the registry knows each kind by.
KIND_KEYS = {key for kind in KINDS for key in (kind.name, kind.section, kind.memory) if key}


def _words(identifier: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", identifier)
    return {word.lower() for word in spaced.split("_") if word}


def _spelled(identifier: str) -> bool:
    return bool(_words(identifier) & KIND_WORDS)


def kind_code(source: str, module: str = "cubepack.ops._x") -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` (an ``ops`` module) holds a kind's code."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    exempt_in: dict[int, set[str]] = {}  # id(node) -> parameters exempt inside it
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name in PUBLIC_VERBS:
            params = {arg.arg for arg in (*node.args.posonlyargs, *node.args.args,
                                          *node.args.kwonlyargs)}
            for inner in ast.walk(node):
                exempt_in[id(inner)] = params
    for node in ast.walk(tree):
        exempt = exempt_in.get(id(node), set()) | PUBLIC_VERBS
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[:-node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("cubepack.kinds.") or target.startswith("cubepack.kv"):
                found.append((node.lineno, f"imports {target}"))
            names = [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(("cubepack.kinds.", "cubepack.kv")):
                    found.append((node.lineno, f"imports {alias.name}"))
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.Constant) and node.value in KIND_KEYS:
            found.append((node.lineno, f"names {node.value!r}"))
        found += [(node.lineno, name) for name in names
                  if _spelled(name) and name not in exempt]
    return found


@pytest.mark.parametrize("path", sorted(OPS.glob("*.py")), ids=lambda path: path.name)
def test_an_ops_module_holds_no_memory_kind_s_code(path):
    module = "cubepack.ops" + ("" if path.stem == "__init__" else f".{path.stem}")
    if path.stem == "__init__":
        module += ".__init__"
    assert kind_code(path.read_text(), module) == [], path.name


@pytest.mark.parametrize("source, expected", [
    # planted: a verb reading a kind's section, a helper named after a kind, a kind's module
    ("def f(lock):\n    return len(lock.adapters)\n", [(2, "adapters")]),
    ("def _check_activations(report):\n    pass\n", [(1, "_check_activations")]),
    ("from ..kinds.vectors import _check\n", [(1, "imports cubepack.kinds.vectors")]),
    ("from ..kinds.adapters._lora import role\n",
     [(1, "imports cubepack.kinds.adapters._lora")]),
    ("from ..kv._format import read_kv_header\n",
     [(1, "imports cubepack.kv._format"), (1, "read_kv_header")]),
    ("def g(x):\n    return x.vectorsRecord\n", [(2, "vectorsRecord")]),
    ("def f(reembed=None):\n    pass\n", [(1, "reembed")]),
    ("def f(lock):\n    return lock.entries('adapters')\n", [(2, "names 'adapters'")]),
    ("x = {'parametric': []}\n", [(1, "names 'parametric'")]),
    # free: the face, a public verb and its own parameters, words in strings
    ("from ..kinds import KINDS\nfor kind in KINDS:\n    kind.check_bytes(r, l, g)\n", []),
    ("def migrate(cube, *, embedder=None):\n    return embedder\n", []),
    ("def _x(cube):\n    return embedder\n", [(2, "embedder")]),
    ("def f():\n    return 'an adapter'\n", []),
])
def test_the_kind_code_finder_finds_what_was_planted(source, expected):
    assert kind_code(source) == expected
