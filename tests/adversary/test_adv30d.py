"""Adversary round 30d: the exact-prefill rule (``identical()``) and what rests on it.

Each test is one find; the docstring says what broke.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import cubepack
from cubepack.kv._format import FULL
from cubepack.kv._recompute import TorchRuntime, identical, recompute_layers
from cubepack.kv._torch import cache_from_layers, cache_layers, write_kv_layers

from data import PROMPT

ITEM = "activations/item-1.kv.safetensors"


def _zero_channel_model(model):
    """``model`` with one row of layer 0's v_proj zeroed: every position's value in that
    channel is an exact +0.0 in its prefill (a real model has such channels: pruned heads,
    dead units)."""
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.layers[0].self_attn.v_proj.weight[0].zero_()
    return changed


def test_identical_calls_negative_zero_the_same_bits_as_zero():
    """``identical()`` promises "bit for bit" but compares with ``torch.equal`` (==), for
    which -0.0 == +0.0: stored bytes that are not the prefill's are called the prefill bit
    for bit."""
    fresh = torch.zeros(1, 1, 2, 4)
    stored = fresh.clone()
    stored[0, 0, 0, 0] = -0.0
    assert stored.view(torch.int32)[0, 0, 0, 0] != fresh.view(torch.int32)[0, 0, 0, 0]
    assert not identical([(FULL, 2, fresh, fresh)], [(FULL, 2, stored, fresh)])


def test_a_cache_with_a_flipped_zero_sign_is_not_proved_recomputed_bit_for_bit(tmp_path, zoo,
                                                                               models):
    """End to end: a stored cache whose bytes differ from the producer's prefill (one +0.0
    written as -0.0) is reported ``identical: true``, "bit for bit", skips the probes, and
    satisfies ``--require-provenance recomputed`` as the prefill itself."""
    from memos_format import memos_config

    model = _zero_channel_model(models["a"])
    honest = TorchRuntime(model).prefill_layers(PROMPT)
    kind, total, keys, values = honest[0]
    assert bool((values[0, 0, :, 0] == 0).all())  # the zeroed channel: exact zeros
    values = values.clone()
    values[0, 0, 0, 0] = -0.0
    stored = [(kind, total, keys, values)] + honest[1:]
    assert torch.signbit(values[0, 0, 0, 0]) and not torch.signbit(honest[0][3][0, 0, 0, 0])

    result = recompute_layers(model, stored, "float32", list(PROMPT), "item-1")
    assert not result.identical, "the stored bytes are not the prefill's, yet identical"

    cube = tmp_path / "cube"
    write_kv_layers(cache_layers(cache_from_layers(stored, model.config)), cube / ITEM,
                    producer=cubepack.fingerprint(model), token_ids=list(PROMPT),
                    metadata={"id": "item-1"})
    (cube / "config.json").write_text(json.dumps(memos_config(str(zoo["a"]))))
    cubepack.pack(cube, model=model)
    report = cubepack.verify(cube, model=model, recompute=True)
    [check] = [c for c in report.checks if c.name == "recompute"]
    assert check.found["identical"] is False, check.detail
    assert report.provenance["item-1"].get("exact") is False, report.provenance["item-1"]
