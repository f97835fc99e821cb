"""A partial pull that fails halfway (the endpoint drops a range, a server error on the second
shard) leaves nothing half-placed: the target is as it was (absent, or an earlier pull), no
staging folder is left, no marker names memories that are not there."""

from __future__ import annotations

import pytest

import cubepack
from cubepack.errors import HubError
from cubepack.format import _partial as partialformat

from data import HUB_TOKEN


@pytest.mark.parametrize("shard", ["00000", "00002"])  # a range of a sparse one; a whole one
@pytest.mark.parametrize("kind", ["drop", "500", "truncate"])
def test_a_failed_range_places_nothing(hub, sharded, tmp_path, kind, shard):
    cubepack.push(sharded, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                  allow_local_paths=True)
    target = tmp_path / "p"
    cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=["item-002"])
    before = sorted((p.relative_to(target).as_posix(), p.read_bytes())
                    for p in target.rglob("*") if p.is_file())
    hub.add_fault(kind, path=rf"activations-{shard}\.kvshard$", method="GET", times=10)
    with pytest.raises(HubError):
        cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                      include=["item-00[04]"], timeout=60)
    after = sorted((p.relative_to(target).as_posix(), p.read_bytes())
                   for p in target.rglob("*") if p.is_file())
    assert after == before
    assert set(partialformat.read(target).memories) == {"item-002"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub-root", "p"]  # no staging left
