"""Promise 4: ``diff`` names every change that moves a digest.

``diff_locks`` compares with Python's ``==``, for which ``10000.0 == 10000`` and ``True == 1``,
while the lock's digests hash the canonical JSON (``10000.0`` and ``10000`` are other bytes).
A pull request that changes a number's JSON type in a pin moves both digests, verifies, and
``cubepack diff`` names no change at all (the CLI prints an empty report for two different
locks).
"""

from __future__ import annotations

import json
import shutil

import cubepack
from cubepack.cli import _render_diff

from helpers import reseal_lock


def _a_float_field(identity):
    for key, value in sorted(identity["compute_config"].items()):
        if isinstance(value, float) and value == int(value):
            return key
    raise AssertionError("no integral float in the compute config")


def test_diff_names_a_pin_change_that_moves_both_digests(packed_cube_factory, tmp_path):
    old = packed_cube_factory()
    new = tmp_path / "new"
    shutil.copytree(old, new)
    lock = json.loads((new / "cubepack.lock").read_text())
    key = _a_float_field(lock["models"]["act_mem"]["identity"])

    def change(lock):
        config = lock["models"]["act_mem"]["identity"]["compute_config"]
        config[key] = int(config[key])  # e.g. rope_theta 10000.0 -> 10000

    reseal_lock(new, change)
    cubepack.verify(new)  # the changed lock is accepted
    result = cubepack.diff(old, new)
    assert result["digest"]["old"] != result["digest"]["new"]
    assert result["content_digest"]["old"] != result["content_digest"]["new"]
    named = result["sections"] or result["lock"] or result["unknown_keys"]
    assert named, ("two locks whose digests differ, and diff names no change: "
                   f"{_render_diff(result)!r}")
