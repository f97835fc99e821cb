"""The one hashing mechanism: files (mapped or read) and streams as they are written."""

from __future__ import annotations

import hashlib
import os

import pytest

from cubepack._util import hashing
from cubepack._util.hashing import hash_files, sha256_file

from envs import once

pytestmark = once

SIZES = [0, 1, hashing._READ_SIZE + 3, hashing._MAP_FROM - 1, hashing._MAP_FROM,
         hashing._MAP_FROM + hashing._MAP_WINDOW + 5]


@pytest.mark.parametrize("size", SIZES)
def test_a_file_hashes_as_hashlib_does_mapped_or_read_with_every_byte_reported(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    reported: list[int] = []
    assert sha256_file(path, reported.append) == hashlib.sha256(data).hexdigest()
    assert sum(reported) == size


def test_bytes_a_file_gains_after_it_was_opened_are_hashed_too(tmp_path, monkeypatch):
    path = tmp_path / "growing"
    path.write_bytes(b"a" * hashing._MAP_FROM)
    real = hashing._hash_mapped

    def grow_then_map(digest, handle, size, on_bytes):
        with open(path, "ab") as more:
            more.write(b"tail")
        return real(digest, handle, size, on_bytes)

    monkeypatch.setattr(hashing, "_hash_mapped", grow_then_map)
    assert sha256_file(path) == hashlib.sha256(b"a" * hashing._MAP_FROM + b"tail").hexdigest()


def test_a_file_that_cannot_be_mapped_is_read(tmp_path, monkeypatch):
    data = os.urandom(hashing._MAP_FROM + 7)
    (tmp_path / "f").write_bytes(data)

    def refuse(*args, **kwargs):
        raise OSError("no mapping here")

    monkeypatch.setattr(hashing.mmap, "mmap", refuse)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_hash_files_hashes_every_file_largest_first_with_a_pool(tmp_path):
    files = {}
    for index, size in enumerate([10, hashing._MAP_FROM * 2, 0, 12345]):
        path = tmp_path / f"f{index}"
        data = os.urandom(size)
        path.write_bytes(data)
        files[path] = hashlib.sha256(data).hexdigest()
    assert hash_files(list(files), progress=False, workers=2) == files
