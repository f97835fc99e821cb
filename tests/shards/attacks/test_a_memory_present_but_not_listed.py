"""Bytes a partial cube's marker does not list: a memory written into its place in a sparse
shard, or a whole file of a memory not pulled, is refused, not counted as checked."""

from __future__ import annotations

import shutil

import pytest

import cubepack
from cubepack.errors import VerificationFailed

SHARD1 = "shards/activations-00001.kvshard"


def test_a_memory_written_into_its_range_of_a_sparse_shard(partial, sharded):
    whole = (sharded / SHARD1).read_bytes()
    other = whole[len(whole) // 2 + 100:]  # inside item-003's range, the shard's second half
    with open(partial / SHARD1, "r+b") as handle:
        handle.seek(len(whole) - len(other))
        handle.write(other)
    with pytest.raises(VerificationFailed, match="outside the memories its marker lists"):
        cubepack.verify(partial)


def test_a_whole_shard_not_pulled(partial, sharded):
    for name in ("activations-00000.kvshard", "activations-00000.index.json"):
        shutil.copy(sharded / "shards" / name, partial / "shards" / name)
    with pytest.raises(VerificationFailed, match="lists no memory it holds"):
        cubepack.verify(partial)


def test_one_byte_in_the_padding(partial, sharded):
    from cubepack.format.sections import shards

    lock = cubepack.format._lock.parse((sharded / "cubepack.lock").read_bytes())
    index = shards.load_index(lock.shards[SHARD1], shards.local_fetch(sharded), lock.models)
    end = index.memories["item-002"].locator.end
    if shards.aligned(end) == end:
        pytest.skip("no padding after item-002 in this layout")
    with open(partial / SHARD1, "r+b") as handle:
        handle.seek(end)
        handle.write(b"\x01")
    with pytest.raises(VerificationFailed, match="between memories"):
        cubepack.verify(partial)
