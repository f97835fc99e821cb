"""Benchmark: memories on demand (issue #40 items 2 and 6): opening a remote cube and loading
one memory, against fetching the same bytes with plain HTTP.

Cubes of ``--sizes`` small activations (default 1,000 and 100,000; a 2-layer tiny Llama's
4-token cache, ~3 KB each, sharded) are packed and pushed to a local endpoint in its own process
(as ``cubepack hub serve`` runs). Then, in each of ``--rounds`` rounds and for each size, one
memory (another each round) is loaded both ways, taking turns at going first:

- ``cubepack.open("REPO@COMMIT").load(item, model)``: the lock fetched at the commit (no HEAD:
  a commit needs no resolving) and checked, the memory's shard index fetched, checked against
  the lock and read for that memory, its range fetched, its
  digest and checksums checked, its producer against the model, the ``DynamicCache`` built;
- the baseline: the lock, the index and a plain ranged GET of that memory, on the same HTTP
  session (huggingface_hub's), nothing checked or built.

Prints the median over the rounds of each round's ratio (targets: <= 1.5x at 100,000 memories,
<= 1.3x at 1,000), and the open-and-load at the largest size against the smallest, round by round
(a memory of a cube 100 times larger costs no more to reach). Not a test (``--smoke``: 150 and
300 memories, as CI runs it so the script cannot rot).

Run: .venv/latest/bin/python bench/on_demand.py [--sizes 1000 100000] [--rounds 15] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402,F401 (declines in one line where cubepack or torch is missing)
import _cubes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100000])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="150 and 300 memories (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.rounds = [150, 300], 2
    sizes = sorted(args.sizes)

    import cubepack
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session

    from cubepack.hub import push

    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-on-demand-"))
    try:
        model_dir, model, cache, ids = _cubes.small_model(root)
        with _cubes.endpoint(root / "hub") as (url, _port):
            cubes = {}
            for count in sizes:
                folder = root / f"cube-{count}"
                start = time.perf_counter()
                _cubes.build_small(folder, model_dir, cache, ids, count)
                cubepack.pack(folder, progress=False, shards=True)
                repo = f"bench/on-demand-{count}"
                sha = push(folder, repo, endpoint=url, allow_local_paths=True).commit_sha
                lock = json.loads((folder / "cubepack.lock").read_bytes())
                where = {}  # item -> (index path, offset, length, shard path)
                for shard, entry in lock["shards"].items():
                    index = json.loads((folder / entry["index"]).read_bytes())
                    for item, memory in index["memories"].items():
                        where[item] = (entry["index"], memory["offset"], memory["length"], shard)
                sizes_of = {path: (folder / path).stat().st_size
                            for path in ("cubepack.lock", *{w[0] for w in where.values()})}
                cubes[count] = (repo, sha, where, sizes_of)
                shutil.rmtree(folder)
                print(f"{count:>6} memories: {len(lock['shards'])} shards, lock "
                      f"{sizes_of['cubepack.lock']:,} bytes, built, packed and pushed in "
                      f"{time.perf_counter() - start:.0f} s", flush=True)

            session = get_session()

            def plain(count: int, item: str) -> int:
                repo, sha, where, _ = cubes[count]
                index, offset, length, shard = where[item]
                got = 0
                for path, headers in (("cubepack.lock", {}), (index, {}),
                                      (shard, {"Range": f"bytes={offset}-{offset + length - 1}"})):
                    response = session.get(hf_hub_url(repo, path, repo_type="dataset",
                                                      revision=sha, endpoint=url),
                                           headers=headers)
                    if response.status_code not in (200, 206):
                        raise SystemExit(f"GET {path} answered {response.status_code}")
                    got += len(response.content)
                return got

            def ours(count: int, item: str) -> None:
                repo, sha, _, _ = cubes[count]
                remote = cubepack.open(f"{repo}@{sha}", endpoint=url)
                remote.load(item, model)

            times: dict[tuple[int, str], list[float]] = {(c, w): [] for c in sizes
                                                         for w in ("plain", "ours")}
            fetched = {}
            for round_ in range(args.rounds + 1):  # round 0 warms: imports, connections
                for count in sizes:
                    item = _cubes.item_id((round_ * 7919 + 13) % count)
                    order = [("plain", plain), ("ours", ours)]
                    for name, action in (order if round_ % 2 else order[::-1]):
                        start = time.perf_counter()
                        result = action(count, item)
                        took = time.perf_counter() - start
                        if name == "plain":
                            fetched[count] = result
                        if round_:
                            times[(count, name)].append(took)
        print(f"\nload average {_cubes.load_average()}; median of {args.rounds} rounds, one "
              "memory each (another each round)")
        targets = {sizes[0]: 1.3, sizes[-1]: 1.5}
        for count in sizes:
            ratios = [o / p for p, o in zip(times[(count, "plain")], times[(count, "ours")])]
            print(f"ratio open + load / three plain GETs at {count} memories: "
                  f"{statistics.median(ratios):.2f}x (open + load "
                  f"{statistics.median(times[(count, 'ours')]) * 1e3:.1f} ms, the GETs "
                  f"{statistics.median(times[(count, 'plain')]) * 1e3:.1f} ms for "
                  f"{fetched[count]:,} bytes; target <= {targets.get(count, 1.5)}x)")
        small, large = sizes[0], sizes[-1]
        across = [b / a for a, b in zip(times[(small, "ours")], times[(large, "ours")])]
        print(f"ratio open + load at {large} memories / at {small}: "
              f"{statistics.median(across):.2f}x median of per-round ratios (target <= 1.3x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
