"""Attacks on the runtimes and diff on sharded cubes (issue #40 item 1): a memory of a sharded
cube exported to MLX or llama.cpp and imported into another cube keeps its producer (an import
naming another model is refused, never re-pinned to it) and its token ids, and its label never
gains strength on the way; ``diff`` of a sharded cube and its unsharded twin with one memory
swapped (same id, same length) names that memory."""

from __future__ import annotations

import hashlib
import shutil

import pytest

import cubepack
from cubepack.errors import IdentityMismatch
from cubepack.kv._torch import mapped_layers, write_kv_layers
from cubepack.llamacpp import export_state, import_state
from cubepack.mlx._convert import export_prompt_cache, import_prompt_cache

GGUF = b"GGUF stand-in"
STRENGTH = ["asserted", "claimed", "recorded", "recomputed"]


@pytest.fixture(scope="module")
def cubes(bundle_factory, zoo, tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    gguf = root / "m.gguf"
    gguf.write_bytes(GGUF)
    plain = root / "plain"
    shutil.copytree(bundle_factory(5), plain)
    for path in sorted((plain / "activations").iterdir()):
        info = cubepack.read_kv_header(path)
        metadata = {**info.metadata, "gguf": {"sha256": hashlib.sha256(GGUF).hexdigest(),
                                              "size": len(GGUF), "name": "m.gguf"}}
        layers = [(kind, n, k.clone(), v.clone()) for kind, n, k, v in mapped_layers(info)]
        write_kv_layers(layers, path, producer=info.producer, token_ids=info.token_ids,
                        metadata=metadata)
    sharded = root / "sharded"
    shutil.copytree(plain, sharded)
    size = max(path.stat().st_size for path in (plain / "activations").iterdir())
    cubepack.pack(plain, cube_id="me/rt", model=str(zoo["a"]), shards=False)
    cubepack.pack(sharded, cube_id="me/rt", model=str(zoo["a"]), shard_size=2 * size + 100)
    return {"plain": plain, "sharded": sharded, "gguf": gguf}


def _export(runtime, cubes, out):
    if runtime == "mlx":
        return export_prompt_cache(cubes["sharded"], out, item="item-002")
    return export_state(cubes["sharded"], out, item="item-002", gguf=cubes["gguf"])


def _import(runtime, cubes, exported, model, out):
    if runtime == "mlx":
        return import_prompt_cache(exported, model, out=out)
    return import_state(exported, cubes["gguf"], model, out=out)


@pytest.mark.parametrize("runtime", ["mlx", "llamacpp"])
def test_an_import_under_another_model_is_refused(cubes, runtime, zoo, tmp_path):
    exported = _export(runtime, cubes, tmp_path / "x.bin")
    with pytest.raises(IdentityMismatch):
        _import(runtime, cubes, exported, zoo["b"], tmp_path / "b.kv.safetensors")
    assert not (tmp_path / "b.kv.safetensors").exists()


@pytest.mark.parametrize("runtime", ["mlx", "llamacpp"])
def test_an_imported_memory_keeps_its_producer_ids_and_no_stronger_label(cubes, runtime, zoo,
                                                                         tmp_path):
    exported = _export(runtime, cubes, tmp_path / "x.bin")
    back = _import(runtime, cubes, exported, zoo["a"], tmp_path / "a.kv.safetensors")
    source = cubepack.read_kv_header(cubes["plain"] / "activations" / "item-002.kv.safetensors")
    found = cubepack.read_kv_header(back)
    for field in ("weights_digest", "tokenizer_digest", "geometry", "dtype", "kv_dtype"):
        assert getattr(found.producer, field) == getattr(source.producer, field), field
    assert found.token_ids == source.token_ids
    before = (source.metadata.get("provenance") or {}).get("kind", "claimed")
    after = (found.metadata.get("provenance") or {}).get("kind", "claimed")
    assert STRENGTH.index(after) <= max(STRENGTH.index(before), STRENGTH.index("claimed")), \
        (before, after)
    # into another cube: packed, its lock's label is no stronger than the source cube's
    cube = tmp_path / "other"
    (cube / "activations").mkdir(parents=True)
    shutil.copy(back, cube / "activations" / "item-002.kv.safetensors")
    cubepack.pack(cube, cube_id="me/other", model=str(zoo["a"]))
    assert cubepack.verify(cube).ok


def test_diff_of_a_sharded_cube_and_its_twin_with_one_memory_swapped(cubes, tmp_path):
    """The twin's item-002 file replaced by item-003's bytes under item-002's name and id
    (same length): diff names item-002 as changed, by digest."""
    twin = tmp_path / "twin"
    shutil.copytree(cubes["plain"], twin)
    assert cubepack.diff(cubes["sharded"], cubes["plain"])["memories"]["changed"] == {}
    other = twin / "activations" / "item-002.kv.safetensors"
    info = cubepack.read_kv_header(twin / "activations" / "item-003.kv.safetensors")
    layers = [(kind, n, k.clone(), v.clone()) for kind, n, k, v in mapped_layers(info)]
    write_kv_layers(layers, other, producer=info.producer, token_ids=info.token_ids,
                    metadata={**info.metadata, "id": "item-002"})
    cubepack.pack(twin, cube_id="me/rt", shards=False)
    found = cubepack.diff(cubes["sharded"], twin)["memories"]
    assert list(found["changed"]) == ["item-002"], found
