"""One owner per rule, held by reading the source: a basis ("proved", "signed", "claimed") is
spelled only by the check catalogue, which declares the vocabulary (and by the two formats
that name a block or field after one, each once, as a constant), and the bookkeeping folders
(``.cache/...``) only by the file-set rule. Any other module that needs them imports them
from their owner."""

from __future__ import annotations

import ast
from pathlib import Path

import cubepack

from envs import once

pytestmark = once

PACKAGE = Path(cubepack.__file__).parent
BASES = {"proved", "signed", "claimed"}
#: The owners, and (for the formats that name a part after a basis) how many times each may
#: spell one: once per constant.
OWNERS = {"_util/checks.py": None, "format/_envelope.py": 2, "format/_lock.py": 1}


def literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_a_basis_is_spelled_only_by_its_owners():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        spelled = [(line, value) for line, value in literals(path) if value in BASES]
        if name in OWNERS:
            limit = OWNERS[name]
            assert limit is None or len(spelled) <= limit, (name, spelled)
        elif spelled:
            found[name] = spelled
    assert found == {}


def test_bookkeeping_folders_are_named_only_by_the_file_set_rule():
    found = {path.relative_to(PACKAGE).as_posix(): hits for path in sorted(PACKAGE.rglob("*.py"))
             if (hits := [(line, value) for line, value in literals(path)
                          if ".cache/huggingface" in value or ".cache/cubepack" in value])
             and path.name != "_fileset.py"}
    assert found == {}
