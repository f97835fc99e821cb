"""load_adapter on a private cube: PEFT reads the decrypted adapter from a RAM folder."""

from __future__ import annotations

import shutil
import tempfile

import pytest
import torch

pytest.importorskip("peft")

import cubepack
from cubepack import UsageError
from cubepack.ops._encrypt import encrypt
from cubepack.testing import tiny

from helpers import make_adapter

IDS = torch.tensor([[3, 17, 42, 5, 99, 7, 250]])


def test_a_private_adapter_applies_as_the_clear_one_and_touches_no_disk(zoo, tmp_path, agekeys,
                                                                        monkeypatch):
    adapter = make_adapter(zoo["a"], tmp_path / "adapter")
    cube = tmp_path / "cube"
    shutil.copytree(adapter, cube / "parametric" / "lora")
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    clear = cube.with_name("clear")
    shutil.copytree(cube, clear)
    encrypt(cube, [agekeys["alice"][1]], hide_names=True)
    spool = tmp_path / "tmpdir"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    with pytest.raises(UsageError, match="private cube"):
        cubepack.load_adapter(tiny.load(zoo["a"]), cube, "lora")
    applied = cubepack.load_adapter(tiny.load(zoo["a"]), cube, "lora",
                                    decrypt_with=agekeys["alice"][0])
    assert list(spool.iterdir()) == []
    expected = cubepack.load_adapter(tiny.load(zoo["a"]), clear, "lora")
    with torch.no_grad():
        assert torch.equal(applied(IDS).logits, expected(IDS).logits)
