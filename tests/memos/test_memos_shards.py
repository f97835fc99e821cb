"""The MemOS hook loads a sharded cube's activations (issue #40 item 2), with the real
MemoryOS package: each memory's range checked against its index before a tensor is built; a
swapped range is refused, nothing installed."""

from __future__ import annotations

import json

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import IntegrityError
from cubepack._util import constants
from cubepack.format import _lock as lockfile

from memos_live import cube_config

TEXTS = ["The user likes green tea.", "He walks every morning.", "Paris is lovely in May."]


def _cube(model):
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(model))


@pytest.fixture
def sharded(installed, zoo, tmp_path):
    source = _cube(zoo["a"]).act_mem
    source.add([source.extract(text) for text in TEXTS])
    cube = _cube(zoo["a"])
    cube.act_mem.kv_cache_memories = dict(source.kv_cache_memories)
    folder = hook.pack_cube(cube, tmp_path / "cube")
    cubepack.pack(folder, shards=True)
    lock = lockfile.parse((folder / constants.LOCK_FILENAME).read_bytes())
    assert lock.version == 6 and len(lock.shards) == 1
    return folder, source


def test_the_hook_loads_a_sharded_cube(sharded, zoo):
    folder, source = sharded
    fresh = _cube(zoo["a"]).act_mem
    fresh.load(str(folder))
    assert sorted(item.id for item in fresh.get_all()) == sorted(source.kv_cache_memories)


def test_the_hook_refuses_a_changed_range_even_resealed(sharded, zoo):
    """A byte of one memory changed, the shard's digest resealed into the index and the lock
    (as someone with write access could): the memory's own sha256 in the index refuses it."""
    import hashlib

    from cubepack._util import canonical
    from helpers import reseal_lock

    folder, _ = sharded
    name = "shards/activations-00000.index.json"
    index = json.loads((folder / name).read_text())
    last = max(index["memories"].values(), key=lambda m: m["offset"])
    shard = folder / "shards/activations-00000.kvshard"
    data = bytearray(shard.read_bytes())
    data[last["offset"] + last["length"] - 1] ^= 0x01
    shard.write_bytes(bytes(data))
    index["shard"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    text = canonical.dumps(index, compact=True).encode()
    (folder / name).write_bytes(text)

    def reseal(lock):
        lock["files"][name] = {"sha256": hashlib.sha256(text).hexdigest(), "size": len(text)}
        lock["files"]["shards/activations-00000.kvshard"]["sha256"] = index["shard"]["sha256"]
    reseal_lock(folder, reseal)
    fresh = _cube(zoo["a"]).act_mem
    with pytest.raises(IntegrityError, match="hashes to"):
        fresh.load(str(folder))
    assert fresh.get_all() == []


def test_a_sharded_cube_without_its_lock_is_refused_not_empty(sharded, zoo):
    """Its lock removed, a sharded cube's memories cannot be checked: the hook refuses it
    (naming the shards) instead of loading nothing, as a folder without a memory file would."""
    folder, _ = sharded
    (folder / constants.LOCK_FILENAME).unlink()
    fresh = _cube(zoo["a"]).act_mem
    with pytest.raises(cubepack.CubepackError, match="shards/activations-00000.kvshard"):
        fresh.load(str(folder))
    assert fresh.get_all() == []
