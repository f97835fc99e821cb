"""Round 30 (issue #30): on a model whose every layer slides (Mistral-style), a cache keeps
only the last window of positions, so `verify --recompute` compares "12 of ... positions"
and calls the check partial, whatever it was asked: `--require-provenance recomputed` then
refuses an honest cube that `pack --recompute` wrote from its own prefill, and the refusal's
fix (`cubepack verify --recompute --model MODEL ...`, "every position") is the very command
that was run. Every position the cache holds was compared: nothing was skipped."""

from __future__ import annotations

import sys

import cubepack

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import cube_with  # noqa: E402


def test_an_all_sliding_models_own_prefill_proves_recomputed(tmp_path, zoo):
    from cubepack.testing import tiny

    config = tiny.hybrid_config()
    config.layer_types = ["sliding_attention", "sliding_attention"]
    folder = tiny.build_model(tmp_path / "model-sliding", config, seed=3,
                              tokenizer=tiny.build_tokenizer())
    model = tiny.load(folder)
    ids = list(range(2, 14))  # longer than the 4-token window
    cube = cube_with(tmp_path, zoo, model, ids=ids)
    cubepack.pack(cube, model=model, recompute=True)
    report = cubepack.verify(cube, model=model, recompute=True, require_provenance="recomputed",
                             raise_on_failure=False)
    assert report.ok, [c.detail for c in report.failures]
