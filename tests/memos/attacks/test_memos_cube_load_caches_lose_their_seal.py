"""Adversary #37 item 1: privacy travels with each cache as its producer does.

Promise (docs/how-to/private-cubes.md "Private in MemOS", SECURITY.md "Private by construction
in MemOS"): a private cube's caches are registered with its seal, so a memory that takes one
(``KVCacheMemory.add``, a ``get_cache`` merge) is sealed and dumps private or refuses, after
ANY load path.

Attack: load a private cube with ``GeneralMemCube.load`` (and ``MOSCore.load``, which calls it)
under the hook, then copy its items into a fresh memory with MemOS's own ``KVCacheMemory.add``
(or add a ``get_cache`` merge of them), then dump that memory. No recipients are named and the
cube is unsigned, so every dump of its memories must be refused.

What happened: the hooked ``GeneralMemCube.load`` opens the private cube into a RAM folder and
lets MemOS's load call ``KVCacheMemory.load`` on that (clear) folder, which registers the
caches with no seal (only the memory instance is sealed). ``init_from_dir`` and a direct
``KVCacheMemory.load`` register them sealed; these two paths do not. The copy's dump writes
``activations/<id>.kv.safetensors`` in clear: the secret's source text in the header, its
token ids, its tensors.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import clear_cube, clear_files, private_copy  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


@pytest.fixture(scope="module")
def clear(zoo, tmp_path_factory):
    return clear_cube(zoo["a"], tmp_path_factory.mktemp("clear") / "cube")


def _loaded(how, private, zoo):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config, mos_for

    if how == "GeneralMemCube.load":
        cube = GeneralMemCube(cube_config(zoo["a"]))
        cube.load(str(private), ["act_mem"])
        return cube
    mos = mos_for(zoo["a"], zoo["a"], kind="MOSCore")
    mos.register_mem_cube(GeneralMemCube(cube_config(zoo["a"])), mem_cube_id="c1")
    mos.load(str(private), mem_cube_id="c1", memory_types=["act_mem"])
    return mos.mem_cubes["c1"]


@pytest.mark.parametrize("how", ["GeneralMemCube.load", "MOSCore.load"])
def test_a_cache_copied_out_of_a_cube_load_keeps_its_seal(how, clear, zoo, tmp_path,
                                                          monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.item import KVCacheItem

    from memos_live import cube_config

    keys = age_keys(tmp_path, "alice")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False)  # no recipients named; the cube is unsigned
    try:
        source = _loaded(how, private, zoo)
        items = source.act_mem.get_all()
        assert len(items) == 2
        copied = GeneralMemCube(cube_config(zoo["a"]))
        copied.act_mem.add(items)  # MemOS's own add, hooked
        merged = GeneralMemCube(cube_config(zoo["a"]))
        merged.act_mem.add([KVCacheItem(memory=source.act_mem.get_cache(
            [item.id for item in items]), metadata={})])
        for name, memory in (("copy", copied.act_mem), ("merge", merged.act_mem)):
            target = tmp_path / name
            with pytest.raises(CubepackError):
                memory.dump(str(target))
            assert not target.exists(), f"{how} -> add ({name}) -> dump wrote {target}"
    finally:
        hook.uninstall()
    assert clear_files(tmp_path / "copy") == []
