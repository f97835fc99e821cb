"""``memos/`` (the MemOS hook) holds no memory kind's code either: it loads a verified cube's
memories by running every kind's ``load_memos`` phase (through ``ops._seam.load_verified``)
and places what they hand back, so a new kind that MemOS can hold needs no edit in
``memos/``. Read from the source (AST): a ``memos`` module imports ``cubepack.kinds`` only
through its face or its one declared seam (``kinds/_seam.py``: what the hook uses of the
activations kind to place, register, guard and dump KV caches), never a kind's folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cubepack
from cubepack.kinds import KINDS

MEMOS = Path(cubepack.__file__).parent / "memos"
#: What ``memos`` may import of ``kinds``: its face and its seam.
ALLOWED = {"cubepack.kinds", "cubepack.kinds._seam"}
FOLDERS = {f"cubepack.kinds.{kind.name}" for kind in KINDS}


def kind_imports(source: str, module: str = "cubepack.memos._x") -> list[tuple[int, str]]:
    """(line, module) for each import in ``source`` (a ``memos`` module) of a ``kinds``
    module other than its face and its seam (a kind's folder, a private module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[:-node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            # ``from ..kinds import preferences``: a folder (or private module) by its name
            targets = [f"{target}.{alias.name}" for alias in node.names] \
                if target == "cubepack.kinds" else [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        found += [(node.lineno, target) for target in targets
                  if target.startswith("cubepack.kinds.") and target not in ALLOWED
                  and (target.count(".") > 2 or target in FOLDERS
                       or target.split(".")[-1].startswith("_"))]
    return found


@pytest.mark.parametrize("path", sorted(MEMOS.glob("*.py")), ids=lambda path: path.name)
def test_a_memos_module_imports_no_kind_s_folder(path):
    module = "cubepack.memos" + (".__init__" if path.stem == "__init__" else f".{path.stem}")
    assert kind_imports(path.read_text(), module) == [], path.name


@pytest.mark.parametrize("source, expected", [
    # planted: the preference kind's loader by name (as the hook did), a kind's private module
    ("from ..kinds.preferences import load_preferences\n",
     [(1, "cubepack.kinds.preferences")]),
    ("from ..kinds import preferences\n", [(1, "cubepack.kinds.preferences")]),
    ("from ..kinds.activations._memos import Checking\n",
     [(1, "cubepack.kinds.activations._memos")]),
    ("import cubepack.kinds.vectors._check\n", [(1, "cubepack.kinds.vectors._check")]),
    ("from ..kinds._kind import LoadJob\n", [(1, "cubepack.kinds._kind")]),
    # free: the face and the seam
    ("from ..kinds import KINDS, LoadJob, memos_owned\n", []),
    ("from ..kinds._seam import Checking\n", []),
])
def test_the_kind_import_finder_finds_what_was_planted(source, expected):
    assert kind_imports(source) == expected


def test_every_kind_s_folder_is_among_those_refused():
    """The registry's kinds are folders of ``kinds``: each is refused by the finder."""
    for folder in FOLDERS:
        assert kind_imports(f"import {folder}\n") == [(1, folder)]
