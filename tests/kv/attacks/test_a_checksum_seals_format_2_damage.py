"""Issue #37 item 4: a checksum never seals damage. A format-2 KV file carries no per-tensor
checksums, so its bytes are vouched for only by its cube's lock (sha256). Every step that
writes fresh checksums over its bytes (pack's lock, a format-3 header, a llama.cpp session's
pin) must check them first: pack against the cube's lock, and the MLX / llama.cpp conversions,
which are given a file and no lock, refuse it naming the upgrade (which, for a cube, checks the
lock first).

Before the fix: a re-pack of a format-2 cube whose KV file had a flipped bit sealed the damage
into a fresh lock (verify then passed), a lockless bundle of format-2 files was sealed without
a word, and an MLX export and import (or a llama.cpp export and its pinned session) of a
format-2 file wrote fresh checksums over bytes nothing had checked."""

from __future__ import annotations

import json
import struct

import pytest
import torch

import cubepack
from cubepack import FormatError, IntegrityError
from cubepack._util import constants, hashing

from adversarial import ITEM, OTHER, relock_file
from helpers import as_format_2, build_cache, flip_tensor_byte, rewrite_kv_metadata

ITEMS = (ITEM, OTHER)


@pytest.fixture
def v2_cube(cube):
    """The packed cube as cubepack 0.2 left it: format-2 KV files, an honest lock."""
    for name in ITEMS:
        as_format_2(cube / name, cube / name)
        relock_file(cube, name)
    assert cubepack.verify(cube).ok
    return cube


def lock_of(cube):
    return json.loads((cube / constants.LOCK_FILENAME).read_text())


def test_pack_refuses_to_seal_a_format_2_file_its_lock_does_not_vouch_for(v2_cube):
    listed = lock_of(v2_cube)["files"][ITEM]["sha256"]
    flip_tensor_byte(v2_cube / ITEM, "layers.0.keys")  # bit rot: no checksum of its own sees it
    found = hashing.sha256_file(v2_cube / ITEM)
    before = (v2_cube / constants.LOCK_FILENAME).read_bytes()
    with pytest.raises(IntegrityError) as refused:
        cubepack.pack(v2_cube)
    message = str(refused.value)
    assert ITEM in message and "format v2" in message
    assert f"expected {listed}" in message and f"found {found}" in message
    assert (v2_cube / constants.LOCK_FILENAME).read_bytes() == before  # nothing sealed
    with pytest.raises(cubepack.VerificationFailed, match="sha256"):
        cubepack.verify(v2_cube)  # still seen as damage


def test_pack_of_an_honest_format_2_cube_names_the_command_that_upgrades_it(v2_cube, zoo):
    result = cubepack.pack(v2_cube)
    command = f"cubepack upgrade {v2_cube} --model"
    assert sorted(result.unchecksummed) == ["item-1", "item-2"]
    assert all(command in note for note in result.unchecksummed.values())
    assert result.to_dict()["unchecksummed"] == result.unchecksummed
    assert cubepack.verify(v2_cube).ok
    # and the command it names, run as named, upgrades the cube
    note = result.unchecksummed["item-1"]
    model = note.split("--model ", 1)[1].split()[0]
    assert model == str(zoo["a"])
    cubepack.upgrade(v2_cube, model)
    assert cubepack.read_kv_header(v2_cube / ITEM).version == constants.KV_FORMAT_VERSION


def test_the_cli_names_the_upgrade_after_packing_a_format_2_cube(v2_cube, capsys):
    from cubepack.cli import main

    assert main(["pack", str(v2_cube)]) == 0
    out = capsys.readouterr().out
    for item in ("item-1", "item-2"):
        line = next(line for line in out.splitlines() if line.strip().startswith(
            f"unchecked {item}:"))
        assert "format v2" in line and f"add them: cubepack upgrade {v2_cube} --model" in line
    assert main(["pack", str(v2_cube), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data["unchecksummed"]) == ["item-1", "item-2"]


@pytest.mark.parametrize("how", ["no lock", "not listed"])
def test_pack_refuses_format_2_files_no_lock_vouches_for(v2_cube, how):
    if how == "no lock":
        (v2_cube / constants.LOCK_FILENAME).unlink()
    else:  # a format-2 file added to a packed cube after its lock was written
        rewrite_kv_metadata(v2_cube / ITEM, v2_cube / "activations/item-3.kv.safetensors",
                            lambda meta: meta["metadata"].update(id="item-3"))
    listing = sorted(p.relative_to(v2_cube) for p in v2_cube.rglob("*"))
    with pytest.raises(FormatError) as refused:
        cubepack.pack(v2_cube)
    message = str(refused.value)
    assert "format v2" in message and "cubepack upgrade" in message and "--recompute" in message
    assert sorted(p.relative_to(v2_cube) for p in v2_cube.rglob("*")) == listing


def test_pack_recompute_seals_only_the_prefill_it_ran(models, zoo, tmp_path):
    """A plain bundle of format-2 files and no lock: refused, except with --recompute, which
    writes each cache from the producer's own prefill: the bytes it seals are ones this pack
    computed, so no lock is needed to vouch for the old ones."""
    bundle = tmp_path / "bundle"
    (bundle / "activations").mkdir(parents=True)
    for name, ids in {"intro": [1, 17, 42, 7], "faq": [3, 4, 5, 6, 200]}.items():
        path = bundle / "activations" / f"{name}.kv.safetensors"
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])), path,
                               producer=models["a"], token_ids=ids)
        as_format_2(path, path)
    with pytest.raises(FormatError, match="format v2"):
        cubepack.pack(bundle, cube_id="me/docs", model=zoo["a"])
    assert sorted(p.name for p in bundle.iterdir()) == ["activations"]
    result = cubepack.pack(bundle, cube_id="me/docs", model=zoo["a"], recompute=True)
    assert sorted(result.recomputed) == ["faq", "intro"] and not result.unchecksummed
    for path in (bundle / "activations").iterdir():
        assert cubepack.read_kv_header(path).version == constants.KV_FORMAT_VERSION
    assert cubepack.verify(bundle, model=str(zoo["a"])).ok


@pytest.fixture
def v2_file(models, tmp_path):
    ids = [3, 17, 42, 9, 250, 11, 64]
    cache = build_cache(models["a"], torch.tensor([ids]))
    kv = cubepack.save_kv_cache(cache, tmp_path / "t.kv.safetensors", producer=models["a"],
                                token_ids=ids)
    return as_format_2(kv, tmp_path / "old.kv.safetensors")


def test_the_mlx_export_of_a_format_2_file_is_refused_naming_the_upgrade(v2_file, tmp_path):
    from cubepack.mlx import export_prompt_cache

    with pytest.raises(FormatError, match=r"format v2.*cubepack upgrade .*old\.kv\.safetensors "
                                          r"--model MODEL"):
        export_prompt_cache(v2_file, tmp_path / "prompt.safetensors")
    assert not (tmp_path / "prompt.safetensors").exists()


def _carrying_format_2(prompt):
    """A prompt cache as an older cubepack exported it from a format-2 file: the KV metadata
    it carries is version 2, without checksums."""
    raw = prompt.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    meta = json.loads(header["__metadata__"]["0.cubepack"])
    meta["version"] = 2
    del meta["checksums"]
    header["__metadata__"]["0.cubepack"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    prompt.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])
    return prompt


def test_the_mlx_import_of_a_prompt_cache_carrying_format_2_is_refused(models, zoo, tmp_path):
    from cubepack.mlx import export_prompt_cache, import_prompt_cache

    ids = [3, 17, 42, 9, 250, 11, 64]
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                                tmp_path / "t.kv.safetensors", producer=models["a"],
                                token_ids=ids)
    prompt = _carrying_format_2(export_prompt_cache(kv, tmp_path / "prompt.safetensors"))
    flip_tensor_byte(prompt, "0.0")  # damage nothing records
    with pytest.raises(FormatError, match=r"format v2.*cubepack upgrade"):
        import_prompt_cache(prompt, zoo["a"], out=tmp_path / "back.kv.safetensors")
    assert not (tmp_path / "back.kv.safetensors").exists()


def test_the_llamacpp_export_of_a_format_2_file_is_refused_naming_the_upgrade(models, zoo,
                                                                              tmp_path):
    from cubepack.llamacpp import export_state, import_state
    from cubepack.llamacpp._convert import state_bytes

    ids = [3, 17, 42, 9, 250, 11, 64]
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                                tmp_path / "t.kv.safetensors", producer=models["a"],
                                token_ids=ids)
    session = tmp_path / "s.bin"
    session.write_bytes(state_bytes(kv, v_trans=True)[0])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    pinned = import_state(session, gguf, zoo["a"], out=tmp_path / "pinned.kv.safetensors")
    old = as_format_2(pinned, tmp_path / "old.kv.safetensors")
    with pytest.raises(FormatError, match=r"format v2.*cubepack upgrade .*old\.kv\.safetensors "
                                          r"--model MODEL"):
        export_state(old, tmp_path / "x.state", gguf=gguf)
    assert not (tmp_path / "x.state").exists()
    assert not (tmp_path / "x.state.cubepack.json").exists()
