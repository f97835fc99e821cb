"""Benchmark: ``cubepack verify`` against model_signing's hasher, sha256sum and hashlib on a
>= 1 GB cube.

Same run, same files, warm page cache (one untimed pass first); the contenders take turns for
``--rounds`` rounds and each keeps its best. model_signing (PyPI ``model-signing``, the OpenSSF
model signing library) hashes with its default configuration, ``hashing.Config().hash``: sha256
per file, in its own thread pool. Prints throughput and ratios; the targets are
``cubepack verify`` >= 1.0x model_signing's speed and >= 0.95x a 2-thread hashlib pool (both
cores saturated). Not a test.

Run: .venv/latest/bin/python bench/verify.py [--gib 1.0] [--files 8] [--rounds 3] [--smoke]
(``--smoke``: a few MB, in seconds, as CI runs it so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import hashlib_file, timed

import cubepack
from cubepack.testing.blobs import write_safetensors_blob


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (sha256sum): steadier than wall time
    on a machine shared with other tenants."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def model_signing_hasher() -> Callable[[Path], object] | None:
    """model_signing's own hasher (default configuration), or None when it is not installed."""
    try:
        from model_signing import hashing
    except ImportError:
        return None
    return lambda cube: hashing.Config().hash(cube)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.gib, args.files, args.rounds = 0.004, 2, 1
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

        contenders: dict[str, Callable[[], object]] = {
            "hashlib, 1 thread": lambda: [hashlib_file(p) for p in all_files],
            "hashlib, 2-thread pool": lambda: list(ThreadPoolExecutor(2).map(hashlib_file,
                                                                             all_files)),
            "sha256sum": lambda: subprocess.run(["sha256sum", *map(str, all_files)],
                                                check=True, capture_output=True),
            "cubepack verify": lambda: cubepack.verify(cube, progress=False),
        }
        signing = model_signing_hasher()
        if signing is not None:
            contenders["model_signing hash"] = lambda: signing(cube)
        results = {name: float("inf") for name in contenders}
        cpu = dict.fromkeys(contenders, float("inf"))
        for _ in range(args.rounds):  # take turns: a busy moment hits every contender alike
            for name, action in contenders.items():
                used = cpu_seconds()
                results[name] = min(results[name], timed(action))
                cpu[name] = min(cpu[name], cpu_seconds() - used)
        pool = results["hashlib, 2-thread pool"]
        ours = results["cubepack verify"]
        print(f"cube: {total / 1e9:.2f} GB in {len(all_files)} files, {os.cpu_count()} cores, "
              f"best of {args.rounds} rounds")
        for name, seconds in results.items():
            print(f"{name:<24} {seconds:6.3f} s  {total / seconds / 1e9:5.2f} GB/s  "
                  f"{pool / seconds:5.2f}x the 2-thread pool  CPU {cpu[name]:6.3f} s")
        print(f"ratio cubepack verify / 2-thread hashlib pool throughput: {pool / ours:.2f}x "
              "(target >= 0.95x)")
        if signing is None:
            print("model_signing is not installed (pip install model-signing): not compared")
        else:
            print(f"ratio cubepack verify / model_signing hash throughput: "
                  f"{results['model_signing hash'] / ours:.2f}x (target >= 1.0x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
