"""Attacks on the exact-prefill rule across runtimes and MemOS: a hooked load, and an
activation the loading model rebuilt, against ``require_provenance``.

Each test is one find; the docstring says what broke.
"""

from __future__ import annotations

import pytest

import cubepack


def test_memos_own_load_of_a_packed_cube_applies_require_provenance(packed, zoo):
    """``install(require_provenance="recomputed")`` refuses a packed cube whose producer label is
    only the lock's claim through ``init_from_dir`` / ``init_from_remote_repo``, but MemOS's own
    entry points (``KVCacheMemory.load``, hence ``GeneralMemCube.load``, ``MOSCore.load``, the
    scheduler) load it: the requirement is never applied there."""
    pytest.importorskip("memos")
    from memos_adv import act_memory

    import cubepack.memos as hook

    hook.uninstall()
    hook.install(require_pin=False, require_provenance="recomputed")
    try:
        with pytest.raises(cubepack.RecomputationFailed, match="recomputed is required"):
            hook.init_from_dir(packed, require_provenance="recomputed")
        memory = act_memory(zoo["a"])
        with pytest.raises(cubepack.RecomputationFailed, match="recomputed is required"):
            memory.load(str(packed))  # MemOS's own call, hooked
        assert not memory.get_all()
    finally:
        hook.uninstall()


def test_a_rebuilt_activation_meets_require_provenance(packed, zoo):
    """``on_mismatch="rebuild"`` replaces another model's cache with the loading model's own
    prefill (labelled ``recomputed`` by construction), yet ``require_provenance`` judges the
    replaced cube item's lock label: every rebuilt item is refused, and the refusal's fix
    ("pass recompute=True") is what the call already passed."""
    pytest.importorskip("memos")
    import cubepack.memos as hook

    from memos_live import cube_config

    loaded = hook.init_from_dir(packed, default_config=cube_config(zoo["b"]),
                                on_mismatch="rebuild", recompute=True,
                                require_provenance="recomputed")
    items = loaded.act_mem.get_all()
    assert items and sorted(loaded.cubepack.rebuilt) == sorted(item.id for item in items)
