"""An index that is valid JSON inside its size limit (64 MiB) but made of small values
(``[{},{},...]``): parsed whole, Python holds ~26 bytes a byte of it (~1.7 GB for 64 MiB)
before a key is checked. Loading one memory must refuse it without building that document:
its memory stays within a few times the index's own bytes."""

from __future__ import annotations

import tracemalloc

import pytest

import cubepack
from cubepack.errors import FormatError

VALUES = 1_500_000  # 4.5 MB of "{},": a small stand-in for a 64 MiB index


def test_an_index_of_many_small_values_is_refused_before_it_is_built(cube, remote, models):
    body = (b'{"format":"cubepack.kvshard.index","memories":{},"shard":{},"version":1,"x":['
            + b"{}," * (VALUES - 1) + b"{}]}")
    remote.plant(cube, remote.INDEX0, body)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="values"):
            cubepack.load_kv_cache(cube, models["a"], item="item-001")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body), (peak, len(body))
