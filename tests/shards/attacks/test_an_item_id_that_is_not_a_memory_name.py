"""``load`` of an item id with path characters, or of something that is not a string: a
UsageError naming it (the cube holds no such memory), never a path followed, a file fetched,
or an untyped TypeError."""

from __future__ import annotations

import pytest

from cubepack.errors import UsageError


@pytest.mark.parametrize("item", [
    "../cubepack.lock", "item-000/../item-001", "/etc/passwd", "item-001\x00",
    "shards/activations-00000.kvshard", "", 5, None, ("item-001",), b"item-001",
], ids=repr)
def test_a_strange_item_id_is_a_usage_error(hub, cube, remote, models, item):
    remote.push(hub, cube)
    opened = remote.open(hub)
    hub.stats.reset()
    with pytest.raises(UsageError):
        opened.load(item, models["a"])
    assert not any("kvshard" in key for key in hub.stats.requests), hub.stats.requests
