"""Attacks on the exact-prefill rule (``identical()``) and what rests on it.

Each test is one find; the docstring says what broke.
"""

from __future__ import annotations

import copy
import json
import re

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


def test_the_attack_benchmark_counts_what_the_product_decides(monkeypatch, capsys, tmp_path,
                                                              request):
    """bench/proof_attack.py reports "0 flipping perturbations pass --require-provenance
    recomputed" and "0 flip what a recomputing load answers", but computes both itself:
    ``checked.identical`` (a flip changed the tensors, so never identical: 0 by construction)
    and ``recompute_layers(...).layers`` (the prefill, whatever was stored: 0 by construction).
    Neither asks the product. Broken product paths (every evidence satisfies the requirement;
    a recomputing load hands back the stored tensors) must show in those counts; they print 0."""
    import importlib
    import random
    import sys
    from pathlib import Path

    from cubepack.kv import _load
    from cubepack.kv._torch import mapped_layers
    from cubepack.kinds.activations import _verify
    from cubepack.testing import tiny

    bench = Path(__file__).resolve().parents[2] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    had_common = "_common" in sys.modules
    proof_attack = importlib.import_module("proof_attack")

    def forget_the_benchmark():
        # bench/_common quiets the libraries for its whole process at import; undone here, as
        # tests/e2e/test_bench_smoke.py does (a later test's quiet block nested in it did
        # nothing: tests/util/test_quiet.py failed after this one).
        sys.modules.pop("proof_attack", None)
        common = sys.modules.pop("_common", None)
        if common is not None and not had_common:
            common._QUIET.__exit__(None, None, None)
    request.addfinalizer(forget_the_benchmark)
    monkeypatch.setattr(proof_attack, "SCALES", (0.9,))

    # The product, broken on both paths the benchmark's goals are about.
    monkeypatch.setattr(_verify, "satisfies", lambda backing, required: True)
    real = _load.require_recomputed_here

    def hands_back_the_stored_tensors(runtime, info, *args, **kwargs):
        result = real(runtime, info, *args, **kwargs)
        if result is not None:
            result.layers = mapped_layers(info)
        return result
    monkeypatch.setattr(_load, "require_recomputed_here", hands_back_the_stored_tensors)

    torch.manual_seed(0)
    folder = tiny.build_model(tmp_path / "model", tiny.llama_config(2), seed=0,
                              tokenizer=tiny.build_tokenizer())
    rng = random.Random(0)  # the benchmark's first prompt (its --quick run finds flips there)
    cases = [([rng.randrange(2, tiny.VOCAB_SIZE) for _ in range(proof_attack.MEMORY)],
              [rng.randrange(2, tiny.VOCAB_SIZE) for _ in range(proof_attack.QUESTION)])]
    proof_attack._attack_dtype(folder, "bfloat16", cases, 10)
    out = capsys.readouterr().out
    passing = int(re.search(r"new bound alone .*?: (\d+) flipping", out).group(1))
    assert passing > 0, out  # the attacker found flips inside the bound
    required = int(re.search(r"require-provenance recomputed .*?: (\d+) flipping", out).group(1))
    loaded = int(re.search(r"load_kv_cache\(recompute=True\) of each .*?: (\d+) of",
                           out).group(1))
    assert required > 0 and loaded > 0, out
