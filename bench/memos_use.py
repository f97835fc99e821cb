"""Benchmark: what the MemOS hook adds each time MemOS uses a cache.

``for_use`` checks the consuming model against the cache's producer (a memoised fingerprint)
and hands generation a new DynamicCache over the same tensors (no copy), so the stored cache
never grows. Compared with one decoding step of the same model on that cache: the cost of a
chat answer is many such steps. Not a test: numbers depend on the machine.

Run: .venv/latest/bin/python bench/memos_use.py [--smoke]
"""

from __future__ import annotations

import argparse
import tempfile
import types
from pathlib import Path

import _common  # noqa: F401 (imported first: declines in one line where torch is missing)
import torch
from _common import best_of, llama_config

import cubepack
from cubepack.kv._torch import forward, output_cache
from cubepack.memos._use import for_use, register
from cubepack.testing import tiny


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    layers, hidden, tokens, repeats = (2, 64, 32, 3) if args.smoke else (8, 512, 1024, 20)
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-use-"))
    config = llama_config(layers, hidden)
    model = tiny.load(tiny.build_model(root / "model", config, seed=0,
                                       tokenizer=tiny.build_tokenizer()))
    ids = torch.randint(2, tiny.VOCAB_SIZE, (1, tokens))
    with torch.no_grad():
        cache = output_cache(forward(model, ids))
    register(cache, "item", cubepack.fingerprint(model), {})
    llm = types.SimpleNamespace(model=model)
    for_use(llm, cache, "error")  # warm the fingerprint memo, as a second chat finds it

    def step():
        with torch.no_grad():
            forward(model, torch.tensor([[5]]), for_use(llm, cache, "error"))

    guard = best_of(lambda: for_use(llm, cache, "error"), repeats)
    decode = best_of(step, repeats)
    print(f"model: {layers} layers, hidden {hidden}; cache: {tokens} tokens, float32")
    print(f"for_use (check + fresh view)  best {guard * 1e3:8.3f} ms")
    print(f"one decoding step with it     best {decode * 1e3:8.3f} ms")
    print(f"ratio guard / one decoding step: {guard / decode:.3f}x; the stored cache still holds "
          f"{cache.get_seq_length()} tokens")


if __name__ == "__main__":
    main()
