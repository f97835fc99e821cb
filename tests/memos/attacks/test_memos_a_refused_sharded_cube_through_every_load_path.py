"""A sharded cube the activations kind refuses (another producer than the loading model; a
range swapped and resealed is covered by test_memos_shards), swept over MemOS's load paths
(``KVCacheMemory.load``, ``GeneralMemCube.load``, ``GeneralMemCube.init_from_dir`` with a
``default_config``): each is the same typed refusal, naming a memory, and leaves the memory
it was loading into as it was (never emptied, never half-filled)."""

from __future__ import annotations

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import IdentityMismatch

from memos_live import cube_config

TEXTS = ["The user likes green tea.", "He walks every morning.", "Paris is lovely in May."]


def _cube(model):
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(model))


@pytest.fixture
def sharded(installed, zoo, tmp_path):
    cube = _cube(zoo["a"])
    items = [cube.act_mem.extract(text) for text in TEXTS]
    cube.act_mem.add(items)
    folder = hook.pack_cube(cube, tmp_path / "cube")
    cubepack.pack(folder, shards=True)
    return folder


def _kv_load(folder, zoo):
    memory = _cube(zoo["b"]).act_mem
    own = memory.extract("Model B's own memory.")
    memory.add([own])
    return memory, lambda: memory.load(str(folder)), [own.id]


def _cube_load(folder, zoo):
    cube = _cube(zoo["b"])
    own = cube.act_mem.extract("Model B's own memory.")
    cube.act_mem.add([own])
    return cube.act_mem, lambda: cube.load(str(folder)), [own.id]


def _init_from_dir(folder, zoo):
    from memos.mem_cube.general import GeneralMemCube

    return None, lambda: GeneralMemCube.init_from_dir(str(folder),
                                                      default_config=cube_config(zoo["b"])), []


@pytest.mark.parametrize("path", [_kv_load, _cube_load, _init_from_dir],
                         ids=["KVCacheMemory.load", "GeneralMemCube.load", "init_from_dir"])
def test_another_producer_is_refused_by_every_load_path(sharded, zoo, path):
    memory, load, before = path(sharded, zoo)
    with pytest.raises(IdentityMismatch, match="(?i)activation .* was produced by a different model"):
        load()
    if memory is not None:
        assert [item.id for item in memory.get_all()] == before
