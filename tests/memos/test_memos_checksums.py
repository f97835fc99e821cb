"""The MemOS hook checks each KV file's per-tensor checksums by default (#30 item 4), with the
real MemoryOS package: a flipped byte in any tensor of a packed cube (re-locked, so the lock's
sha256 agrees: a bad copy sealed again) or of a hooked dump without a lock is an IntegrityError
naming the tensor, nothing installed; a format-2 file loads, listed in ``unchecksummed``."""

from __future__ import annotations

import logging

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack.memos as hook
from cubepack import IntegrityError

from adversarial import relock_file
from helpers import as_format_2, flip_tensor_byte
from memos_live import cube_config

TEXTS = ["The user likes green tea.", "He walks every morning."]
TENSORS = [f"layers.{i}.{part}" for i in range(2) for part in ("keys", "values")]


def _cube(model):
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(model))


@pytest.fixture
def memory(installed, zoo):
    a = _cube(zoo["a"]).act_mem
    a.add([a.extract(text) for text in TEXTS])
    return a


def _packed(memory, folder):
    cube = _cube(memory.llm.config.model_name_or_path)
    cube.act_mem.kv_cache_memories = dict(memory.kv_cache_memories)
    return hook.pack_cube(cube, folder)


def _kv_files(folder):
    return sorted((folder / "activations").glob("*.kv.safetensors"))


@pytest.mark.parametrize("tensor", TENSORS)
def test_a_flipped_byte_in_a_packed_cube_is_refused_by_the_hook(memory, zoo, tmp_path, tensor):
    folder = _packed(memory, tmp_path / "cube")
    target = _kv_files(folder)[0]
    flip_tensor_byte(target, tensor)
    relock_file(folder, target.relative_to(folder).as_posix())
    fresh = _cube(zoo["a"]).act_mem
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer"):
        fresh.load(str(folder))
    assert fresh.get_all() == []


@pytest.mark.parametrize("tensor", TENSORS)
def test_a_flipped_byte_in_a_lockless_dump_is_refused_by_the_hook(memory, zoo, tmp_path, tensor):
    folder = _packed(memory, tmp_path / "lockless")
    (folder / "cubepack.lock").unlink()
    flip_tensor_byte(_kv_files(folder)[-1], tensor)
    fresh = _cube(zoo["a"]).act_mem
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer"):
        fresh.load(str(folder))
    assert fresh.get_all() == []


def test_format_2_files_load_unchecked_and_the_report_lists_them(memory, zoo, tmp_path, caplog):
    folder = _packed(memory, tmp_path / "old")
    (folder / "cubepack.lock").unlink()
    for path in _kv_files(folder):
        as_format_2(path, path)
    fresh = _cube(zoo["a"]).act_mem
    with caplog.at_level(logging.WARNING, logger="cubepack.memos"):
        fresh.load(str(folder))
    assert len(fresh.get_all()) == 2
    assert sorted(fresh.cubepack.unchecksummed) == sorted(item.id for item in fresh.get_all())
    assert any("no per-tensor checksums (format v2)" in r.getMessage() for r in caplog.records)


def test_format_3_files_are_not_listed_as_unchecked(memory, zoo, tmp_path):
    folder = _packed(memory, tmp_path / "new")
    fresh = _cube(zoo["a"]).act_mem
    fresh.load(str(folder))
    assert len(fresh.get_all()) == 2 and fresh.cubepack.unchecksummed == []
