"""Benchmark: ``cubepack verify`` against the machine's sha256 limit, model_signing's hasher,
sha256sum and hashlib on a >= 1 GB cube.

Same run, same files, warm page cache (one untimed pass first); the contenders take turns for
``--rounds`` rounds (default 5). This machine's speed drifts by tens of percent a minute, so a
one-off baseline shows nothing: each round measures the limit just before and just after
cubepack (their mean is the round's limit), the ratio is taken within the round, and the median
over the rounds is reported. The limit is
``openssl speed -evp sha256`` at its largest block (16 KiB), times the core count (2 here: both
cores hashing, as verify does). model_signing (PyPI ``model-signing``, the OpenSSF model signing
library) hashes with its default configuration, ``hashing.Config().hash``: sha256 per file, in
its own thread pool. Targets (issue #39): ``cubepack verify`` >= 0.9 of the sha256 limit and
>= 1.05x model_signing's hashing. Not a test.

Run: .venv/latest/bin/python bench/verify.py [--gib 1.0] [--files 8] [--rounds 5] [--smoke]
(``--smoke``: a few MB, in seconds, as CI runs it so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import hashlib_file, sha256_limit, timed

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
    parser.add_argument("--rounds", type=int, default=5)
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
        results: dict[str, list[float]] = {name: [] for name in contenders}
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        cores = min(2, os.cpu_count() or 1)
        limit_ratio: list[float] = []  # per round: cubepack's throughput / the sha256 limit
        signing_ratio: list[float] = []  # per round: cubepack's / model_signing's throughput
        for _ in range(args.rounds):  # take turns: a busy moment hits every contender alike
            for name, action in contenders.items():
                if name == "cubepack verify":  # the limit measured on both sides of it
                    before = sha256_limit(cores)
                used = cpu_seconds()
                results[name].append(timed(action))
                cpu[name].append(cpu_seconds() - used)
                if name == "cubepack verify":
                    limit = (before + sha256_limit(cores)) / 2
            ours = results["cubepack verify"][-1]
            limit_ratio.append(total / ours / limit)
            if signing is not None:
                signing_ratio.append(results["model_signing hash"][-1] / ours)
        median = {name: statistics.median(times) for name, times in results.items()}
        pool = median["hashlib, 2-thread pool"]
        print(f"cube: {total / 1e9:.2f} GB in {len(all_files)} files, {os.cpu_count()} cores, "
              f"median of {args.rounds} paired rounds")
        for name, seconds in median.items():
            print(f"{name:<24} {seconds:6.3f} s  {total / seconds / 1e9:5.2f} GB/s  "
                  f"{pool / seconds:5.2f}x the 2-thread pool  "
                  f"CPU {statistics.median(cpu[name]):6.3f} s")
        print(f"ratio cubepack verify / sha256 limit: {statistics.median(limit_ratio):.2f}x "
              f"(median of per-round ratios: {', '.join(f'{r:.2f}' for r in limit_ratio)}; "
              f"the limit: {cores} x openssl speed -evp sha256 at 16 KiB; target >= 0.9x)")
        if signing is None:
            print("model_signing is not installed (pip install model-signing): not compared")
        else:
            print(f"ratio cubepack verify / model_signing hash: "
                  f"{statistics.median(signing_ratio):.2f}x (median of per-round ratios: "
                  f"{', '.join(f'{r:.2f}' for r in signing_ratio)}; target >= 1.05x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
