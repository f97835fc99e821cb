"""Adversary (issue #30, item 1; "a claim never gains strength"): ``cubepack.memos.register``
is the user's word that a model produced a cache.

Found: registering model B's cache (extracted by B under the hook: recorded as B's) under model
A silently replaces the record, and the new record is labelled ``recorded`` ("extracted by
this model in MemOS ... under the hook"), which a dump writes into the KV header and pack into
the lock. A user's assertion, over a record that said otherwise, becomes a recorded
provenance for the wrong model. Expected: refuse to relabel a cache recorded as another
model's, or at least label the registration ``asserted``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import act_memory

import cubepack
import cubepack.memos as hook
from cubepack.memos._use import lookup


def test_register_over_another_models_record_is_not_recorded_provenance(zoo, tmp_path):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        item = act_memory(zoo["b"]).extract("The user is from Paris.")  # recorded: B's
        cube = GeneralMemCube(cube_config(zoo["a"]))
        try:
            hook.register(item.memory, cube.act_mem.llm.model)
        except cubepack.CubepackError:
            return  # refusing to relabel another model's recorded cache is a fix
        record, _ = lookup(item.memory)
        cube.act_mem.add([item])
        cube.dump(str(tmp_path / "dumped"))
        lock = json.loads((tmp_path / "dumped" / "cubepack.lock").read_text())
        labels = [entry["provenance"]["kind"] for entry in lock["activations"].values()]
        assert record.provenance["kind"] == "asserted" and labels == ["asserted"], \
            (record.provenance, labels)
    finally:
        hook.uninstall()
