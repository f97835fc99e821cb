"""Benchmark: moving a KV cache between MLX-LM and cubepack, against MLX-LM's own save/load.

A Llama-shaped model (8 layers, hidden 512, 4 KV heads of 64) run by MLX on 2048 tokens; its
prompt cache, best of N, contenders taking turns in the same run:

- ``cubepack export mlx`` (KV file -> prompt cache) against mlx_lm's ``save_prompt_cache`` of
  the same cache (target <= 1.2x), and against that save made durable (an ``fsync``, which
  every cubepack write does before its atomic rename);
- ``cubepack import mlx`` (prompt cache -> KV file, identity included) against mlx_lm's
  ``load_prompt_cache`` of that file with its arrays evaluated (MLX loads lazily), against
  mlx_lm's load + save (the same read and write an import does; target <= 1.2x), and against
  that load + save made durable (the fsync again);
- ``cubepack.mlx.load_prompt_cache`` (the producer check, then the same load) against
  ``mlx_lm``'s (target <= 1.2x).

Then the cross-runtime error per dtype on the tiny test model A (large weights, a worst case):
an MLX prefill recomputed by transformers and the reverse, up to 512 tokens, with the bounds
of ``kv/_recompute.py``. Not a test (``--smoke``: tiny sizes, as CI runs it in the mlx
environment).

Run: .venv/mlx/bin/python bench/runtimes.py [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from _common import needs

needs("mlx", "make setup, then .venv/mlx/bin/python bench/runtimes.py [--smoke]",
      modules=("mlx", "mlx_lm"))

import mlx.core as mx  # noqa: E402 - after the check above: a clear line instead of a traceback
import numpy
import torch
from _common import best_of, llama_config
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

import cubepack
import cubepack.mlx
from cubepack.kv._recompute import LOGIT_BOUND, TOLERANCE, TorchRuntime, recompute_layers
from cubepack.mlx._runtime import MLXRuntime
from cubepack.testing import tiny

REPEATS = 7


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    layers, hidden, tokens, repeats = (2, 64, 32, 2) if args.smoke else (8, 512, 2048, REPEATS)
    lengths = (16,) if args.smoke else (64, 256, 512)
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-runtimes-"))
    try:
        config = llama_config(layers, hidden)
        folder = tiny.build_model(root / "model", config, seed=0, tokenizer=tiny.build_tokenizer())
        _conversion_cost(root, folder, layers, hidden, tokens, repeats)
        _cross_runtime_error(root, lengths)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _conversion_cost(root: Path, folder: Path, layers: int, hidden: int, tokens: int,
                     repeats: int) -> None:
    model, _ = cubepack.mlx.load(folder)
    ids = [int(t) for t in numpy.random.default_rng(0).integers(2, tiny.VOCAB_SIZE, tokens)]
    cache = cubepack.mlx.prefill(model, ids)
    native = root / "native.safetensors"
    save_prompt_cache(str(native), cache)
    kv = cubepack.mlx.import_prompt_cache(native, folder, out=root / "item.kv.safetensors",
                                          token_ids=ids)
    ours = root / "ours.safetensors"
    cubepack.mlx.export_prompt_cache(kv, ours)
    size = kv.stat().st_size / 1e6

    def mlx_load(path=native):
        loaded = load_prompt_cache(str(path))
        mx.eval([c.keys for c in loaded] + [c.values for c in loaded])

    def mlx_round_trip():
        save_prompt_cache(str(root / "again.safetensors"), load_prompt_cache(str(native)))

    def durable_round_trip():  # the same, made durable as every cubepack write is
        mlx_round_trip()
        with open(root / "again.safetensors", "rb+") as handle:
            os.fsync(handle.fileno())

    def checked_load():
        loaded = cubepack.mlx.load_prompt_cache(ours, model)
        mx.eval([c.keys for c in loaded] + [c.values for c in loaded])

    def durable_save():  # what every cubepack write adds: fsync before the rename
        save_prompt_cache(str(root / "d.safetensors"), cache)
        with open(root / "d.safetensors", "rb+") as handle:
            os.fsync(handle.fileno())

    contenders = {
        "mlx_lm save_prompt_cache": lambda: save_prompt_cache(str(root / "s.safetensors"), cache),
        "mlx_lm save + fsync": durable_save,
        "cubepack export mlx": lambda: cubepack.mlx.export_prompt_cache(kv, root / "e.safetensors"),
        "mlx_lm load_prompt_cache": mlx_load,
        "mlx_lm load + save": mlx_round_trip,
        "mlx_lm load + save + fsync": durable_round_trip,
        "cubepack import mlx": lambda: cubepack.mlx.import_prompt_cache(
            native, folder, out=root / "i.kv.safetensors", token_ids=ids),
        "cubepack.mlx.load_prompt_cache": checked_load,
    }
    outputs = [root / name for name in ("s.safetensors", "d.safetensors", "e.safetensors",
                                        "again.safetensors", "i.kv.safetensors")]
    for action in contenders.values():  # warm up: page cache, hash cache, kernels
        action()
    results = {}
    # Twice: every write to a new file (the usual case: a converted cache gets its own name;
    # each contender's output removed, untimed, before its turn), then over the file the last
    # turn wrote (a durable file's blocks are freed at the rename; a truncated file that was
    # never synced had none yet, so replacing costs the durable writers more).
    for replacing in (False, True):
        best = {name: float("inf") for name in contenders}
        for _ in range(repeats):  # take turns, so load from other work hits every contender alike
            for name, action in contenders.items():
                if not replacing:
                    for output in outputs:
                        output.unlink(missing_ok=True)
                best[name] = min(best[name], best_of(action, 1))
        results[replacing] = best
    print(f"model: {layers} layers, hidden {hidden}; cache: {tokens} tokens, float32, "
          f"{size:.1f} MB (mlx {mx.__version__})")
    for replacing, best in results.items():
        print("writing new files:" if not replacing else "replacing the files the last turn wrote:")
        _report(best)


def _report(best: dict[str, float]) -> None:
    for name, seconds in best.items():
        print(f"  {name:<32} best {seconds * 1e3:8.2f} ms")
    print(f"  ratio export / mlx_lm save: {best['cubepack export mlx'] / best['mlx_lm save_prompt_cache']:.2f}x (target <= 1.2x); "
          f"export / mlx_lm save + fsync: {best['cubepack export mlx'] / best['mlx_lm save + fsync']:.2f}x")
    print(f"  ratio import / mlx_lm load: {best['cubepack import mlx'] / best['mlx_lm load_prompt_cache']:.2f}x; "
          f"import / mlx_lm load + save: {best['cubepack import mlx'] / best['mlx_lm load + save']:.2f}x (target <= 1.2x); "
          f"import / mlx_lm load + save + fsync: {best['cubepack import mlx'] / best['mlx_lm load + save + fsync']:.2f}x")
    print(f"  ratio checked load / mlx_lm load: {best['cubepack.mlx.load_prompt_cache'] / best['mlx_lm load_prompt_cache']:.2f}x (target <= 1.2x)")


def _cross_runtime_error(root: Path, lengths: tuple[int, ...]) -> None:
    zoo = root / "zoo"
    folder = tiny.build_model(zoo / "model-a", tiny.llama_config(), seed=0,
                              tokenizer=tiny.build_tokenizer())
    rng = numpy.random.default_rng(1)
    for dtype in ("float32", "float16", "bfloat16"):
        torch_model = tiny.load(folder, dtype=getattr(torch, dtype))
        mlx_model, _ = cubepack.mlx.load(folder, dtype=dtype)
        worst = {"mlx->transformers": [0.0, 0.0, True], "transformers->mlx": [0.0, 0.0, True]}
        for length in lengths:
            ids = [int(t) for t in rng.integers(2, tiny.VOCAB_SIZE, length)]
            made = {"mlx": MLXRuntime(mlx_model).prefill_layers(ids),
                    "transformers": TorchRuntime(torch_model).prefill_layers(ids)}
            for direction, stored, runtime in (
                    ("mlx->transformers", made["mlx"], TorchRuntime(torch_model)),
                    ("transformers->mlx", made["transformers"], MLXRuntime(mlx_model))):
                result = recompute_layers(None, stored, dtype, ids, direction, seed=length,
                                          runtime=runtime)
                entry = worst[direction]
                entry[0] = max(entry[0], result.max_rel_error)
                entry[1] = max(entry[1], result.max_logit_error)
                entry[2] = entry[2] and result.ok
        print(f"cross-runtime {dtype} (bounds: tensors {TOLERANCE[dtype]:g}, logits "
              f"{LOGIT_BOUND[dtype]:g}), up to {max(lengths)} tokens: " + "; ".join(
                  f"{d} tensors {t:.2g}, logits {g:.2g}{'' if ok else ' REFUSED'}"
                  for d, (t, g, ok) in worst.items()))


if __name__ == "__main__":
    main()
