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
from cubepack.errors import FormatError, RefusedError
from cubepack.ops._private import decrypted_file, decrypted_memory
from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream

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


def test_a_damaged_private_kv_file_is_refused_by_type_on_every_load_path(packed, models, tmp_path,
                                                                           agekeys):
    """The ciphertext is mapped, not read: a refusal must not leave the map exported (closing
    it then raised BufferError, an untyped error, in place of the refusal)."""
    lock = json.loads((packed / constants.LOCK_FILENAME).read_text())
    kv = packed / next(iter(lock["activations"].values()))["file"]
    plain = kv.read_bytes()
    # Past a chunk boundary (the refusals come before it is read as a KV file).
    plain += bytes(-len(plain) % stream.CHUNK + stream.CHUNK)
    good = age.encrypt(plain, age.parse_recipients([agekeys["bob"][1]]))
    start = good.index(b"\n", good.index(b"\n--- ") + 1) + 1 + 16
    flipped = bytearray(good)
    flipped[-20] ^= 1
    cases = {
        "a flipped byte": (flipped, RefusedError),
        "cut at a chunk boundary": (good[:start + stream.CHUNK + stream.TAG], RefusedError),
        "cut to less than a tag": (good[:start + stream.CHUNK + stream.TAG + 5], FormatError),
        "no payload": (good[:start - 16], FormatError),
        "empty": (b"", FormatError),
    }
    key = agekeys["bob"][0]
    for name, (bad, error) in cases.items():
        target = tmp_path / f"{name.replace(' ', '-')}.kv.safetensors.age"
        target.write_bytes(bad)
        with pytest.raises(error):
            cubepack.load_kv_cache(target, models["a"], decrypt_with=key)
        with pytest.raises(error):
            decrypted_memory(target, key)
        with pytest.raises(error), decrypted_file(target, key):
            pass
