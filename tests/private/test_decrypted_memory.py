"""Where ``load_kv_cache(..., decrypt_with=KEY)`` puts the plaintext: private anonymous memory,
decrypted into once and viewed by every tensor (no second copy), kept out of core dumps (a
crash must not write it to a disk), never a file."""

from __future__ import annotations

import ctypes
import json
import sys

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.ops._private import decrypted_memory
from cubepack.trust import _age as age

pytest.importorskip("pyrage")


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                begin, end = (int(part, 16) for part in head.split("-"))
                inside = begin <= address < end
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_private_kv_file_is_decrypted_once_and_its_tensors_view_it(packed, models, tmp_path,
                                                                       agekeys):
    lock = json.loads((packed / constants.LOCK_FILENAME).read_text())
    kv = packed / next(iter(lock["activations"].values()))["file"]
    encrypted = tmp_path / (kv.name + ".age")
    encrypted.write_bytes(age.encrypt(kv.read_bytes(), age.parse_recipients([agekeys["bob"][1]])))

    plain = decrypted_memory(encrypted, agekeys["bob"][0])
    assert bytes(plain) == kv.read_bytes()

    cache = cubepack.load_kv_cache(encrypted, models["a"], decrypt_with=agekeys["bob"][0])
    clear = cubepack.load_kv_cache(kv, models["a"])
    storages = set()
    for mine, theirs in zip(cache.layers, clear.layers, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
        storages |= {mine.keys.untyped_storage().data_ptr(),
                     mine.values.untyped_storage().data_ptr()}
    assert len(storages) == 1  # one buffer under every tensor: views, not copies


@pytest.mark.skipif(sys.platform != "linux", reason="smaps and MADV_DONTDUMP are Linux's")
def test_the_plaintext_memory_is_kept_out_of_core_dumps(tmp_path, agekeys):
    encrypted = tmp_path / "f.age"
    secret = b"private memory " * 300_000  # 4.5 MB: the parallel path
    encrypted.write_bytes(age.encrypt(secret, age.parse_recipients([agekeys["alice"][1]])))
    plain = decrypted_memory(encrypted, agekeys["alice"][0])
    assert plain[:len(secret)] == secret and len(plain) == len(secret)
    address = ctypes.addressof(ctypes.c_char.from_buffer(plain))
    assert "dd" in _vm_flags(address)  # MADV_DONTDUMP
