"""Benchmark: llama.cpp against transformers, and cubepack's llama.cpp state files against
llama.cpp's own save and load.

1. Cross-runtime error per dtype and length: the tiny llama model A converted by llama.cpp's
   own converter (f32 and f16 GGUFs, caches of the same dtype); transformers recomputes each
   state llama.cpp computed (max relative tensor error, max relative probe-logit error, how
   many probe draws the recomputation bounds refuse), and llama.cpp recomputes transformers'
   cache of the same tokens.
2. Cost, best of N: ``llama_state_save_file`` against :func:`cubepack.llamacpp.save_state`
   (identity, GGUF pin, KV file), ``llama_state_load_file`` against ``load_state``.

Not a test. Needs the llama.cpp environment (make test-llamacpp) and the converter:
CUBEPACK_LLAMACPP_CONVERT=.venv/llamacpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp/
convert_hf_to_gguf.py .venv/llamacpp/bin/python bench/llamacpp.py [--smoke]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import best_of, needs

needs("llama.cpp", "make test-llamacpp, then CUBEPACK_LLAMACPP_CONVERT=.venv/llamacpp-src/"
      "llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py .venv/llamacpp/bin/python "
      "bench/llamacpp.py [--smoke]", modules=("llama_cpp",),
      variables=("CUBEPACK_LLAMACPP_CONVERT",))

import torch  # noqa: E402 - after the check above: a clear line instead of a traceback

import cubepack
from cubepack import llamacpp
from cubepack.errors import RecomputationFailed
from cubepack.kv._recompute import recompute_layers
from cubepack.kv._torch import mapped_layers
from cubepack.llamacpp._runtime import _require_reproduced
from cubepack.testing import tiny


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    lengths, draws, tokens, repeats = ((12,), 2, 64, 2) if args.smoke else \
        ((12, 32, 128, 256), 40, 512, 7)
    converter = os.environ["CUBEPACK_LLAMACPP_CONVERT"]
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-llamacpp-"))
    try:
        folder = tiny.build_model(root / "a", tiny.llama_config(), seed=0,
                                  tokenizer=tiny.build_tokenizer())
        (folder / "tokenizer.model").write_bytes(tiny.sentencepiece_model())
        for outtype in ("f32", "f16"):
            subprocess.run([sys.executable, converter, str(folder), "--outtype", outtype,
                            "--outfile", str(root / f"{outtype}.gguf")], check=True,
                           capture_output=True)
        print("| dtype | tokens | tensors | probe logits | refused | llama.cpp checking "
              "transformers: tensors, logits, refused |")
        for outtype, dtype in (("f32", "float32"), ("f16", "float16")):
            llm = llamacpp.load(root / f"{outtype}.gguf", kv_dtype=dtype)
            model = tiny.load(folder, dtype=getattr(torch, dtype))
            for length in lengths:
                ids = random.Random(length).choices(range(tiny.VOCAB_SIZE), k=length)
                llm.reset()
                llm.eval(ids)
                saved = llamacpp.save_state(llm, root / "s.kv.safetensors", folder)
                info = cubepack.read_kv_header(saved)
                runs = [recompute_layers(model, mapped_layers(info), dtype, ids, "s", seed=seed)
                        for seed in range(draws)]
                print(f"| {dtype} | {length} | {runs[0].max_rel_error:.3g} | "
                      f"{max(r.max_logit_error for r in runs):.3g} | "
                      f"{sum(not r.ok for r in runs)} of {draws} | "
                      f"{reverse(llm, model, ids, root, draws)} |")
        cost(root, folder, tokens, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def reverse(llm, model, ids, root, draws) -> str:
    """llama.cpp recomputing transformers' cache of ``ids``: its worst errors, refusals."""
    kv = cubepack.save_kv_cache(cubepack.kv.prefill(model, torch.tensor([ids])),
                                root / "t.kv.safetensors", producer=model, token_ids=ids)
    info = cubepack.read_kv_header(kv)
    refused, details = 0, []
    for seed in range(draws):
        try:
            details.append(_require_reproduced(llm, info, mapped_layers(info), seed))
        except RecomputationFailed as exc:
            refused += 1
            details.append(str(exc))
    gaps = [float(x) for d in details for x in re.findall(r"(?:within|differ by) ([0-9.e+-]+) ",
                                                            d)]
    errors = [float(x) for d in details for x in re.findall(r"relative error ([0-9.e+-]+) ", d)]
    return (f"{max(errors, default=float('nan')):.3g}, {max(gaps, default=float('nan')):.3g}, "
            f"{refused} of {draws}")


def cost(root: Path, folder: Path, tokens: int, repeats: int) -> None:
    import llama_cpp

    llm = llamacpp.load(root / "f32.gguf", n_ctx=max(512, tokens))
    ids = random.Random(0).choices(range(tiny.VOCAB_SIZE), k=tokens)
    llm.reset()
    llm.eval(ids)
    array = (llama_cpp.llama_token * len(ids))(*ids)
    own = root / "own.bin"
    out, count = (llama_cpp.llama_token * len(ids))(), ctypes.c_size_t()
    save_own = best_of(lambda: llama_cpp.llama_state_save_file(
        llm.ctx, str(own).encode(), array, len(ids)), repeats)
    save_ours = best_of(lambda: llamacpp.save_state(llm, root / "o.kv.safetensors", folder),
                        repeats)
    load_own = best_of(lambda: llama_cpp.llama_state_load_file(
        llm.ctx, str(own).encode(), out, len(ids), ctypes.byref(count)), repeats)
    load_ours = best_of(lambda: llamacpp.load_state(llm, root / "o.kv.safetensors"), repeats)
    print(f"\n{tokens} tokens, a {own.stat().st_size / 1e6:.2f} MB state, best of {repeats}:")
    print(f"save: llama.cpp {save_own * 1e3:.2f} ms, save_state {save_ours * 1e3:.2f} ms "
          f"({save_ours / save_own:.1f}x)")
    print(f"load: llama.cpp {load_own * 1e3:.2f} ms, load_state {load_ours * 1e3:.2f} ms "
          f"({load_ours / load_own:.1f}x)")


if __name__ == "__main__":
    main()
