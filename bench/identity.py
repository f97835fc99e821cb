"""Benchmark: the first and the repeated fingerprint of a ~1 GB Hub-cached model.

A model is laid out in a fresh HF cache as huggingface_hub lays it out (blobs named by sha256,
snapshot symlinks). The first fingerprint hashes every blob once (names are claims until
hashed); repeats find the digests by (device, inode, size, mtime_ns, ctime_ns). Printed against
one plain ``hashlib`` pass over the same files, in the same run. Targets: first <= 1.1x the
hashlib pass; repeat <= 20 ms. Not a test (``--smoke``: 8 MB, as CI runs it).

Run: .venv/latest/bin/python bench/identity.py [--gib 1.0] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from _common import hashlib_file, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.gib = 0.008
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-identity-"))
    os.environ["CUBEPACK_CACHE"] = str(root / "cubepack-cache")
    try:
        from cubepack import fingerprint
        from cubepack.testing import tiny
        from cubepack.testing.blobs import write_safetensors_blob

        source = root / "source"
        tiny.build_tokenizer().save_pretrained(source)
        tiny.llama_config().save_pretrained(source)
        size = int(args.gib * 1024**3) // 2
        for index in range(2):  # two shards, as large models ship
            write_safetensors_blob(source / f"model-0000{index + 1}-of-00002.safetensors", size,
                                   seed=index)
        commit = "c" * 40
        repo = root / "hf-cache" / "models--bench--model"
        snapshot = repo / "snapshots" / commit
        (repo / "blobs").mkdir(parents=True)
        snapshot.mkdir(parents=True)
        for path in sorted(source.iterdir()):
            blob = repo / "blobs" / hashlib_file(path)
            os.link(path, blob)
            os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
        files = [p for p in snapshot.iterdir() if p.name.endswith(".safetensors")]
        total = sum(p.stat().st_size for p in files)
        for path in files:  # warm the page cache, so both sides measure hashing, not the disk
            hashlib_file(path)

        baseline = timed(lambda: [hashlib_file(p) for p in files])
        first = timed(lambda: fingerprint(snapshot))
        repeats = sorted(timed(lambda: fingerprint(snapshot)) for _ in range(5))
        print(f"model: {total / 1e9:.2f} GB in {len(files)} weight files, HF-cache layout, "
              f"{os.cpu_count()} cores")
        print(f"hashlib, one pass            {baseline:7.3f} s")
        print(f"first fingerprint            {first:7.3f} s")
        print(f"repeated fingerprint (best)  {repeats[0] * 1e3:7.2f} ms  (median "
              f"{repeats[2] * 1e3:.2f} ms; target <= 20 ms)")
        print(f"ratio first fingerprint / hashlib pass: {first / baseline:.2f}x (target <= 1.1x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
