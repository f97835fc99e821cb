"""Benchmark: peak memory of ``cubepack pack --legacy-pickle`` against the pickle's size.

A MemOS cube whose activation pickle holds ``--mb`` MB of KV caches (512-token caches of a
2-layer tiny Llama, random tensors; written in MemOS's pickle format by the tests' writer) is
packed by ``cubepack pack`` in a child process; its peak RSS (``ru_maxrss``) is compared with
the pickle's size, and with the peak of a child that only imports what pack imports (torch,
transformers, cubepack), so the interpreter's own share is visible. Target: peak <= 1.5x the
pickle + 300 MB (pack reads the pickle item by item: one item's tensors decoded at a time).
Not a test (``--smoke`` runs 4 MB in seconds, as CI does).

Run: .venv/latest/bin/python bench/pack_memory.py [--mb 300] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401 - quiets the libraries for the benchmark's whole process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
os.environ.setdefault("CUBEPACK_NO_PROGRESS", "1")

TOKENS = 512


def child_peak_mb(argv: list[str]) -> float:
    """Peak RSS in MB of a child running ``argv`` (its own process: nothing else counted)."""
    code = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "assert done.returncode == 0, done.returncode\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[-1]) / 1024


def build(folder: Path, megabytes: int) -> Path:
    import torch
    from transformers import DynamicCache

    from cubepack.testing import tiny

    from memos_format import write_cube

    model_dir = tiny.build_model(folder / "model", tiny.llama_config(), seed=0,
                                 tokenizer=tiny.build_tokenizer())
    per_item = 2 * 2 * 2 * TOKENS * 16 * 4  # layers x (keys, values) x heads x tokens x dim x 4 B
    caches = {}
    generator = torch.Generator().manual_seed(0)
    for index in range(max(1, megabytes * 1024 * 1024 // per_item)):
        cache = DynamicCache()
        for layer in range(2):
            cache.update(torch.randn(1, 2, TOKENS, 16, generator=generator),
                         torch.randn(1, 2, TOKENS, 16, generator=generator), layer)
        caches[f"item-{index:05d}"] = cache
    return write_cube(folder / "cube", str(model_dir), caches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    megabytes = 4 if args.smoke else args.mb
    work = Path(tempfile.mkdtemp(prefix="cubepack-bench-pack-"))
    try:
        cube = build(work, megabytes)
        pickle_mb = (cube / "activation_memory.pickle").stat().st_size / 2**20
        imports = child_peak_mb([sys.executable, "-c", "import torch, transformers, "
                                 "cubepack.ops._pack, cubepack.memos_format._pickle"])
        peak = child_peak_mb([sys.executable, "-m", "cubepack", "pack", str(cube),
                              "--legacy-pickle"])
        budget = 1.5 * pickle_mb + 300
        print(f"pickle {pickle_mb:.0f} MB; pack peak RSS {peak:.0f} MB "
              f"(ratio {peak / pickle_mb:.2f}x the pickle; {peak - imports:.0f} MB above the "
              f"{imports:.0f} MB its imports take); budget 1.5x + 300 MB = {budget:.0f} MB: "
              f"{'within' if peak <= budget else 'OVER'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
