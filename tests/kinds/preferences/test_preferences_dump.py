"""MemOS's preference dump as MemOS writes it, and the kind's strict reader of it: what the
kind pins (dense vectors of each item's memory text), what it refuses (sparse vectors, keys
MemOS's item does not define, ids that repeat) and the file-name collision with the text
memory (MemOS's default for both)."""

from __future__ import annotations

import copy
import json
import uuid

import pytest

from cubepack.errors import FormatError
from cubepack.kinds.preferences import _dump
from cubepack.memos_format._layout import opened_path

from preferences_memos import PREFERENCES, dump_cube, naive_text_mem, read_dump


def _item(collection="explicit_preference", **changes):
    entry = {"id": str(uuid.uuid4()), "memory": "The user likes tea.", "original_text": "u: tea",
             "payload": {"preference": "tea"}, "vector": [0.1, 0.2, 0.3]}
    entry.update(changes)
    return entry


# --- MemOS's own dump and load --------------------------------------------------------------

def test_memos_dumps_preferences_to_the_text_memorys_default_file(default_dump):
    config = json.loads((default_dump / "config.json").read_text())
    assert config["pref_mem"]["config"]["memory_filename"] == _dump.DEFAULT_FILENAME
    data = read_dump(default_dump)
    assert {name: len(items) for name, items in data.items()} == {
        "explicit_preference": 2, "implicit_preference": 2}
    found = _dump.items(data, "textual_memory.json")
    assert sorted(item.memory for item in found) == sorted(p[1] for p in PREFERENCES)
    assert {len(item.vector) for item in found} == {32}


def test_memos_own_load_of_its_dump_loads_nothing_and_says_nothing(default_dump, tmp_path,
                                                                    pref_server):
    """Why the hook loads the items itself: MemOS's load validates each item as a VecDBItem,
    which forbids ``memory`` and ``original_text``; the error is logged, not raised."""
    from memos.mem_cube.general import GeneralMemCube

    from preferences_memos import cube_config

    cube = GeneralMemCube(cube_config(tmp_path / "fresh.db", pref_server))
    cube.pref_mem.load(str(default_dump))  # no exception
    assert all(cube.pref_mem.vector_db.get_all(name) == [] for name in _dump.COLLECTIONS)


def test_the_vector_embeds_the_items_memory_text(default_dump, pref_server):
    from cubepack.kinds.vectors._embedder import embed
    from cubepack.kinds.vectors._vectors import cosine

    found = _dump.items(read_dump(default_dump), "textual_memory.json")
    fresh = embed(pref_server.spec, [item.memory for item in found])
    assert all(cosine(list(item.vector), vector) > 0.999 for item, vector in zip(found, fresh))


# --- the reader ----------------------------------------------------------------------------------

def test_the_record_counts_each_collection_and_samples_items_by_name():
    data = {"explicit_preference": [_item(), _item()], "implicit_preference": [_item()]}
    record = _dump.record(_dump.items(data, "p.json"), "p.json")
    assert record["collections"] == {"explicit_preference": 2, "implicit_preference": 1}
    assert (record["count"], record["dimension"], record["embedder"]) == (3, 3, _dump.EMBEDDER_ROLE)
    assert all(name.split("/")[0] in data for name in record["sample"])


@pytest.mark.parametrize("key", sorted(_dump.SPARSE_KEYS))
def test_an_item_carrying_a_sparse_vector_is_refused_naming_the_key(key):
    data = {"explicit_preference": [_item(**{key: {"17": 0.4}})]}
    with pytest.raises(FormatError, match=f"sparse vector .*'{key}'.*dense vectors only"):
        _dump.items(data, "p.json")


@pytest.mark.parametrize("key", sorted(_dump.ITEM_KEYS))
def test_an_item_without_each_key_is_refused(key):
    entry = _item()
    del entry[key]
    with pytest.raises(FormatError, match=f"missing \\['{key}'\\]"):
        _dump.items({"explicit_preference": [entry]}, "p.json")


@pytest.mark.parametrize("bad", [
    {"id": "not-a-uuid"}, {"vector": []}, {"vector": ["1"]}, {"vector": [True]},
    {"memory": None}, {"payload": []}, {"extra": 1}])
def test_a_malformed_item_is_refused(bad):
    with pytest.raises(FormatError):
        _dump.items({"explicit_preference": [_item(**bad)]}, "p.json")


@pytest.mark.parametrize("data", [[], {"explicit_preference": {}}, {"": []},
                                  {"explicit_preference": [1]}])
def test_a_file_that_is_no_preference_dump_is_refused(data):
    with pytest.raises(FormatError):
        _dump.items(data, "p.json")


def test_one_id_twice_is_refused_across_collections():
    entry = _item()
    data = {"explicit_preference": [entry], "implicit_preference": [copy.deepcopy(entry)]}
    with pytest.raises(FormatError, match="two items with the id"):
        _dump.items(data, "p.json")


def test_vectors_of_two_dimensions_are_refused():
    data = {"explicit_preference": [_item(), _item(vector=[1.0, 2.0])]}
    with pytest.raises(FormatError, match=r"dimensions \[2, 3\]"):
        _dump.record(_dump.items(data, "p.json"), "p.json")


def test_with_vectors_replaces_only_the_named_items():
    first, second = _item(), _item()
    data = {"explicit_preference": [first, second]}
    out = _dump.with_vectors(data, {f"explicit_preference/{first['id']}": [9.0, 9.0, 9.0]})
    assert out["explicit_preference"][0]["vector"] == [9.0, 9.0, 9.0]
    assert out["explicit_preference"][1] == second and data["explicit_preference"][0] == first
    with pytest.raises(FormatError, match="holds no item"):
        _dump.with_vectors(data, {"implicit_preference/x": [1.0]})


# --- the file-name collision -------------------------------------------------------------------

def _config(pref_name=None, text_name=None, text="naive_text", pref="pref_text"):
    def memory(backend, name):
        return {"backend": backend, "config": {} if name is None else {"memory_filename": name}}
    return {"text_mem": memory(text, text_name), "pref_mem": memory(pref, pref_name)}


@pytest.mark.parametrize("pref_name,text_name", [
    (None, None), ("textual_memory.json", None), ("./textual_memory.json", None),
    ("x.json", "./x.json"), ("a/../x.json", "x.json")])
def test_one_file_for_both_memories_is_a_collision_naming_the_fix(pref_name, text_name):
    message = _dump.filename_collision(_config(pref_name, text_name), opened_path)
    assert message is not None
    assert 'set "memory_filename": "preference_memory.json" in pref_mem.config'.lower() \
        in message.lower()


@pytest.mark.parametrize("config", [
    _config("preference_memory.json"), _config(text="uninitialized"),
    _config(pref="uninitialized"), {"pref_mem": {"backend": "pref_text", "config": {}}}])
def test_distinct_files_or_one_memory_is_no_collision(config):
    assert _dump.filename_collision(config, opened_path) is None


def test_memos_overwrites_the_text_memory_when_both_keep_their_default(tmp_path, pref_server):
    """The collision is real: MemOS's dump of a cube with both memories at their defaults holds
    the preferences only (the text memory's file was overwritten)."""
    folder = dump_cube(tmp_path / "both", pref_server, text_mem=naive_text_mem())
    config = json.loads((folder / "config.json").read_text())
    assert _dump.filename_collision(config, opened_path) is not None
    assert set(read_dump(folder)) == set(_dump.COLLECTIONS)  # the preferences, not a list


def test_a_collection_named_twice_is_refused(tmp_path):
    """A dump naming one collection twice is ambiguous (JSON readers keep one or the other):
    refused, never read as whichever came last."""
    first, second = json.dumps([_item()]), json.dumps([_item(), _item()])
    path = tmp_path / "p.json"
    path.write_text(f'{{"explicit_preference": {first}, "explicit_preference": {second}}}')
    with pytest.raises(FormatError, match="explicit_preference"):
        _dump.read(path)


def test_memos_preference_memory_cannot_dump_from_qdrant(tmp_path, pref_server):
    """Why the test cubes use Milvus Lite: MemOS's preference memory hands its store the list
    of collections its config names, which MemOS's Qdrant store (one collection, a string)
    cannot serve; its dump fails."""
    pytest.importorskip("qdrant_client")
    from memos.configs.memory import MemoryConfigFactory
    from memos.memories.factory import MemoryFactory

    from preferences_memos import memos_or_skip, pref_mem_config

    memos_or_skip()
    config = pref_mem_config(tmp_path / "unused.db", pref_server)
    config["vector_db"] = {"backend": "qdrant", "config": {
        "collection_name": "explicit_preference", "vector_dimension": 32,
        "distance_metric": "cosine", "path": str(tmp_path / "qdrant")}}
    memory = MemoryFactory.from_config(MemoryConfigFactory.model_validate(
        {"backend": "pref_text", "config": config}))
    with pytest.raises(Exception):  # noqa: B017 - whatever MemOS raises: it does not dump
        memory.dump(str(tmp_path / "out"))
