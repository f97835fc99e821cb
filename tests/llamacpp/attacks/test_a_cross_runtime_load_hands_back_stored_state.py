"""An adversary's find (issue #30 item 3, round 2): a load that recomputes hands its caller the
prefill it ran, the docs say, on every cross-runtime load; llama.cpp's did not.

``llamacpp.load_state`` of a cache transformers computed has llama.cpp prefill its tokens and
compare (the layer-wide tolerance, float16 3e-2 of each layer's largest value), then loaded the
*stored* tensors into the context: inside that tolerance an attacker steers an answer
(docs/explanation/proof-bound.md), and the context answered from his values. Now the context
holds llama.cpp's own prefill of the ids, as transformers' and MLX's loads do.

Not run where this was found (llama-cpp-python is built from source; ``make test-llamacpp``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

import torch  # noqa: E402

import cubepack  # noqa: E402
from cubepack import llamacpp  # noqa: E402
from cubepack.llamacpp._runtime import session_of  # noqa: E402

IDS = [3, 17, 42, 9, 250, 11, 64, 5, 77, 123, 8, 31]


def test_a_transformers_cache_loaded_into_llama_cpp_is_llama_cpps_own_prefill(
        gguf_zoo, models, tmp_path):
    llm = llamacpp.load(gguf_zoo["a-f32"])
    cache = cubepack.kv.prefill(models["a"], torch.tensor([IDS]))
    layer = cache.layers[1]
    nudged = layer.values.clone()
    nudged[..., -1, :] += 3e-5 * layer.values.abs().max()  # inside float32's layer tolerance
    layer.values = nudged
    kv = cubepack.save_kv_cache(cache, tmp_path / "t.kv.safetensors", producer=models["a"],
                                token_ids=IDS)
    assert llamacpp.load_state(llm, kv, seed=0)["recomputed"]
    loaded = session_of(llm)
    llm.reset()
    llm.eval(IDS)
    assert loaded == session_of(llm), "the context holds the stored tensors, not its prefill"
