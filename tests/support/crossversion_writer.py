"""Run by another Python environment: write a KV file and its continuation logits.

Usage: python crossversion_writer.py MODEL_DIR OUT_DIR [MODEL_DIR OUT_DIR ...]
Writes OUT_DIR/cache.kv.safetensors, OUT_DIR/logits.safetensors and OUT_DIR/identity.json for
each pair, and OUT_DIR/cache-bfloat16.kv.safetensors (the model run in bfloat16: the proof by
recomputation is checked across versions in the dtype with the most noise) (one process for all: starting one costs more than the writing).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import cubepack
from cubepack.testing import tiny

sys.path.insert(0, str(Path(__file__).parent))
from helpers import build_cache, continue_greedy

for model_dir, out in zip(map(Path, sys.argv[1::2]), map(Path, sys.argv[2::2])):
    model = tiny.load(model_dir)
    cache = build_cache(model, torch.arange(2, 12)[None])
    cubepack.save_kv_cache(cache, out / "cache.kv.safetensors", producer=model,
                           token_ids=torch.arange(2, 12)[None])
    half = tiny.load(model_dir, dtype=torch.bfloat16)
    cubepack.save_kv_cache(build_cache(half, torch.arange(2, 40)[None]),
                           out / "cache-bfloat16.kv.safetensors", producer=half,
                           token_ids=torch.arange(2, 40)[None])
    logits = continue_greedy(model, cache, 30, 6)
    save_file({f"step{i}": t.contiguous() for i, t in enumerate(logits)},
              str(out / "logits.safetensors"))
    (out / "identity.json").write_text(json.dumps(cubepack.fingerprint(model).strict()))
print(__import__("transformers").__version__)
