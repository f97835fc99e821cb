"""Issue #37 item 1: "cubepack's writers refuse private input". Principle 4: "What a loaded
memory carries (its producer, its privacy) travels with it to every place that uses or writes
it." SECURITY.md: "cubepack's own writers (`pack`, `migrate`, `upgrade`, `export`) refuse a
private cube or KV file by name: none writes a private memory's plaintext to a file."

The attack: a program loads a private cube's KV cache the documented way
(``cubepack.load_kv_cache(..., decrypt_with=KEY)``, in memory only) and hands the cache to
cubepack's own KV writer, ``cubepack.save_kv_cache`` (the README's quick start). The loaded
cache carries nothing of its privacy: ``save_kv_cache`` writes it to disk in clear, a plain
safetensors file whose tensors are the private cache's (a KV cache can be inverted back to its
prompt: private-cubes.md), where the same cache through the MemOS hook's writers is sealed."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from private_keys import age_keys

import cubepack
from cubepack._util import constants
from cubepack.errors import CubepackError
from cubepack.ops._encrypt import encrypt


def test_save_kv_cache_refuses_a_cache_loaded_from_a_private_file(packed, tmp_path, models):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    clear_lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    kv_name = sorted(name for name in clear_lock["files"] if name.endswith(".kv.safetensors"))[0]
    encrypt(cube, [keys["alice"][1]])
    private = cube / f"{kv_name}.age"
    assert private.is_file() and not (cube / kv_name).exists()
    loaded = cubepack.load_kv_cache(private, models["a"], decrypt_with=keys["alice"][0])
    out = tmp_path / "elsewhere" / "copy.kv.safetensors"
    out.parent.mkdir()
    try:
        cubepack.save_kv_cache(loaded, out, producer=models["a"])
    except CubepackError:
        assert not out.exists()
        return
    same = _holds_tensors_of(out, loaded)
    assert not same, f"save_kv_cache wrote the private cache's tensors in clear to {out}"


def _holds_tensors_of(path, cache) -> bool:
    from safetensors.torch import load_file

    written = load_file(str(path))
    keys0 = cache.layers[0].keys if hasattr(cache, "layers") else cache.key_cache[0]
    return torch.equal(written["layers.0.keys"], keys0.cpu())


def test_save_kv_cache_refuses_a_sealed_memorys_cache_under_the_memos_hook(zoo, tmp_path,
                                                                           monkeypatch):
    """The same through the MemOS hook: the cache is registered with the cube's seal (a
    ``KVCacheMemory.add`` of it seals the memory it enters), yet cubepack's own writer takes it
    and writes its tensors, and the secret source text the caller hands with it, in clear."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from private_memos_adv import SECRET, alices_private_cube, clear_files

    import cubepack.memos as hook

    keys, private = alices_private_cube(zoo["a"], tmp_path, monkeypatch)
    try:
        cube = hook.init_from_dir(private)
        item = next(item for item in cube.act_mem.get_all()
                    if SECRET in str(item.metadata))
        out = tmp_path / "elsewhere" / "copy.kv.safetensors"
        out.parent.mkdir()
        try:
            cubepack.save_kv_cache(item.memory, out, producer=zoo["a"],
                                   metadata=dict(item.metadata))
        except CubepackError:
            assert not out.exists()
            return
    finally:
        hook.uninstall()
    assert clear_files(out.parent) == [], f"{out} holds the secret in clear"
