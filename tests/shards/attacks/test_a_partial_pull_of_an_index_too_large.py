"""A lock (pushed by someone with write access) that records a shard's index above the limit
of an index: a partial pull refuses it before a byte of that index is fetched, as ``open``
does, and places nothing."""

from __future__ import annotations

import pytest

import cubepack
from cubepack.errors import FormatError
from cubepack.format.sections import shards as shardformat

from data import HUB_TOKEN
from helpers import reseal_lock


def test_the_index_is_never_fetched(hub, cube, remote, tmp_path):
    remote.push(hub, cube)
    reseal_lock(cube, lambda lock: lock["files"][remote.INDEX1].update(
        size=shardformat.MAX_INDEX_BYTES + 1))
    remote.upload(hub, cube, ["cubepack.lock"])
    hub.stats.reset()
    with pytest.raises(FormatError, match="above the .*-byte limit of an index"):
        cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=tmp_path / "p",
                      include=["item-002"])
    assert not any("index.json" in key for key in hub.stats.requests)
    assert not (tmp_path / "p").exists()
