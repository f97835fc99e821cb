"""A merge of recomputed activations is never labelled ``recomputed`` (issue #37 item 5).

``KVCacheMemory.get_cache`` concatenates its items' caches; each part was the model's prefill
of its own tokens, but the merge is no prefill of their concatenation (the second part's
positions start at 0, and it never attended to the first). Its producer is its parts'
(recorded: this process saw each made), so that is the strongest label it carries, wherever
it goes (a chat, an item added back, a dump's KV header). Real MemoryOS, tiny model A.
"""

from __future__ import annotations

import json

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack.memos._use import produced

from memos_live import cube_config

TEXTS = ["The user is a Chinese man.", "He likes green tea and long walks."]


@pytest.fixture(scope="module")
def packed(zoo, tmp_path_factory):
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(text) for text in TEXTS])
    return hook.pack_cube(cube, tmp_path_factory.mktemp("packed") / "cube")


@pytest.mark.parametrize("how", ["recompute=True", "on_mismatch='rebuild'"])
def test_a_merge_of_recomputed_items_is_not_labelled_recomputed(packed, zoo, tmp_path, how):
    """The break: two items loaded with recompute=True (or rebuilt by the loading model) are
    each ``recomputed``; their get_cache merge took the weakest part's label, ``recomputed``,
    and a dump wrote it into the merge's KV header with the parts' ids concatenated."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.item import KVCacheItem

    hook.uninstall()
    if how == "recompute=True":
        hook.install(require_pin=False, recompute=True)
        source = packed
    else:  # every item rebuilt by the loading model (B's cube loaded into A)
        hook.install(require_pin=False, on_mismatch="rebuild")
        other = GeneralMemCube(cube_config(zoo["b"]))
        other.act_mem.add([other.act_mem.extract(text) for text in TEXTS])
        source = hook.pack_cube(other, tmp_path / "b")
    try:
        cube = GeneralMemCube(cube_config(zoo["a"]))
        cube.act_mem.load(str(source))
        items = cube.act_mem.get_all()
        assert len(items) == 2
        assert {produced(item.memory).provenance["kind"] for item in items} == {"recomputed"}
        merged = cube.act_mem.get_cache([item.id for item in items])
        label = produced(merged).provenance
        assert label["kind"] != "recomputed" and "merge" in label["detail"]
        target = GeneralMemCube(cube_config(zoo["a"]))
        target.act_mem.add([KVCacheItem(id="merged", memory=merged)])
        target.act_mem.dump(str(tmp_path / "dumped"))
        [written] = (tmp_path / "dumped" / "activations").glob("*.kv.safetensors")
        header = cubepack.read_kv_header(written).metadata
        assert json.loads(json.dumps(header))["provenance"]["kind"] != "recomputed"
    finally:
        hook.uninstall()
