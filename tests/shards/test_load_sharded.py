"""A memory of a sharded local cube loads (load_kv_cache(cube, model, item=...)), its range
checked against its index (sha256, checksums) and the index against the lock before any tensor
is built; verify --recompute proves each sharded memory (issue #40 item 2)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import cubepack
from cubepack._util import canonical, constants
from cubepack.errors import FormatError, IdentityMismatch, IntegrityError, UsageError

from helpers import reseal_lock

INDEX0 = "shards/activations-00000.index.json"
SHARD0 = "shards/activations-00000.kvshard"


@pytest.fixture(scope="module")
def sharded(bundle_factory, zoo, tmp_path_factory):
    cube = tmp_path_factory.mktemp("sharded") / "cube"
    shutil.copytree(bundle_factory(5), cube)
    cubepack.pack(cube, cube_id="me/sharded", model=str(zoo["a"]), shards=True)
    return cube


@pytest.fixture
def cube(sharded, tmp_path):
    target = tmp_path / "cube"
    shutil.copytree(sharded, target)
    return target


def test_each_memory_loads_as_the_file_it_was(sharded, bundle_factory, models):
    source = bundle_factory(5)
    for index in range(5):
        item = f"item-{index:03d}"
        cache = cubepack.load_kv_cache(sharded, models["a"], item=item)
        alone = cubepack.load_kv_cache(source / "activations" / f"{item}.kv.safetensors",
                                       models["a"])
        for layer, other in zip(cache.layers, alone.layers):
            assert torch.equal(layer.keys, other.keys) and torch.equal(layer.values,
                                                                       other.values)


def test_an_unsharded_cube_loads_by_item_too(bundle, zoo, models):
    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/plain", model=str(zoo["a"]))
    assert cubepack.load_kv_cache(cube, models["a"], item="item-001").get_seq_length() == 4


def test_an_unknown_item_is_named(sharded, models):
    with pytest.raises(UsageError, match=r"no activation memory 'nope' \(5 in 1 shard"):
        cubepack.load_kv_cache(sharded, models["a"], item="nope")


def test_another_model_is_refused(sharded, models):
    with pytest.raises(IdentityMismatch):
        cubepack.load_kv_cache(sharded, models["b"], item="item-002")


def test_a_swapped_range_is_refused_before_any_tensor(cube, models):
    """The shard's bytes changed (two memories swapped) and the lock resealed over them: the
    index's sha256 of the range refuses it."""
    index = json.loads((cube / INDEX0).read_text())
    first, second = sorted(index["memories"].values(), key=lambda m: m["offset"])[:2]
    data = bytearray((cube / SHARD0).read_bytes())
    a = bytes(data[first["offset"]:first["offset"] + first["length"]])
    b = bytes(data[second["offset"]:second["offset"] + second["length"]])
    data[first["offset"]:first["offset"] + len(b)] = b
    data[second["offset"]:second["offset"] + len(a)] = a
    (cube / SHARD0).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="memory 'item-000'.*its index says"):
        cubepack.load_kv_cache(cube, models["a"], item="item-000")


def test_an_index_that_is_not_the_locks_is_refused(cube, models):
    index = json.loads((cube / INDEX0).read_text())
    index["memories"]["item-001"]["token_count"] = 5
    (cube / INDEX0).write_text(canonical.dumps(index, compact=True))
    with pytest.raises(FormatError, match=f"{INDEX0} .* expected"):
        cubepack.load_kv_cache(cube, models["a"], item="item-001")


def test_an_index_with_other_checksums_is_refused(cube, models):
    """The index (resealed into the lock) states other checksums than the range's header."""
    import hashlib

    index = json.loads((cube / INDEX0).read_text())
    index["memories"]["item-001"]["checksums"]["header"] = "0" * 16
    text = canonical.dumps(index, compact=True)
    (cube / INDEX0).write_text(text)
    reseal_lock(cube, lambda lock: lock["files"][INDEX0].update(
        sha256=hashlib.sha256(text.encode()).hexdigest(), size=len(text.encode())))
    with pytest.raises(IntegrityError, match="checksums differ from its index"):
        cubepack.load_kv_cache(cube, models["a"], item="item-001")


def test_verify_recompute_proves_each_sharded_memory(sharded, zoo):
    report = cubepack.verify(sharded, model=str(zoo["a"]), recompute=True)
    proved = [c for c in report.checks if c.name == "recompute" and c.ok]
    assert len(proved) == 5, report.to_dict()
