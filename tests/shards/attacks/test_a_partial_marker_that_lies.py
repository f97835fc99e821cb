"""A partial pull's marker is the folder's claim of which memories are here: each lie is
refused by verify (and by a load), never taken for the truth."""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack._util import canonical
from cubepack.errors import CubepackError, VerificationFailed
from cubepack.format import _partial as partialformat

SHARD1 = "shards/activations-00001.kvshard"


def _edit(cube, change):
    path = cube / partialformat.MARKER
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(canonical.dumps(doc))


def _failed(cube):
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube)
    return caught.value.failures


@pytest.mark.parametrize("lie, found", [
    # a memory listed whose range is not here (zeros): the shard, all of whose memories are
    # now listed, is not the lock's bytes
    (lambda d: d["memories"].update({"item-003": SHARD1}), SHARD1),
    # a memory of another shard, whose file is not here
    (lambda d: d["memories"].update({"item-000": "shards/activations-00000.kvshard"}),
     "activations-00000"),
    # a memory in another file than the lock's
    (lambda d: d["memories"].update({"item-002": "shards/activations-00002.kvshard"}),
     "item-002"),
    # a memory the cube does not hold
    (lambda d: d["memories"].update({"item-999": SHARD1}), "item-999"),
    # another count of the cube's memories
    (lambda d: d.update(total=2), "counts another number"),
    # another lock's marker
    (lambda d: d.update(lock_sha256="0" * 64), "another lock"),
    # another version
    (lambda d: d.update(version=2), "version 2"),
])
def test_a_lie_is_refused(partial, lie, found):
    _edit(partial, lie)
    failures = _failed(partial)
    assert any(found in f"{check.subject} {check.detail}" for check in failures), failures


def test_a_marker_that_is_a_link_is_refused(partial, tmp_path):
    marker = partial / partialformat.MARKER
    (tmp_path / "elsewhere.json").write_bytes(marker.read_bytes())
    marker.unlink()
    marker.symlink_to(tmp_path / "elsewhere.json")
    assert _failed(partial)


def test_a_load_reads_no_memory_the_marker_lists_but_the_folder_lacks(partial, models):
    _edit(partial, lambda d: d["memories"].update({"item-003": SHARD1}))
    with pytest.raises(CubepackError, match="item-003"):
        cubepack.load_kv_cache(partial, models["a"], item="item-003")
