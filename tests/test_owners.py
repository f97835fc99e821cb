"""One owner per rule, held by reading the source: a basis ("proved", "signed", "claimed") is
spelled only by the check catalogue, which declares the vocabulary (and by the two formats
that name a block or field after one, each once, as a constant); the bookkeeping folders
(``.cache/...``) only by the file-set rule; a check's name only by the catalogue
(``_util/checks.py``); a provenance label only by its enum (``format/_provenance.py``); the
config files' names only by ``_util/constants.py``. Any other module that needs them imports
them from their owner. (What a TrustPolicy field means is the policy's:
``tests/trust/test_policy_whole.py``; which private modules a part may import:
``tests/test_architecture.py``.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import cubepack
from cubepack._util.checks import Catalogue
from cubepack.format import _lock as lockfile
from cubepack.format._provenance import KINDS

from envs import once

pytestmark = once

PACKAGE = Path(cubepack.__file__).parent
BASES = {"proved", "signed", "claimed"}
#: The owners, and (for the formats that name a part after a basis) how many times each may
#: spell one: once per constant.
OWNERS = {"_util/checks.py": None, "format/_envelope.py": 2,
          "format/sections/adapters.py": 1}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
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


# --- names declared once: the check catalogue, the provenance labels, the config files --------

CATALOGUE = "_util/checks.py"
CHECK_NAMES = {entry.value for entry in Catalogue}
#: Calls that name a check: a report's line, a refusal, the optional checks a report lists,
#: what a policy asks, and any checker whose name says so (``seen_check``...).
CHECK_CALLS = {"Check", "_refusal", "add", "finish", "asks", "without"}


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else ""


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants ``node`` is or holds as a collection's elements (a tuple, list or
    set, or a pair's first element), not those inside expressions."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [found for element in node.elts for found in _strings(element)]
    return []


def _names_a_check(node: ast.AST) -> bool:
    """``node`` reads a check's name: ``check.name``, ``data["check"]``, ``data.get("check")``."""
    return (isinstance(node, ast.Attribute) and node.attr == "name") or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
        and node.slice.value == "check") or (
        isinstance(node, ast.Call) and _called(node) == "get" and node.args
        and isinstance(node.args[0], ast.Constant) and node.args[0].value == "check")


def check_names_spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` spells a check's name in a place that names a check: an argument of a
    call that makes or lists checks, a comparison with a check's name, a report's ``check``
    key, a constant named after checks, or a table of three or more names and nothing else."""
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (_called(node) in CHECK_CALLS
                                           or "check" in _called(node).lower()):
            found += [c for arg in [*node.args, *(k.value for k in node.keywords)]
                      for c in _strings(arg)]
        elif isinstance(node, ast.Compare) and any(
                _names_a_check(side) for side in [node.left, *node.comparators]):
            found += [c for side in [node.left, *node.comparators] for c in _strings(side)]
        elif isinstance(node, ast.Dict):
            found += [c for key, value in zip(node.keys, node.values)
                      if isinstance(key, ast.Constant) and key.value == "check"
                      for c in _strings(value)]
            keys = [c for key in node.keys if key is not None for c in _strings(key)]
            if len(keys) >= 3 and len(keys) == len(node.keys):
                found += keys if all(c.value in CHECK_NAMES for c in keys) else []
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and "check" in target.id.lower()
                   for target in targets):  # CHECK = "replay", _TRUST_CHECKS = (...)
                value = node.value
                found += _strings(value) + ([c for key in value.keys if key is not None
                                             for c in _strings(key)]
                                            if isinstance(value, ast.Dict) else [])
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = _strings(node)
            if len(elements) >= 3 and len(elements) == len(node.elts) \
                    and all(c.value in CHECK_NAMES for c in elements):
                found += elements
    return sorted({(c.lineno, c.value) for c in found if c.value in CHECK_NAMES})


def test_a_check_is_named_only_by_the_catalogue():
    """Every other module names a check by its entry (``Catalogue.SHA256``); a Check refuses
    a plain string at run time, and this finds one spelled where a check is named even on a
    path no test runs."""
    found = {path.relative_to(PACKAGE).as_posix(): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).as_posix() != CATALOGUE
             and (hits := check_names_spelled(ast.parse(path.read_text())))}
    assert found == {}


LABELS = set(KINDS)


def _key_positions(tree: ast.AST) -> set[int]:
    """The string constants used as a key (a dict's key, a subscript, ``.get``/``.pop``/
    ``.setdefault``'s key, an element of a set of keys, the left side of ``in``): where a
    format names a field that happens to share a label's word (``proved.recomputed``)."""
    keys: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {id(key) for key in node.keys if key is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Call) and _called(node) in ("get", "pop", "setdefault") \
                and node.args:
            keys.add(id(node.args[0]))
        elif isinstance(node, ast.Set):
            keys |= {id(element) for element in node.elts}
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            keys.add(id(node.left))
    return keys


def labels_spelled(tree: ast.AST) -> list[tuple[int, str]]:
    keys = _key_positions(tree)
    docstrings = _docstrings(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in LABELS
                  and id(node) not in keys and id(node) not in docstrings)


def test_a_provenance_label_is_spelled_only_by_its_enum():
    """``asserted``, ``recorded`` and ``recomputed`` as values (a label written, compared,
    offered as a choice) only in ``format/_provenance.py``, in one order of strength; a key
    of the same word (an attestation's ``recomputed`` block) is a field's name."""
    found = {path.relative_to(PACKAGE).as_posix(): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).as_posix() != "format/_provenance.py"
             and (hits := labels_spelled(ast.parse(path.read_text())))}
    assert found == {}


def test_the_config_files_are_named_in_one_module():
    """MemOS's ``config.json`` (and a model folder's, another file of one name) and
    ``cubepack.yaml`` are spelled by ``_util/constants.py`` only."""
    names = {"config.json", "cubepack.yaml"}
    found = {path.relative_to(PACKAGE).as_posix(): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).as_posix() != "_util/constants.py"
             and (hits := [(line, value) for line, value in literals(path) if value in names])}
    assert found == {}


# --- the lock is read through its typed values (format/sections/), never by key ----------------

#: Every key the lock's JSON defines, at every version: its fields, its sections and their
#: entries' keys (a file's, a pin's, its identity's and vectors record's, an activation's and its
#: provenance's, an adapter's, the lineage's, the encryption section's).
LOCK_KEYS = (set(lockfile.FIELDS) | set(lockfile.SECTION_KEYS) | {"sha256", "size"}
             | lockfile.PIN_KEYS | lockfile.IDENTITY_KEYS | lockfile.VECTOR_RECORD_KEYS
             | lockfile.ACTIVATION_KEYS | lockfile.PROVENANCE_KEYS | lockfile.ADAPTER_KEYS
             | lockfile.ADAPTER_SCALING_KEYS | lockfile.LINEAGE_KEYS | lockfile.PARENT_KEYS
             | lockfile.CHANGE_KEYS | {"embedder"} | lockfile.MODEL_CHANGE_KEYS
             | lockfile.ENCRYPTION_KEYS | lockfile.COUNT_KEYS)
#: A name or attribute that holds a lock (``lock``, ``public_lock``, ``report.lock``...), or
#: one of its sections or a pin by its usual name.
_LOCK_NAME = re.compile(r"(^|_)lock$")
_SECTION_NAMES = set(lockfile.SECTION_KEYS) | {"pin"}


def _key_read(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(what is read, the key) of ``x["key"]`` or ``x.get("key", ...)`` with a lock key."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
            and isinstance(node.slice, ast.Constant) and node.slice.value in LOCK_KEYS:
        return node.value, node.slice.value
    if isinstance(node, ast.Call) and _called(node) == "get" and node.args \
            and isinstance(node.args[0], ast.Constant) and node.args[0].value in LOCK_KEYS:
        return node.func.value, node.args[0].value
    return None


def _outside_functions(tree: ast.AST) -> list[ast.AST]:
    """The nodes of a module outside its functions (a name bound in one function is not the
    same name in another)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        todo += [child for child in ast.iter_child_nodes(node) if not isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    return found


def lock_field_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """The string-key reads of a lock field on a lock, a section or an entry: within each
    function, a name is a lock's part when it holds one (by name), is read from one by key,
    or is bound by a loop over one's ``.items()``/``.values()``."""
    found: dict[int, tuple[int, str]] = {}
    scopes = [node for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in [*scopes, tree]:
        held: set[str] = set()
        nodes = list(ast.walk(scope)) if scope is not tree else _outside_functions(tree)

        def holds(node: ast.AST) -> bool:
            if isinstance(node, ast.Name):
                return node.id in held or node.id in _SECTION_NAMES or \
                    bool(_LOCK_NAME.search(node.id))
            if isinstance(node, ast.Attribute):
                return bool(_LOCK_NAME.search(node.attr))
            if isinstance(node, ast.BoolOp):
                return any(holds(value) for value in node.values)
            read = _key_read(node)
            if read:
                return holds(read[0])
            if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant):
                return holds(node.value)  # an entry of a section, by its id or path
            return isinstance(node, ast.Call) and _called(node) in ("items", "values", "to_dict") \
                and holds(node.func.value)

        def bind_loop(target: ast.AST, iterated: ast.AST) -> None:
            if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) \
                    and iterated.func.id == "sorted" and iterated.args:
                iterated = iterated.args[0]
            if not (isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Attribute)
                    and holds(iterated.func.value)):
                return
            if iterated.func.attr == "items" and isinstance(target, ast.Tuple) \
                    and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name):
                held.add(target.elts[1].id)
            elif iterated.func.attr == "values" and isinstance(target, ast.Name):
                held.add(target.id)

        for _ in range(3):  # a name held through a chain of bindings
            for node in nodes:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name) and holds(node.value):
                    held.add(node.targets[0].id)
                elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                        and isinstance(node.target, ast.Name) and holds(node.value):
                    held.add(node.target.id)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    bind_loop(node.target, node.iter)
        for node in nodes:
            read = _key_read(node)
            if read and holds(read[0]):
                found[id(node)] = (node.lineno, read[1])
    return sorted(found.values())


def lock_reads_by_module() -> dict[str, list[tuple[int, str]]]:
    """module -> its reads by key (line, key), for each module outside ``format/``."""
    return {name: reads for path in sorted(PACKAGE.rglob("*.py"))
            if not (name := path.relative_to(PACKAGE).as_posix()).startswith("format/")
            and (reads := lock_field_reads(ast.parse(path.read_text())))}


def test_no_string_key_read_of_a_lock_field_outside_the_format():
    """Readers outside ``format/`` read the lock's frozen values (``lock.files[path].sha256``,
    ``pin.identity``, ``activation.locator``), never its JSON by key: a section's keys are its
    section module's, so a format change is made in one place. (A parsed :class:`Lock` is no
    mapping either: a read by key this walk cannot see fails when it runs.)"""
    assert lock_reads_by_module() == {}


@pytest.mark.parametrize("source, expected", [
    ('def f(report):\n    return report.lock["files"]\n', [(2, "files")]),
    ('def f(lock):\n    for item, entry in lock["activations"].items():\n'
     '        yield entry["file"], entry.get("provenance")\n',
     [(2, "activations"), (3, "file"), (3, "provenance")]),
    ('def f(path):\n    pin = (lockfile.parse(path.read_bytes()) or {})\n'
     '    return pin["identity"]["weights_digest"]\n', [(3, "identity"), (3, "weights_digest")]),
    ('def f(lock):\n    return lock.files[p].sha256, lock.encryption.series\n', []),
    ('def f(report):\n    return report.lock.to_dict()["files"]\n', [(2, "files")]),
    ('def f(rows):\n    return rows["file"]\n', []),
])
def test_the_lock_read_finder_finds_reads_by_key(source, expected):
    assert lock_field_reads(ast.parse(source)) == expected
