"""A shard's index whose facts about a memory (token count, KV dtype, layers) are not the KV
header's inside its range, the lock resealed over the index: verify refuses it, as it refuses
a lock entry of a whole KV file that says another token count."""

from __future__ import annotations

import pytest

import cubepack


@pytest.mark.parametrize("field, value", [("token_count", 99), ("kv_dtype", "bfloat16"),
                                          ("num_layers", 7)])
def test_verify_refuses_index_facts_the_header_denies(cube, remote, zoo, field, value):
    remote.edit_index(cube, remote.INDEX0,
                      lambda index: index["memories"]["item-000"].update({field: value}))
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    assert not report.ok, [f"{c.name}: {c.detail}" for c in report.checks if c.ok is not True]


@pytest.mark.parametrize("field, value", [("token_count", 99), ("kv_dtype", "bfloat16"),
                                          ("num_layers", 7)])
def test_verify_refuses_lock_facts_the_header_denies(bundle, remote, zoo, field, value):
    """The same lie in the lock of a cube of one file a memory (the reference behaviour)."""
    from helpers import reseal_lock

    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/plain", model=str(zoo["a"]))
    reseal_lock(cube, lambda lock: lock["activations"]["item-000"].update({field: value}))
    assert not cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False).ok
