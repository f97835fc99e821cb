"""A private cube's KV file loads into MLX decrypted to memory only (issue #32)."""

from __future__ import annotations

import os
import tempfile

import numpy
import pytest
import torch

pyrage = pytest.importorskip("pyrage")

import cubepack
import cubepack.mlx
from cubepack.trust import _age as age

from helpers import build_cache

IDS = [1, 17, 42, 7, 99, 5, 300, 12]


def test_an_encrypted_kv_file_loads_into_mlx_as_the_clear_one(models, mlx_models, tmp_path,
                                                               monkeypatch):
    identity = pyrage.x25519.Identity.generate()
    key = tmp_path / "key"
    key.write_text(f"{identity}\n")
    os.chmod(key, 0o600)
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS])),
                                tmp_path / "a.kv.safetensors", producer=models["a"], token_ids=IDS)
    encrypted = tmp_path / "a.kv.safetensors.age"
    encrypted.write_bytes(age.encrypt(kv.read_bytes(),
                                      age.parse_recipients([str(identity.to_public())])))
    spool = tmp_path / "tmpdir"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    ours = cubepack.mlx.load_prompt_cache(encrypted, mlx_models["a"], decrypt_with=key)
    clear = cubepack.mlx.load_prompt_cache(kv, mlx_models["a"])
    assert numpy.array_equal(numpy.array(ours[0].keys), numpy.array(clear[0].keys))
    assert list(spool.iterdir()) == []
