"""The MemOS hook on a partial cube (``cubepack pull --include``, issue #40 item 2), with the
real MemoryOS package: it loads the memories present, each checked as in a whole cube, and
installs no other."""

from __future__ import annotations

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack.format import _partial as partialformat

from data import HUB_TOKEN
from memos_live import cube_config

TEXTS = ["The user likes green tea.", "He walks every morning.", "Paris is lovely in May."]


def _cube(model):
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(model))


def test_the_hook_loads_the_memories_a_partial_pull_placed(installed, zoo, tmp_path):
    from cubepack.testing.hub import InstrumentedHub

    source = _cube(zoo["a"]).act_mem
    source.add([source.extract(text) for text in TEXTS])
    cube = _cube(zoo["a"])
    cube.act_mem.kv_cache_memories = dict(source.kv_cache_memories)
    folder = hook.pack_cube(cube, tmp_path / "cube")
    cubepack.pack(folder, shards=True)
    wanted = sorted(source.kv_cache_memories)[1]
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        cubepack.push(folder, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                      allow_local_paths=True)
        cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                      local_dir=tmp_path / "part", include=[wanted])
    assert set(partialformat.read(tmp_path / "part").memories) == {wanted}
    fresh = _cube(zoo["a"]).act_mem
    fresh.load(str(tmp_path / "part"))
    assert [item.id for item in fresh.get_all()] == [wanted]
