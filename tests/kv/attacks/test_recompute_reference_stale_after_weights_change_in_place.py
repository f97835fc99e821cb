"""An adversary's find (issue #30 item 3, round 2): the float32 reference the proof measures
the dtype's noise against is a copy of the model made once per model object and kept while the
object lives. Its weights were never compared with the model's again: after the model's
weights change in place (an optimiser step, ``load_state_dict``, ``model.to(dtype)``), the
proof measured "the dtype's noise" against another model's float32 prefill.

What that did: one projection fine-tuned in place (layer 1's ``v_proj``, moved by 30% of its
mean size), then ``verify --recompute`` of the cache the *old* weights made. Against a float32 copy of the
weights the model holds now, it is refused (it is not what the model computes); against the
stale copy every position's bound is inflated by the old-versus-new difference (13% of it used) and
the cache passes, reported as within "the dtype's noise measured against a float32 recomputation".
The behaviour check ran its continuations in the stale copy too.
"""

from __future__ import annotations

import torch

from cubepack.kv._recompute import TorchRuntime, recompute_layers
from cubepack.testing import tiny

IDS = list(range(2, 30))


def _fine_tuned_in_place(model, scale, only=""):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # what an optimiser step does: the same parameters, written in place
        for name, parameter in model.named_parameters():
            if only not in name:
                continue
            noise = torch.randn(parameter.shape, generator=generator).to(parameter.dtype)
            parameter.add_(scale * parameter.abs().mean() * noise)


def test_the_reference_follows_weights_changed_in_place(zoo):
    model = tiny.load(zoo["a"], dtype=torch.bfloat16)
    runtime = TorchRuntime(model)
    runtime.reference()  # made once, as any recomputation does
    _fine_tuned_in_place(model, 0.05)
    reference = runtime.reference().model
    assert all(torch.equal(mine.float(), theirs)
               for mine, theirs in zip(model.parameters(), reference.parameters()))
    model.load_state_dict(tiny.load(zoo["b"], dtype=torch.bfloat16).state_dict())
    reference = runtime.reference().model
    assert all(torch.equal(mine.float(), theirs)
               for mine, theirs in zip(model.parameters(), reference.parameters()))


def test_the_old_weights_cache_is_not_proved_against_a_stale_reference(zoo):
    model = tiny.load(zoo["a"], dtype=torch.bfloat16)
    runtime = TorchRuntime(model)
    old = runtime.prefill_layers(IDS)
    assert recompute_layers(model, old, "bfloat16", IDS, "old", seed=1).ok
    _fine_tuned_in_place(model, 0.3, only="layers.1.self_attn.v_proj")
    result = recompute_layers(model, old, "bfloat16", IDS, "old", seed=1)
    assert not result.ok, ("the old weights' cache passed as what the fine-tuned model computes "
                           f"(noise ratio {result.max_noise_ratio:.3g})")
    # and what refuses it is what a fresh process (a fresh float32 copy) says too
    fresh_model = tiny.load(zoo["a"], dtype=torch.bfloat16)
    fresh_model.load_state_dict(model.state_dict())
    assert not recompute_layers(fresh_model, old, "bfloat16", IDS, "old", seed=1).ok
