"""A mutation sweep over every key of a model's config.json: any change that alters what the
model computes must change its fingerprint, so a KV cache of the original is refused.

For each tiny model kind, each key of the saved ``config.json`` is perturbed on its own
(numbers scaled, booleans flipped, strings swapped for another valid value, RoPE parameters
changed). A perturbation the model cannot load with is skipped. For the rest, the cache the
original model built is continued by the perturbed model and compared with the perturbed
model's own prefill: where the logits differ beyond tolerance, the fingerprint must differ and
``load_kv_cache`` must refuse. Perturbations that change nothing are printed (``pytest -s``),
not required.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import cubepack
from cubepack.kv import read_kv_header
from cubepack.kv._torch import build_dynamic_cache
from cubepack.testing import tiny

from data import PROMPT
from helpers import build_cache, continue_greedy

TOLERANCE = 1e-4  # fp32 on CPU: the same computation differs by < 1e-5 between runs
STRING_SWAPS = {"hidden_act": "gelu_pytorch_tanh", "rope_type": "linear",
                "hidden_activation": "gelu"}


def perturbations(key, value):
    """(label, new value) pairs for one config value."""
    if isinstance(value, bool):
        return [(f"{key}={not value}", not value)]
    if isinstance(value, (int, float)):
        return [(f"{key}x2", value * 2 if value else (1 if isinstance(value, int) else 0.1))]
    if isinstance(value, str) and key in STRING_SWAPS:
        return [(f"{key}={STRING_SWAPS[key]}", STRING_SWAPS[key])]
    if isinstance(value, dict):  # rope_parameters / rope_scaling
        changed = []
        for inner, inner_value in value.items():
            for label, new in perturbations(inner, inner_value):
                updated = dict(value, **{inner: new})
                if new == "linear":
                    updated["factor"] = 2.0
                changed.append((f"{key}.{label}", updated))
        return changed
    if value is None and key == "rope_scaling":
        return [("rope_scaling=linear", {"rope_type": "linear", "type": "linear", "factor": 2.0})]
    return []  # lists (layer_types, architectures) and free strings: no valid swap known


def continuation(model, cache, steps=3):
    return torch.cat(continue_greedy(model, cache, PROMPT[-1], steps))


@pytest.mark.parametrize("kind", ["a", "hybrid"])
def test_every_config_change_that_alters_outputs_changes_the_fingerprint(kind, zoo, models,
                                                                         tmp_path):
    source = zoo[kind]
    original = models[kind]
    producer = cubepack.fingerprint(original)
    ids = torch.tensor([PROMPT])
    cache_file = cubepack.save_kv_cache(build_cache(original, ids), tmp_path / "a.kv.safetensors",
                                        producer=original, token_ids=ids)
    config = json.loads((source / "config.json").read_text())
    caught, inert, skipped = [], [], []
    for key, value in sorted(config.items()):
        for label, new in perturbations(key, value):
            folder = tmp_path / label.replace("/", "_")
            folder.mkdir()
            for item in source.iterdir():
                os.link(item, folder / item.name) if item.name != "config.json" else None
            (folder / "config.json").write_text(json.dumps(dict(config, **{key: new})))
            try:
                model = tiny.load(folder)
                own = continuation(model, build_cache(model, ids))
            except Exception as exc:  # noqa: BLE001 - a config the model cannot run with
                skipped.append(f"{label} ({type(exc).__name__})")
                shutil.rmtree(folder)
                continue
            try:  # the original's cache, forced into the perturbed model
                info = read_kv_header(cache_file)
                reused = continuation(model, build_dynamic_cache(info, model.config))
                delta = (own - reused).abs().max().item()
            except Exception:  # noqa: BLE001 - it crashes: as different as it gets
                delta = float("inf")
            if delta <= TOLERANCE:
                inert.append(label)
            else:
                live = cubepack.fingerprint(model)
                assert live.strict() != producer.strict(), f"{label} changed logits by {delta}"
                with pytest.raises(cubepack.IdentityMismatch):
                    cubepack.load_kv_cache(cache_file, model)
                caught.append(f"{label} (max |dlogit| {delta:.3g})")
            shutil.rmtree(folder)
    print(f"\n[{kind}] refused {len(caught)}: {', '.join(caught)}")
    print(f"[{kind}] no effect on outputs {len(inert)}: {', '.join(inert)}")
    print(f"[{kind}] cannot load {len(skipped)}: {', '.join(skipped)}")
    assert len(caught) >= 4  # the sweep reached the keys that matter (RoPE, eps, activation...)
