"""Brief of issue #32's fast path ("the error names the file the caller gave"): a private KV
file refused by age (wrong identity, damaged ciphertext) was named by its base name only,
while every refusal after decryption (IntegrityError, FormatError, IdentityMismatch) names the
path the caller gave. Two cubes' caches share their names (``activations/item-1.kv.
safetensors.age`` in each): "item-1.kv.safetensors.age is not encrypted to the identity
given" does not say which cube's file it was."""

from __future__ import annotations

import json

import pytest
from private_keys import age_keys

import cubepack
from cubepack._util import constants
from cubepack.errors import RefusedError
from cubepack.trust import _age as age

pytest.importorskip("pyrage")


def test_an_age_refusal_names_the_path_given(packed, models, tmp_path):
    keys = age_keys(tmp_path, "alice", "bob")
    lock = json.loads((packed / constants.LOCK_FILENAME).read_text())
    kv = packed / next(iter(lock["activations"].values()))["file"]
    plain = kv.read_bytes()
    paths = []
    for cube in ("cube-one", "cube-two"):
        path = tmp_path / cube / "activations" / (kv.name + ".age")
        path.parent.mkdir(parents=True)
        path.write_bytes(age.encrypt(plain, age.parse_recipients([keys["alice"][1]])))
        paths.append(path)
    damaged = bytearray(paths[1].read_bytes())
    damaged[-3] ^= 1
    paths[1].write_bytes(damaged)
    with pytest.raises(RefusedError, match="not encrypted to the identity") as stranger:
        cubepack.load_kv_cache(paths[0], models["a"], decrypt_with=keys["bob"][0])
    assert str(paths[0]) in str(stranger.value)
    with pytest.raises(RefusedError, match="fails authentication") as refused:
        cubepack.load_kv_cache(paths[1], models["a"], decrypt_with=keys["alice"][0])
    assert str(paths[1]) in str(refused.value)
