"""Benchmark: MemOS-style pickle.load of a KV cache versus cubepack.load_kv_cache.

Builds a ~200 MB bfloat16 DynamicCache for a model with 32 layers, 8 KV heads of dim 128,
stores it both ways, then times each load in this one process (best of N, warm page cache) and
prints the ratio. Target: load_kv_cache >= 20x faster. Then the floor: summing every tensor of
the cache already in memory, against ``load_kv_cache`` (identity given; every tensor's XXH3-64
checked, KV format 3) and summing the tensors it returns, taking turns; torch runs on one thread
here, so a busy shared core does not decide the floor. Also the checksum alone over the same
bytes in memory (on the checksum pool: both cores), and the load with its checksum step off (as
before format 3). Targets: checksum throughput >= the sum's; load + checksum + sum <= 2x the
floor; load + sum without the checksum <= 1.2x. Not a test: numbers depend on the machine.

Run: .venv/latest/bin/python bench/kv_load.py [--smoke]
(``--smoke``: a 4-layer, 64-token cache, as CI runs it so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import contextlib
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
from cubepack.kv import _checksum
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
    with _no_checksum():
        off_best, off_median = best_of(
            lambda: cubepack.load_kv_cache(kv_path, model, identity=identity))
    print(f"load_kv_cache (identity, no checksum) best {off_best * 1e3:8.2f} ms  median {off_median * 1e3:8.2f} ms")
    print(f"ratio pickle / load_kv_cache: {pickle_median / check_median:.1f}x "
          f"(identity given: {pickle_median / known_median:.1f}x; target >= 20x; without the "
          f"checksum, which reads every byte at load rather than at first use: "
          f"{pickle_median / off_median:.1f}x)")

    in_memory = {f"layers.{i}.{part}": [tensor.contiguous().view(torch.uint8).reshape(-1).numpy()]
                 for i, layer in enumerate(cache.layers)
                 for part, tensor in (("keys", layer.keys), ("values", layer.values))}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        floor, hashed, loaded, unchecked = [], [], [], []
        for _ in range(REPEATS * 3):  # take turns
            start = time.perf_counter()
            touch(cache)
            floor.append(time.perf_counter() - start)
            start = time.perf_counter()  # the checksum alone, of the same bytes in memory
            _checksum.compute(in_memory)
            hashed.append(time.perf_counter() - start)
            start = time.perf_counter()  # the load as shipped: every tensor's checksum checked
            mapped = cubepack.load_kv_cache(kv_path, model, identity=identity)
            touch(mapped)
            loaded.append(time.perf_counter() - start)
            del mapped  # unmapped after the clock stopped, as the floor's tensors stay
            with _no_checksum():  # the load before format 3 (what the checksum adds)
                start = time.perf_counter()
                mapped = cubepack.load_kv_cache(kv_path, model, identity=identity)
                touch(mapped)
                unchecked.append(time.perf_counter() - start)
            del mapped
    finally:
        torch.set_num_threads(threads)
    gb = size / 1e9
    print(f"sum of every tensor, in memory (floor)    best {min(floor) * 1e3:8.2f} ms  median "
          f"{statistics.median(floor) * 1e3:8.2f} ms  ({gb / min(floor):.1f} GB/s, 1 thread)")
    print(f"xxh3-64 of every tensor, in memory        best {min(hashed) * 1e3:8.2f} ms  median "
          f"{statistics.median(hashed) * 1e3:8.2f} ms  ({gb / min(hashed):.1f} GB/s, "
          f"{_checksum.WORKERS} threads)")
    print(f"load_kv_cache (checked) + sum             best {min(loaded) * 1e3:8.2f} ms  median "
          f"{statistics.median(loaded) * 1e3:8.2f} ms")
    print(f"load_kv_cache (checksum off) + sum        best {min(unchecked) * 1e3:8.2f} ms  median "
          f"{statistics.median(unchecked) * 1e3:8.2f} ms")
    print(f"ratio checksum throughput / sum throughput: {min(floor) / min(hashed):.2f}x best, "
          f"{statistics.median(floor) / statistics.median(hashed):.2f}x median (goal >= 1x)")
    print(f"ratio load_kv_cache + checksum + sum / sum in memory: {min(loaded) / min(floor):.2f}x "
          f"best, {statistics.median(loaded) / statistics.median(floor):.2f}x median "
          "(target <= 2x)")
    print(f"ratio load_kv_cache + sum (checksum off) / sum in memory: "
          f"{min(unchecked) / min(floor):.2f}x best, "
          f"{statistics.median(unchecked) / statistics.median(floor):.2f}x median "
          "(before format 3; target <= 1.2x)")


@contextlib.contextmanager
def _no_checksum():
    """The load without its checksum step (as before KV format 3), for the comparison only."""
    from cubepack.kv import _torch

    checked = _torch.verify_mapped
    _torch.verify_mapped = lambda info, tensors: None
    try:
        yield
    finally:
        _torch.verify_mapped = checked


if __name__ == "__main__":
    main()
