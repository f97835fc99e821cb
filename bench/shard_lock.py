"""Benchmark: the lock's size against the memory count, one file a memory and sharded.

Builds a plain bundle of N copies of one small KV file (a 2-layer tiny Llama's 4-token cache,
~4 KB; distinct ids by file name), packs it one file a memory (``--no-shards``) and sharded
(``--shards``), and prints the lock's bytes and the largest index's for each N. The lock of a
sharded cube grows with its shards, not its memories. Not a test.

Run: .venv/latest/bin/python bench/shard_lock.py [--sizes 1000 10000] [--unsharded-up-to N]
[--smoke]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402,F401 (declines in one line where cubepack or torch is missing)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--unsharded-up-to", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="150 memories (CI's smoke run)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.unsharded_up_to = [150], 150
    import torch

    import cubepack
    from cubepack._util import constants
    from cubepack.testing import tiny

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = tiny.build_zoo(root / "zoo")["a"]
        model = tiny.load(model_dir)
        ids = [1, 2, 3, 4]
        cache = cubepack.prefill(model, torch.tensor([ids]))
        template = root / "template.kv.safetensors"
        cubepack.save_kv_cache(cache, template, producer=cubepack.fingerprint(model_dir),
                               token_ids=ids)
        for count in args.sizes:
            locks = {}
            for shards in (False, True):
                if not shards and count > args.unsharded_up_to:
                    continue
                cube = root / f"cube-{count}-{shards}"
                (cube / "activations").mkdir(parents=True)
                for index in range(count):
                    shutil.copyfile(template, cube / "activations"
                                    / f"item-{index:06d}{constants.KV_SUFFIX}")
                start = time.perf_counter()
                cubepack.pack(cube, cube_id="bench/shards", model=str(model_dir),
                              shards=shards, progress=False)
                took = time.perf_counter() - start
                lock = (cube / constants.LOCK_FILENAME).stat().st_size
                indexes = sorted(cube.glob("shards/*.index.json"))
                largest = max((p.stat().st_size for p in indexes), default=0)
                print(f"{count:>6} memories, {'sharded ' if shards else 'one file'}: lock "
                      f"{lock:>10,} bytes ({lock / count:6.1f} a memory), {len(indexes)} "
                      f"index(es), largest {largest:,} bytes ({largest / count:5.1f} a "
                      f"memory); pack {took:.1f} s", flush=True)
                shutil.rmtree(cube)
                locks[shards] = lock
            if len(locks) == 2:
                print(f"{count:>6} memories: lock bytes ratio, one file a memory / sharded: "
                      f"{locks[False] / locks[True]:.1f}x", flush=True)


if __name__ == "__main__":
    main()
