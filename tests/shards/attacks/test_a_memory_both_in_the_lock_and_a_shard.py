"""A lock listing a memory twice: ``item-001`` as a whole KV file in the lock's own
activations (another memory's bytes) while shard 0's index holds it too. verify refuses the
cube; a remote ``open(...).load("item-001")`` must refuse it as well, not pick the lock's
file without ever reading the index that contradicts it."""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack._util import constants
from cubepack.errors import FormatError

from helpers import reseal_lock


def _plant_twice(cube, remote, bundle_factory):
    index = json.loads((cube / remote.INDEX1).read_text())["memories"]["item-003"]
    data = (bundle_factory(5) / "activations" / "item-003.kv.safetensors").read_bytes()
    name = "activations/item-001.kv.safetensors"
    (cube / "activations").mkdir()
    (cube / name).write_bytes(data)

    def twice(lock):
        lock["files"][name] = remote.file_entry(data)
        lock["activations"]["item-001"] = {
            "file": name, "sha256": remote.file_entry(data)["sha256"],
            **{key: index[key] for key in ("model_role", "token_count", "kv_dtype",
                                             "num_layers", "provenance")}}
    reseal_lock(cube, twice)
    return name


def test_verify_refuses_a_memory_listed_twice(cube, remote, bundle_factory, zoo):
    _plant_twice(cube, remote, bundle_factory)
    assert not cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False).ok


def test_open_refuses_a_memory_listed_twice(hub, cube, remote, bundle_factory, models):
    remote.push(hub, cube)
    name = _plant_twice(cube, remote, bundle_factory)
    remote.upload(hub, cube, [name, constants.LOCK_FILENAME])
    opened = remote.open(hub)
    with pytest.raises(FormatError, match="item-001"):
        opened.load("item-001", models["a"])


def test_a_local_load_by_item_refuses_a_memory_listed_twice(cube, remote, bundle_factory,
                                                            models):
    _plant_twice(cube, remote, bundle_factory)
    with pytest.raises(FormatError, match="item-001"):
        cubepack.load_kv_cache(cube, models["a"], item="item-001")
