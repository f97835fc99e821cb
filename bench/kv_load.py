"""Benchmark: MemOS-style pickle.load of a KV cache versus cubepack.load_kv_cache.

Builds a ~200 MB bfloat16 DynamicCache for a model with 32 layers, 8 KV heads of dim 128,
stores it both ways, then times each load in this one process (best of N, warm page cache) and
prints the ratio. Target: load_kv_cache >= 20x faster. Then the floor: summing every tensor of
the cache already in memory, against ``load_kv_cache`` (identity given) and summing the tensors
it returns, taking turns; torch runs on one thread here, so a busy shared core does not decide
the floor. Target: <= 1.2x the floor. Not a test: numbers depend on the machine.

Run: .venv/latest/bin/python bench/kv_load.py [--smoke]
(``--smoke``: a 4-layer, 64-token cache, as CI runs it so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - a report without progress bars or library warnings
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import cubepack
from cubepack.testing import tiny

REPEATS = 7
LAYERS, KV_HEADS, HEAD_DIM, TOKENS = 32, 8, 128, 1600


def best_of(action, repeats=REPEATS) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def touch(cache) -> float:
    """Read every byte of every layer (what any use of the cache does at least once)."""
    return sum(float(layer.keys.sum()) + float(layer.values.sum()) for layer in cache.layers)


def main() -> None:
    global LAYERS, TOKENS, REPEATS
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    if parser.parse_args().smoke:
        LAYERS, TOKENS, REPEATS = 4, 64, 2
    work = Path(tempfile.mkdtemp(prefix="cubepack-bench-"))
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=64,
                         num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(work / "model")
    tiny.build_tokenizer().save_pretrained(work / "model")
    model = tiny.load(work / "model", dtype=torch.bfloat16)

    cache = DynamicCache(config=model.config)
    for layer in range(LAYERS):
        shape = (1, KV_HEADS, TOKENS, HEAD_DIM)
        cache.update(torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16), layer)
    size = sum(l.keys.numel() + l.values.numel() for l in cache.layers) * 2

    kv_path = cubepack.save_kv_cache(cache, work / "item.kv.safetensors", producer=model)
    pickle_path = work / "activation_memory.pickle"
    with open(pickle_path, "wb") as handle:  # MemOS KVCacheMemory.dump layout
        pickle.dump({"kv_cache_memories": {"item-1": {"id": "item-1", "memory": cache}}}, handle)

    def load_pickle():
        with open(pickle_path, "rb") as handle:
            pickle.load(handle)

    identity = cubepack.fingerprint(model)  # also warms the weight-hash cache
    pickle_best, pickle_median = best_of(load_pickle)
    check_best, check_median = best_of(lambda: cubepack.load_kv_cache(kv_path, model))
    known_best, known_median = best_of(
        lambda: cubepack.load_kv_cache(kv_path, model, identity=identity))

    print(f"cache: {size / 1e6:.0f} MB bfloat16, {LAYERS} layers, {TOKENS} tokens "
          f"(python {sys.version.split()[0]}, torch {torch.__version__})")
    print(f"pickle.load (MemOS style)          best {pickle_best * 1e3:8.2f} ms  median {pickle_median * 1e3:8.2f} ms")
    print(f"load_kv_cache (fingerprints model) best {check_best * 1e3:8.2f} ms  median {check_median * 1e3:8.2f} ms")
    print(f"load_kv_cache (identity given)     best {known_best * 1e3:8.2f} ms  median {known_median * 1e3:8.2f} ms")
    print(f"ratio pickle / load_kv_cache: {pickle_median / check_median:.1f}x "
          f"(identity given: {pickle_median / known_median:.1f}x; target >= 20x)")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        floor, loaded = [], []
        for _ in range(REPEATS * 3):  # take turns
            start = time.perf_counter()
            touch(cache)
            floor.append(time.perf_counter() - start)
            start = time.perf_counter()
            mapped = cubepack.load_kv_cache(kv_path, model, identity=identity)
            touch(mapped)
            loaded.append(time.perf_counter() - start)
            del mapped  # unmapped after the clock stopped, as the floor's tensors stay
    finally:
        torch.set_num_threads(threads)
    print(f"sum of every tensor, in memory (floor)    best {min(floor) * 1e3:8.2f} ms  median "
          f"{statistics.median(floor) * 1e3:8.2f} ms")
    print(f"load_kv_cache + sum of every tensor       best {min(loaded) * 1e3:8.2f} ms  median "
          f"{statistics.median(loaded) * 1e3:8.2f} ms")
    print(f"ratio load_kv_cache + sum / sum in memory: {min(loaded) / min(floor):.2f}x best, "
          f"{statistics.median(loaded) / statistics.median(floor):.2f}x median (target <= 1.2x)")


if __name__ == "__main__":
    main()
