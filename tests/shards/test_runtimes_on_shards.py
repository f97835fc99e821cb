"""The other runtimes' verbs on sharded cubes (issue #40 item 1), swept over every verb and
both layouts: ``export`` (MLX prompt cache, llama.cpp session) takes a memory of a cube by its
id, from a shard's range or its own file, checked against the lock (and its index) before a
byte is written; ``import`` writes a KV file that ``pack`` places into a sharded cube's shards.
The conversions run without MLX or llama.cpp (their layouts are cubepack's own)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import cubepack
from cubepack.cli import cli
from cubepack.errors import IntegrityError, UsageError
from cubepack.kv._torch import mapped_layers
from cubepack.llamacpp import export_state, import_state
from cubepack.mlx._convert import export_prompt_cache, import_prompt_cache

GGUF = b"GGUF stand-in"


@pytest.fixture(scope="module")
def cubes(bundle_factory, zoo, tmp_path_factory):
    """The same 5 memories, each pinned to a GGUF (llama.cpp's export needs one, as its import
    records), packed one file a memory and two a shard."""
    root = tmp_path_factory.mktemp("runtimes")
    gguf = root / "m.gguf"
    gguf.write_bytes(GGUF)
    plain = root / "plain"
    shutil.copytree(bundle_factory(5), plain)
    for path in sorted((plain / "activations").iterdir()):
        _pin_to_gguf(path)
    sharded = root / "sharded"
    shutil.copytree(plain, sharded)
    size = max(path.stat().st_size for path in (plain / "activations").iterdir())
    cubepack.pack(plain, cube_id="me/rt", model=str(zoo["a"]), shards=False)
    cubepack.pack(sharded, cube_id="me/rt", model=str(zoo["a"]), shard_size=2 * size + 100)
    assert (sharded / "shards").is_dir() and not (sharded / "activations").exists()
    return {"plain": plain, "sharded": sharded, "gguf": gguf}


def _pin_to_gguf(kv):
    """Rewrite the KV file ``kv`` with the GGUF pin llama.cpp's import records."""
    import hashlib

    from cubepack.kv._torch import write_kv_layers

    info = cubepack.read_kv_header(kv)
    metadata = {**info.metadata, "gguf": {"sha256": hashlib.sha256(GGUF).hexdigest(),
                                          "size": len(GGUF), "name": "m.gguf"}}
    layers = [(kind, n, k.clone(), v.clone()) for kind, n, k, v in mapped_layers(info)]
    write_kv_layers(layers, kv, producer=info.producer, token_ids=info.token_ids,
                    metadata=metadata)


def _layers(path):
    return mapped_layers(cubepack.read_kv_header(path))


def _equal(a, b):
    return all(torch.equal(x[2], y[2]) and torch.equal(x[3], y[3]) for x, y in zip(a, b))


EXPORTS = {
    "mlx": lambda cube, item, out, gguf: export_prompt_cache(cube, out, item=item),
    "llamacpp": lambda cube, item, out, gguf: export_state(cube, out, item=item, gguf=gguf),
}


@pytest.mark.parametrize("layout", ["plain", "sharded"])
@pytest.mark.parametrize("runtime", sorted(EXPORTS))
def test_every_export_takes_a_memory_of_either_layout(cubes, layout, runtime, tmp_path, zoo):
    out = EXPORTS[runtime](cubes[layout], "item-003", tmp_path / "out.bin", cubes["gguf"])
    back = tmp_path / "back.kv.safetensors"
    if runtime == "mlx":
        import_prompt_cache(out, zoo["a"], out=back)
    else:
        import_state(out, cubes["gguf"], zoo["a"], out=back)
    assert _equal(_layers(back), _layers(cubes["plain"] / "activations" /
                                         "item-003.kv.safetensors"))


@pytest.mark.parametrize("runtime", sorted(EXPORTS))
def test_an_export_of_a_swapped_range_is_refused_and_nothing_written(cubes, runtime, tmp_path):
    cube = tmp_path / "cube"
    shutil.copytree(cubes["sharded"], cube)
    index = json.loads((cube / "shards/activations-00001.index.json").read_text())
    memory = index["memories"]["item-003"]
    shard = cube / "shards/activations-00001.kvshard"
    data = bytearray(shard.read_bytes())
    data[memory["offset"] + memory["length"] - 1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="item-003"):
        EXPORTS[runtime](cube, "item-003", tmp_path / "out.bin", cubes["gguf"])
    assert not (tmp_path / "out.bin").exists()
    with pytest.raises(UsageError, match="item-009"):
        EXPORTS[runtime](cube, "item-009", tmp_path / "out.bin", cubes["gguf"])


@pytest.mark.parametrize("runtime", sorted(EXPORTS))
def test_every_import_goes_into_a_sharded_cube(cubes, runtime, tmp_path, zoo, models):
    """A converted cache written into a sharded cube's activations/ is sharded by pack, and
    the cube verifies; an id a shard already holds is refused by pack, naming both."""
    exported = EXPORTS[runtime](cubes["plain"], "item-002", tmp_path / "x.bin", cubes["gguf"])
    cube = tmp_path / "cube"
    shutil.copytree(cubes["sharded"], cube)
    target = cube / "activations" / "item-007.kv.safetensors"
    target.parent.mkdir()
    named = {"id": "item-007"}  # the id its KV header carries (item-002's, else)
    if runtime == "mlx":
        import_prompt_cache(exported, zoo["a"], out=target, metadata=named)
    else:
        import_state(exported, cubes["gguf"], zoo["a"], out=target, metadata=named)
    cubepack.pack(cube)
    assert not (cube / "activations").exists()
    assert cubepack.verify(cube).ok
    assert cubepack.load_kv_cache(cube, models["a"], item="item-007") is not None
    again = cube / "activations" / "item-002.kv.safetensors"
    again.parent.mkdir()
    if runtime == "mlx":
        import_prompt_cache(exported, zoo["a"], out=again)
    else:
        import_state(exported, cubes["gguf"], zoo["a"], out=again)
    with pytest.raises(UsageError, match="item-002"):
        cubepack.pack(cube)


@pytest.mark.parametrize("runtime", sorted(EXPORTS))
def test_the_cli_exports_a_memory_of_a_sharded_cube(cubes, runtime, tmp_path):
    from click.testing import CliRunner

    args = ["export", runtime, str(cubes["sharded"]), "--item", "item-001", "--out",
            str(tmp_path / "o.bin"), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["path"] == str(tmp_path / "o.bin")
    refused = CliRunner().invoke(cli, ["export", runtime, str(cubes["sharded"]), "--out",
                                       str(tmp_path / "p.bin"), "--json"])
    assert refused.exit_code != 0 and "--item" in str(refused.exception)
