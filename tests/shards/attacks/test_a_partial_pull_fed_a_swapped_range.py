"""A range swapped on the way (the endpoint, or a cache between, answers with other bytes) or
after (a memory's range replaced on disk by another memory's): refused by the partial pull
before anything is placed, and by verify and a load after."""

from __future__ import annotations

import pytest

import cubepack
from cubepack.errors import CubepackError, IntegrityError, VerificationFailed
from cubepack.format.sections import shards

from data import HUB_TOKEN

SHARD1 = "shards/activations-00001.kvshard"


def _push(hub, sharded):
    cubepack.push(sharded, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                  allow_local_paths=True)


def test_a_range_corrupted_on_the_way_places_nothing(hub, sharded, tmp_path):
    _push(hub, sharded)
    hub.add_fault("corrupt", path=r"\.kvshard$", method="GET")
    with pytest.raises(IntegrityError, match="item-002"):
        cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=tmp_path / "p",
                      include=["item-002"])
    assert not (tmp_path / "p").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_another_memory_of_the_same_length_in_its_place(hub, sharded, tmp_path, models):
    _push(hub, sharded)
    target = tmp_path / "p"
    cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=["item-002"])
    lock = cubepack.format._lock.parse((sharded / "cubepack.lock").read_bytes())
    index = shards.load_index(lock.shards[SHARD1], shards.local_fetch(sharded), lock.models)
    mine, other = index.memories["item-002"].locator, index.memories["item-003"].locator
    assert mine.length == other.length
    data = (sharded / SHARD1).read_bytes()[other.offset:other.end]
    with open(target / SHARD1, "r+b") as handle:
        handle.seek(mine.offset)
        handle.write(data)
    with pytest.raises(VerificationFailed, match="item-002"):
        cubepack.verify(target)
    with pytest.raises(CubepackError, match="item-002"):
        cubepack.load_kv_cache(target, models["a"], item="item-002")
