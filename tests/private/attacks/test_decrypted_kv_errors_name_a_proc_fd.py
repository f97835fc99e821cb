"""Principles ("errors ... say expected vs found and a fix that works", naming what failed)
on promise 4's path: ``load_kv_cache(path, model, decrypt_with=KEY)`` loads the plaintext
from ``/proc/self/fd/N``, and its refusals name that instead of the file the caller gave:
"KV cache 5 was produced by a different model". With several private KV files loaded, the
reader cannot tell which one was refused."""

from __future__ import annotations

import json

import pytest
from private_keys import age_keys, private_copy

import cubepack
from cubepack._util import constants
from cubepack.errors import IdentityMismatch


def test_a_refused_private_kv_file_is_named_by_its_path(packed, models, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    clear = json.loads((packed / constants.LOCK_FILENAME).read_text())
    kv = next(iter(clear["activations"].values()))["file"] + ".age"
    with pytest.raises(IdentityMismatch) as refused:
        cubepack.load_kv_cache(cube / kv, models["b"], decrypt_with=keys["alice"][0])
    assert kv.rsplit("/", 1)[-1].split(".")[0] in str(refused.value), str(refused.value)
