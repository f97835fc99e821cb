"""Every file kind cubepack reads from a cube, 5000 levels deep: a FormatError naming the file
and the limit (pack), a failed check naming them (verify), exit 1 from the CLI, never a
RecursionError. Everything in a cube was written by whoever pushed last."""

from __future__ import annotations

import contextlib
import json
import pickle
import re
import struct
import sys

import pytest
import torch

import cubepack
from cubepack import FormatError, UnsafeInputError, VerificationFailed
from cubepack._util import constants
from cubepack.cli import main

from adversarial import ITEM, add_locked, header_edit, relock_file
from data import COLLIDING_NAMES, UNPORTABLE_NAMES
from envs import once
from helpers import build_cache, copy_of, reseal_lock, tree_bytes
from memos_format import _as_memos_globals, write_cube

pytestmark = once

DEPTH = 5000
DEEP_JSON = "[" * DEPTH + "]" * DEPTH
DEEP_YAML = "deep: " + DEEP_JSON + "\n"
LIMIT = "nesting deeper than 64 levels"


def deep_list(depth=DEPTH):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@contextlib.contextmanager
def deep_recursion():
    """pickle.dumps recurses; only the test's writer needs the room (readers never do)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(DEPTH * 4)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def with_deep_json(text: str) -> str:
    """A JSON object text with one more key holding the 5000-deep array."""
    return text.rstrip().rstrip("}") + ', "deep": ' + DEEP_JSON + "}"


# --- verify: each kind, resealed so only the reader can refuse it ------------------------------

def _deep_kv_metadata(cube):
    def change(header):
        meta = json.loads(header["__metadata__"]["cubepack"])
        meta["metadata"]["deep"] = "PLACEHOLDER"
        header["__metadata__"]["cubepack"] = json.dumps(meta).replace('"PLACEHOLDER"', DEEP_JSON)
    (cube / ITEM).write_bytes(header_edit(change)((cube / ITEM).read_bytes()))
    relock_file(cube, ITEM)
    return ITEM


def _deep_safetensors(cube):
    header = ('{"__metadata__": {"a": "b"}, "t": {"dtype": "U8", "shape": [1], '
              '"data_offsets": [0, 1], "deep": ' + DEEP_JSON + "}}").encode()
    header += b" " * (-len(header) % 8)
    add_locked(cube, "extra.safetensors", struct.pack("<Q", len(header)) + header + b"\0")
    return "extra.safetensors"


def _deep_config_json(cube):
    path = cube / "config.json"
    path.write_text(with_deep_json(path.read_text()))
    relock_file(cube, "config.json")
    return "config.json"


def _deep_cube_yaml(cube):
    path = cube / constants.CONFIG_FILENAME
    path.write_text(path.read_text() + DEEP_YAML)
    relock_file(cube, constants.CONFIG_FILENAME)
    return constants.CONFIG_FILENAME


VERIFY_CASES = {
    "json": lambda c: (add_locked(c, "textual_memory.json", DEEP_JSON.encode()),
                       "textual_memory.json")[1],
    "config.json": _deep_config_json,
    "yaml": lambda c: (add_locked(c, "notes.yaml", DEEP_YAML.encode()), "notes.yaml")[1],
    "cubepack.yaml": _deep_cube_yaml,
    "kv metadata": _deep_kv_metadata,
    "safetensors header": _deep_safetensors,
}


@pytest.mark.parametrize("kind", sorted(VERIFY_CASES))
def test_verify_refuses_each_kind_5000_deep_naming_file_and_limit(packed_cube_factory, tmp_path,
                                                                  capsys, kind):
    cube = copy_of(packed_cube_factory(), tmp_path)
    name = VERIFY_CASES[kind](cube)
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube)
    refused = [c for c in caught.value.failures if c.subject == name]
    assert refused and all(LIMIT in c.detail for c in refused), caught.value.failures
    assert {c.name for c in caught.value.failures} <= {"content", "kv header", "cube config"}
    assert main(["verify", str(cube)]) == 1
    assert LIMIT in capsys.readouterr().out  # the report, every check with its outcome


def test_verify_refuses_a_yaml_alias(packed_cube_factory, tmp_path):
    """An alias can make a document recursive (``&a [*a]``) or exponentially large."""
    cube = copy_of(packed_cube_factory(), tmp_path)
    add_locked(cube, "notes.yaml", b"a: &a [1]\nb: *a\n")
    with pytest.raises(VerificationFailed, match=r"content notes\.yaml: is not valid yaml: a "
                                                 r"YAML alias \(\*a\) at line 2"):
        cubepack.verify(cube)


def test_verify_refuses_a_5000_deep_lock(packed_cube_factory, tmp_path):
    cube = copy_of(packed_cube_factory(), tmp_path)
    (cube / constants.LOCK_FILENAME).write_text('{"files": ' + DEEP_JSON + "}")
    with pytest.raises(VerificationFailed, match=f"cubepack.lock is refused: {LIMIT}"):
        cubepack.verify(cube)
    assert main(["verify", str(cube)]) == 1


# --- pack: each kind an unpacked MemOS cube can hold ------------------------------------------

@pytest.fixture(scope="module")
def caches(models):
    return {"item-1": build_cache(models["a"], torch.tensor([[5, 6, 7, 8]]))}


def _pickle_metadata(value):
    def mutate(cube):
        path = cube / "activation_memory.pickle"
        with _as_memos_globals(False), deep_recursion():
            document = pickle.loads(path.read_bytes())
            document["kv_cache_memories"]["item-1"].metadata["deep"] = value
            path.write_bytes(pickle.dumps(document))
        return "activation_memory.pickle"
    return mutate


def _cyclic():
    cycle: list = []
    cycle.append(cycle)
    return cycle


def _deep_unpacked_kv(cube, zoo, models):
    cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([[3, 4]])),
                           cube / "activations" / "x.kv.safetensors", producer=models["a"],
                           metadata={"deep": "PLACEHOLDER"})
    _deep_kv_metadata_file(cube / "activations" / "x.kv.safetensors")
    return "activations/x.kv.safetensors"


def _deep_kv_metadata_file(path):
    def change(header):
        header["__metadata__"]["cubepack"] = header["__metadata__"]["cubepack"].replace(
            '"PLACEHOLDER"', DEEP_JSON)
    path.write_bytes(header_edit(change)(path.read_bytes()))


def _write(name, text):
    def mutate(cube):
        (cube / name).write_text(text)
        return name
    return mutate


def _deep_config(cube):
    return _write("config.json", with_deep_json((cube / "config.json").read_text()))(cube)


PACK_CASES = {
    "config.json": _deep_config,
    "textual_memory.json": _write("textual_memory.json", DEEP_JSON),
    "other json": _write("preference_memory.json", '{"a": ' + DEEP_JSON + "}"),
    "yaml": _write("notes.yaml", DEEP_YAML),
    "README front matter": _write("README.md", "---\n" + DEEP_YAML + "---\n# A cube\n"),
    "pickle metadata": _pickle_metadata(deep_list()),
    "pickle metadata cycle": _pickle_metadata(_cyclic()),
    "kv metadata": None,  # needs the model: below
}


@pytest.mark.parametrize("kind", sorted(PACK_CASES))
def test_pack_refuses_each_kind_5000_deep_naming_file_and_limit(tmp_path, zoo, models, caches,
                                                                capsys, kind):
    cube = write_cube(tmp_path / "cube", str(zoo["a"]), caches)
    name = _deep_unpacked_kv(cube, zoo, models) if kind == "kv metadata" \
        else PACK_CASES[kind](cube)
    before = tree_bytes(cube)
    with pytest.raises(FormatError) as caught:
        cubepack.pack(cube, legacy_pickle=True)
    assert name in str(caught.value) and LIMIT in str(caught.value), caught.value
    assert tree_bytes(cube) == before
    assert main(["pack", str(cube), "--legacy-pickle"]) == 1
    assert LIMIT in capsys.readouterr().err


def test_pack_refuses_a_pickle_whose_shared_metadata_would_copy_2_to_the_40(tmp_path, zoo,
                                                                            caches):
    shared: list = ["leaf"]
    for _ in range(40):
        shared = [shared, shared]
    cube = write_cube(tmp_path / "cube", str(zoo["a"]), caches)
    _pickle_metadata(shared)(cube)
    with pytest.raises(FormatError, match=r"activation_memory\.pickle: more than 1000000 values"):
        cubepack.pack(cube, legacy_pickle=True)


def test_a_cube_yaml_version_that_only_equals_1_is_refused(packed_cube_factory, tmp_path):
    cube = copy_of(packed_cube_factory(), tmp_path)
    path = cube / constants.CONFIG_FILENAME
    path.write_text(path.read_text().replace("schema_version: 1", "schema_version: true"))
    relock_file(cube, constants.CONFIG_FILENAME)
    with pytest.raises(VerificationFailed, match="schema_version must be an integer, found True"):
        cubepack.verify(cube)


# --- names some file system cannot hold: the one path rule ------------------------------------

def _place(cube, name, data=b"text\n"):
    path = cube.joinpath(*name.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.mark.parametrize("name, rule", UNPORTABLE_NAMES)
def test_pack_refuses_names_some_file_system_cannot_hold(tmp_path, zoo, caches, capsys, name,
                                                         rule):
    cube = write_cube(tmp_path / "cube", str(zoo["a"]), caches)
    _place(cube, name)
    before = tree_bytes(cube)
    with pytest.raises(UnsafeInputError, match=re.escape(repr(name)) + ".*" + re.escape(rule)):
        cubepack.pack(cube, legacy_pickle=True)
    assert tree_bytes(cube) == before
    assert main(["pack", str(cube), "--legacy-pickle"]) == 1
    assert rule in capsys.readouterr().err


@pytest.mark.parametrize("name, rule", UNPORTABLE_NAMES)
def test_verify_refuses_a_resealed_lock_naming_such_a_file(packed_cube_factory, tmp_path, name,
                                                           rule):
    cube = copy_of(packed_cube_factory(), tmp_path)
    _place(cube, name)
    relock_file(cube, name)
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube)
    [lock] = [c for c in caught.value.failures if c.name == "lock"]
    assert repr(name) in lock.detail and rule in lock.detail
    assert main(["verify", str(cube)]) == 1


def test_verify_refuses_such_a_name_on_disk_too(packed_cube_factory, tmp_path):
    cube = copy_of(packed_cube_factory(), tmp_path)
    _place(cube, "notes/aux.txt")
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube)
    paths = [c for c in caught.value.failures if c.name == "path"]
    assert paths and "a device name Windows reserves" in paths[0].detail
    assert paths[0].subject == "notes/aux.txt"


@pytest.mark.parametrize("first, second", COLLIDING_NAMES)
def test_colliding_names_are_refused_by_pack_and_in_a_resealed_lock(packed_cube_factory, tmp_path,
                                                                     zoo, caches, first, second):
    cube = copy_of(packed_cube_factory(), tmp_path)
    reseal_lock(cube, lambda lock: lock["files"].update({
        first: {"sha256": "ab" * 32, "size": 1}, second: {"sha256": "cd" * 32, "size": 1}}))
    with pytest.raises(VerificationFailed, match="collide|both a file and a folder"):
        cubepack.verify(cube)
    if second.startswith(first + "/"):
        return  # one file system cannot hold both, so no cube folder can
    unpacked = write_cube(tmp_path / "unpacked", str(zoo["a"]), caches)
    _place(unpacked, first)
    _place(unpacked, second)
    with pytest.raises(UnsafeInputError, match="collide"):
        cubepack.pack(unpacked, legacy_pickle=True)
