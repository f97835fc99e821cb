"""Benchmark: ``cubepack verify`` against sha256sum and hashlib baselines on a >= 1 GB cube.

Same run, same files, warm page cache (one untimed pass first). Prints throughput and ratios;
the target is >= 0.95x a 2-thread hashlib pool, i.e. both cores saturated. Not a test.

Run: .venv/latest/bin/python bench/verify.py [--gib 1.0] [--files 8] [--smoke]
(``--smoke``: a few MB, in seconds, as CI runs it so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import hashlib_file, timed

import cubepack
from cubepack.testing.blobs import write_safetensors_blob


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.gib, args.files = 0.004, 2
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-verify-"))
    try:
        cube = root / "cube"
        per_file = int(args.gib * 1024**3 / args.files)
        block = os.urandom(16 * 1024 * 1024)
        for index in range(args.files):
            write_safetensors_blob(cube / "data" / f"part-{index}.safetensors", per_file,
                                   seed=index, block=block)
        (cube / "config.json").write_text('{"cube_id": "bench/cube"}')
        cubepack.pack(cube, progress=False)
        total = sum(p.stat().st_size for p in cube.rglob("*") if p.is_file())
        all_files = [p for p in cube.rglob("*") if p.is_file()]
        for path in all_files:  # warm the page cache
            hashlib_file(path)

        results = {
            "hashlib, 1 thread": timed(lambda: [hashlib_file(p) for p in all_files]),
            "hashlib, 2-thread pool": timed(lambda: list(ThreadPoolExecutor(2).map(hashlib_file, all_files))),
            "sha256sum": timed(lambda: subprocess.run(["sha256sum", *map(str, all_files)],
                                                      check=True, capture_output=True)),
            "cubepack verify": timed(lambda: cubepack.verify(cube, progress=False)),
        }
        pool = results["hashlib, 2-thread pool"]
        print(f"cube: {total / 1e9:.2f} GB in {len(all_files)} files, {os.cpu_count()} cores")
        for name, seconds in results.items():
            print(f"{name:<24} {seconds:6.3f} s  {total / seconds / 1e9:5.2f} GB/s  "
                  f"{pool / seconds:5.2f}x the 2-thread pool")
        print(f"ratio cubepack verify / 2-thread hashlib pool throughput: "
              f"{pool / results['cubepack verify']:.2f}x (target >= 0.95x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
