"""Benchmark: cubes at Hub scale (issue #40 item 6), each target a ratio measured in one run.

**Many small memories** (``--sizes``, default 1,000, 10,000 and 100,000 activations of a 2-layer
tiny Llama's 4-token KV cache, ~3 KB each; built with ``save_kv_cache``, untimed): each cube is
packed (sharded above 100 memories), verified, pushed to a local endpoint in its own process
(as ``cubepack hub serve`` runs) and pulled back with verification into a fresh folder and HF
cache. Per step, the time per memory at each size over the time per memory at the smallest
(1.00x is linear; target <= 1.3x). Then:

- the pull of the ``--baseline-size`` cube (default 10,000) against ``hf download`` of ONE file
  holding as many bytes (``hf_hub_download(..., local_dir=...)``), paired rounds taking turns,
  median of the rounds' ratios (target <= 1.5x);
- an incremental push at each size: ``--add`` memories appended (ids after the others'), packed,
  pushed again; the bytes of the files the push uploaded against the new memories' bytes plus
  512 KiB (target <= 1.1x). A push that uploads more is reported as "not yet incremental",
  with its bytes;
- the endpoint's answer time for a HEAD of the lock in the largest repo against the smallest.

**Large memories** (``--large-count`` of ``--large-mib`` MiB, default 16 of 256 MiB: the KV
shape of an 8B Llama in bf16, 2,048 tokens; and one memory of ``--over-mib`` MiB packed with a
shard bound of half its size, so it gets a shard of its own): ``cubepack verify`` against the
2-core sha256 limit (``openssl speed``, measured just before and after verify in each round;
target >= 0.9; openssl divides by its CPU time, so on a loaded machine also against two
``openssl speed -multi 2 -elapsed`` processes' wall clock, under the same load), and ``cubepack pull --verify`` against ``hf download --local-dir`` of the same
commit (paired rounds; target <= 1.15x). The large axis needs about four times the cube's bytes
of free disk at once (cube, endpoint, two downloads); with less it is scaled down and says so.

Not a test (``--smoke``: tiny sizes in seconds, as CI runs it so the script cannot rot).

Run: .venv/latest/bin/python bench/scale.py [--sizes 1000 10000 100000] [--baseline-size 10000]
[--rounds 3] [--add 10] [--large-count 16] [--large-mib 256] [--over-mib 512] [--no-large]
[--no-small] [--smoke]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402,F401 (declines in one line where cubepack or torch is missing)
import _cubes
from _common import sha256_limit, timed

STEPS = ("pack", "verify", "push", "pull --verify")
HEADS = 300
KIB = 1024
MIB = 1024 * 1024


def head_latency(port: int, repo: str, sha: str) -> float:
    """Median seconds for one HEAD /resolve of the lock, over a keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    path = f"/datasets/{repo}/resolve/{sha}/cubepack.lock"
    times = []
    try:
        for attempt in range(HEADS + 20):
            start = time.perf_counter()
            connection.request("HEAD", path)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"HEAD {path} answered {response.status}")
            if attempt >= 20:  # warm: connection, page cache, the endpoint's commit cache
                times.append(time.perf_counter() - start)
    finally:
        connection.close()
    return statistics.median(times)


def paired(plain, ours, rounds: int, cleanup) -> tuple[list[float], list[float]]:
    """``rounds`` rounds of the baseline ``plain(round)`` and ``ours(round)``, taking turns at
    going first; ``cleanup(round)`` after each run (fresh folders, no dirty pages left)."""
    times: dict[str, list[float]] = {"plain": [], "ours": []}
    for round_ in range(rounds):
        order = (("plain", plain), ("ours", ours))
        for name, action in (order if round_ % 2 == 0 else order[::-1]):
            times[name].append(timed(lambda: action(round_)))
            cleanup(round_)
            os.sync()
    return times["plain"], times["ours"]


def small_axis(args, root: Path, url: str, port: int) -> None:
    import cubepack
    from huggingface_hub import hf_hub_download

    from cubepack.hub import pull, push

    model_dir, _model, cache, ids = _cubes.small_model(root)
    times: dict[int, dict[str, float]] = {}
    heads: dict[int, float] = {}
    increments: dict[int, tuple[int, int, list[str]]] = {}
    baseline: tuple[int, list[float], list[float]] | None = None
    for count in args.sizes:
        cube = root / f"cube-{count}"
        start = time.perf_counter()
        _cubes.build_small(cube, model_dir, cache, ids, count)
        built = time.perf_counter() - start
        repo = f"bench/scale-{count}"
        step: dict[str, float] = {}
        step["pack"] = timed(lambda: cubepack.pack(cube, progress=False))
        step["verify"] = timed(lambda: cubepack.verify(cube, progress=False))
        start = time.perf_counter()
        sha = push(cube, repo, endpoint=url, allow_local_paths=True).commit_sha
        step["push"] = time.perf_counter() - start
        pulled = root / f"pulled-{count}"
        step["pull --verify"] = timed(lambda: pull(
            f"{repo}@{sha}", endpoint=url, cache_dir=root / f"hf-{count}", local_dir=pulled,
            progress=False))
        shutil.rmtree(pulled)
        shutil.rmtree(root / f"hf-{count}", ignore_errors=True)
        times[count] = step
        heads[count] = head_latency(port, repo, sha)
        shards = len(list((cube / "shards").glob("*.kvshard")))
        print(f"{count:>6} memories ({_cubes.folder_bytes(cube) / 1e6:.1f} MB, {shards} "
              f"shards; built in {built:.0f} s): "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in step.items())
              + f", HEAD {heads[count] * 1e3:.2f} ms", flush=True)

        if count == args.baseline_size:
            size = _cubes.folder_bytes(cube)
            plain_sha = _cubes.plain_file_repo(url, "bench/plain-file", size, root)

            def plain(round_: int) -> None:
                hf_hub_download("bench/plain-file", "blob.bin", repo_type="dataset",
                                revision=plain_sha, endpoint=url,
                                cache_dir=root / f"plain-cache-{round_}",
                                local_dir=root / f"plain-{round_}")

            def ours(round_: int) -> None:
                pull(f"{repo}@{sha}", endpoint=url, cache_dir=root / f"pull-cache-{round_}",
                     local_dir=root / f"pull-{round_}", progress=False)

            def cleanup(round_: int) -> None:
                for name in ("plain-cache", "plain", "pull-cache", "pull"):
                    shutil.rmtree(root / f"{name}-{round_}", ignore_errors=True)

            plain_times, our_times = paired(plain, ours, args.rounds, cleanup)
            baseline = (count, plain_times, our_times)
            print(f"        pull of the {count}-memory cube against hf download of one "
                  f"{size / 1e6:.1f} MB file: " + ", ".join(
                      f"{o:.2f} s vs {p:.2f} s" for p, o in zip(plain_times, our_times)),
                  flush=True)

        new_bytes = _cubes.add_small(cube, model_dir, cache, ids, range(count, count + args.add))
        cubepack.pack(cube, progress=False)
        result = push(cube, repo, endpoint=url, allow_local_paths=True)
        sent = sum((cube / name).stat().st_size for name in result.uploaded)
        increments[count] = (new_bytes, sent, result.uploaded)
        print(f"        push after {args.add} memories added ({new_bytes:,} bytes): "
              f"{len(result.uploaded)} files uploaded, {sent:,} bytes ("
              + ", ".join(sorted(result.uploaded)) + ")", flush=True)
        shutil.rmtree(cube)

    sizes = args.sizes
    small, large = sizes[0], sizes[-1]
    print(f"\nmany small memories (load average {_cubes.load_average()})")
    print(f"{'step':<14}" + "".join(f"{count:>10} ms/item" for count in sizes)
          + "   ratio to linear (per item, vs the smallest)")
    worst = 0.0
    for name in STEPS:
        per_item = [times[count][name] / count for count in sizes]
        ratios = [value / per_item[0] for value in per_item]
        worst = max(worst, *ratios)
        print(f"{name:<14}" + "".join(f"{value * 1e3:>18.3f}" for value in per_item)
              + "   " + "  ".join(f"{ratio:.2f}x" for ratio in ratios))
    if len(sizes) > 2:  # the smallest size carries fixed costs: the top decade alone
        before = sizes[-2]
        print(f"from {before} to {large} memories: " + ", ".join(
            f"{name} {times[large][name] / large / (times[before][name] / before):.2f}x"
            for name in STEPS))
    print(f"ratio to linear, worst step at any size: {worst:.2f}x (target <= 1.3x)")
    print(f"HEAD /resolve of the lock: {heads[small] * 1e3:.2f} ms at {small} memories, "
          f"{heads[large] * 1e3:.2f} ms at {large}: ratio {heads[large] / heads[small]:.2f}x "
          "(target <= 2x)")
    if baseline is not None:
        count, plain_times, our_times = baseline
        median = statistics.median(o / p for p, o in zip(plain_times, our_times))
        print(f"ratio pull of the {count}-memory cube / hf download of one file of its bytes: "
              f"{median:.2f}x median of {len(plain_times)} rounds, {min(our_times):.2f} s vs "
              f"{min(plain_times):.2f} s best (target <= 1.5x)")
    for count, (new_bytes, sent, uploaded) in increments.items():
        bound = new_bytes + 512 * KIB
        verdict = ("incremental" if sent <= 1.1 * bound else
                   "not yet incremental")
        print(f"incremental push at {count} memories + {args.add}: {sent:,} bytes uploaded "
              f"({len(uploaded)} files) for {new_bytes:,} new: ratio {sent / bound:.2f}x the "
              f"new bytes + 512 KiB (target <= 1.1x): {verdict}")


def large_cube(args, root: Path, url: str, name: str, count: int, mib: float,
               shard_size: int | None) -> None:
    """Verify and pull of ``count`` memories of ``mib`` MiB against their baselines."""
    import cubepack
    from huggingface_hub import snapshot_download

    from cubepack.hub import pull, push

    tokens = max(1, int(mib * MIB // _cubes.LARGE_BYTES_A_TOKEN))
    work = root / name
    work.mkdir()
    model_dir, _model, cache = _cubes.large_model(work, tokens)
    cube = work / "cube"
    _cubes.build_large(cube, model_dir, cache, count)
    del cache
    packed = timed(lambda: cubepack.pack(cube, progress=False, shards=True,
                                         shard_size=shard_size))
    total = _cubes.folder_bytes(cube)
    shards = len(list((cube / "shards").glob("*.kvshard")))
    for path in cube.rglob("*"):  # warm the page cache, as bench/verify.py does
        if path.is_file():
            _common.hashlib_file(path)
    cores = min(2, os.cpu_count() or 1)
    ratios, walls = [], []
    for _ in range(args.rounds):
        before, wall_before = sha256_limit(cores), sha256_limit(cores, elapsed=True)
        took = timed(lambda: cubepack.verify(cube, progress=False))
        limit = (before + sha256_limit(cores)) / 2
        wall = (wall_before + sha256_limit(cores, elapsed=True)) / 2
        ratios.append(total / took / limit)
        walls.append(total / took / wall)
    start = time.perf_counter()
    sha = push(cube, f"bench/{name}", endpoint=url, allow_local_paths=True).commit_sha
    pushed = time.perf_counter() - start

    def plain(round_: int) -> None:
        snapshot_download(f"bench/{name}", repo_type="dataset", revision=sha, endpoint=url,
                          local_dir=work / f"plain-{round_}",
                          cache_dir=work / f"plain-cache-{round_}")

    def ours(round_: int) -> None:
        pull(f"bench/{name}@{sha}", endpoint=url, cache_dir=work / f"pull-cache-{round_}",
             local_dir=work / f"pull-{round_}", progress=False)

    def cleanup(round_: int) -> None:
        for folder in ("plain-cache", "plain", "pull-cache", "pull"):
            shutil.rmtree(work / f"{folder}-{round_}", ignore_errors=True)

    plain_times, our_times = paired(plain, ours, args.rounds, cleanup)
    pull_ratio = statistics.median(o / p for p, o in zip(plain_times, our_times))
    bound = "default bound" if shard_size is None else f"shard bound {shard_size / MIB:.0f} MiB"
    print(f"{count} memories of {total / count / MIB:.0f} MiB ({total / 1e9:.2f} GB, {shards} "
          f"shard(s), {bound}): pack {packed:.1f} s, push {pushed:.1f} s; load average "
          f"{_cubes.load_average()}")
    print(f"  ratio verify / 2-core sha256 limit: {statistics.median(ratios):.2f}x median "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.9x); against "
          f"{cores} openssl processes' wall clock under the same load: "
          f"{statistics.median(walls):.2f}x (rounds {', '.join(f'{r:.2f}' for r in walls)})")
    print(f"  ratio pull --verify / hf download --local-dir: {pull_ratio:.2f}x median "
          f"(rounds {', '.join(f'{o:.2f} vs {p:.2f} s' for p, o in zip(plain_times, our_times))}"
          f"; target <= 1.15x)", flush=True)
    shutil.rmtree(work)


def large_axis(args, root: Path, url: str) -> None:
    count, mib = args.large_count, args.large_mib
    need = 4.2 * count * mib / 1024  # GiB: the cube, the endpoint's copy, two downloads
    free = _cubes.free_gib(root)
    if need > free * 0.8:
        count = max(1, int(free * 0.8 / (4.2 * mib / 1024)))
        print(f"large axis: {free:.0f} GiB free, {need:.0f} GiB needed for {args.large_count} "
              f"memories of {mib} MiB: scaled down to {count}")
    print(f"\nlarge memories ({free:.0f} GiB free on {root})")
    large_cube(args, root, url, "large", count, mib, None)
    over = args.over_mib
    large_cube(args, root, url, "over-bound", 1, over, int(over * MIB / 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--baseline-size", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--add", type=int, default=10)
    parser.add_argument("--large-count", type=int, default=16)
    parser.add_argument("--large-mib", type=float, default=256)
    parser.add_argument("--over-mib", type=float, default=512)
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--no-small", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.baseline_size, args.rounds, args.add = [10, 150], 150, 1, 3
        args.large_count, args.large_mib, args.over_mib = 2, 2, 4
    args.sizes = sorted(args.sizes)
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-scale-"))
    print(f"{os.cpu_count()} cores; load average {_cubes.load_average()}", flush=True)
    try:
        with _cubes.endpoint(root / "hub") as (url, port):
            if not args.no_small:
                small_axis(args, root, url, port)
            if not args.no_large:
                large_axis(args, root, url)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
