"""An adversary's find (issue #30 item 3, round 2), MLX's side of the float32 reference.

``MLXRuntime.reference`` kept ``id(model) -> (model, float32 copy)`` in a module dict, emptied
only when another model was recomputed: the last model a process recomputed with, and a
float32 copy of it (twice a bfloat16 model's size again), outlived every reference the caller
held. Nor was the copy ever compared with the model's weights again: after a weight changed in
place (``module.weight = ...``, ``model.update``, ``set_dtype``), the proof measured "the
dtype's noise" against the old weights' float32 prefill, and the cache the old weights made
passed as what the changed model computes (13% of each position's inflated bound used; a
fresh float32 copy refuses it, 2.3x).
"""

from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402

import cubepack.mlx  # noqa: E402
from cubepack.kv._recompute import recompute_layers  # noqa: E402
from cubepack.mlx._runtime import MLXRuntime  # noqa: E402

IDS = list(range(2, 30))


def test_a_dropped_mlx_model_and_its_float32_copy_are_freed(zoo):
    model, _ = cubepack.mlx.load(zoo["a"], dtype="bfloat16")
    runtime = MLXRuntime(model)
    assert recompute_layers(None, runtime.prefill_layers(IDS), "bfloat16", IDS, "x",
                            runtime=runtime).ok
    copy = weakref.ref(runtime.reference().model)
    alive = weakref.ref(model)
    del model, runtime
    gc.collect()
    assert alive() is None, "the MLX model outlived its last reference (held for its copy)"
    assert copy() is None, "its float32 copy outlived it"


def test_the_old_weights_cache_is_not_proved_against_a_stale_mlx_reference(zoo):
    model, _ = cubepack.mlx.load(zoo["a"], dtype="bfloat16")
    runtime = MLXRuntime(model)
    old = runtime.prefill_layers(IDS)
    assert recompute_layers(None, old, "bfloat16", IDS, "old", runtime=runtime, seed=1).ok
    projection = model.model.layers[1].self_attn.v_proj
    weight = projection.weight
    noise = mx.random.normal(weight.shape, key=mx.random.key(0)).astype(weight.dtype)
    projection.weight = weight + 0.3 * mx.abs(weight).mean() * noise  # fine-tuned in place
    result = recompute_layers(None, old, "bfloat16", IDS, "old", runtime=runtime, seed=1)
    assert not result.ok, ("the old weights' cache passed as what the changed model computes "
                           f"(noise ratio {result.max_noise_ratio:.3g})")
    reference = runtime.reference().model.model.layers[1].self_attn.v_proj.weight
    assert mx.array_equal(reference, projection.weight.astype(mx.float32))
