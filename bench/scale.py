"""Benchmark: pack, verify, push and pull at 100, 1,000 and 10,000 memories.

Each size is a cube of that many small activations (a 2-layer tiny Llama's 4-token KV cache,
~3 KB a file; built with ``save_kv_cache``, untimed), packed, verified, pushed to a local
endpoint in its own process (as ``cubepack hub serve`` runs) and pulled back with
verification into a fresh HF cache. For each step the time per memory is printed with its
ratio to linear: per-memory time at that size over per-memory time at the smallest size
(1.00x is linear; target <= 1.3x at the largest). Then the endpoint's answer time for one HEAD
``/resolve`` in the largest repo against the smallest (target <= 2x: a download must not cost
more in a bigger repo). Not a test (``--smoke`` runs 10 and 100 memories, as CI does).

Run: .venv/latest/bin/python bench/scale.py [--sizes 100 1000 10000] [--smoke]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: E402,F401 (declines in one line where cubepack or torch is missing)

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("CUBEPACK_NO_PROGRESS", "1")

STEPS = ("pack", "verify", "push", "pull --verify")
HEADS = 300


def build_cube(folder: Path, model_dir: Path, cache, ids, count: int) -> None:
    """A MemOS cube folder of ``count`` activations of ``model_dir``, not yet packed."""
    import cubepack

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_dir)}}
    config = {"model_schema": "memos.configs.mem_cube.GeneralMemCubeConfig",
              "config_filename": "config.json", "user_id": "bench", "cube_id": "bench/scale",
              "text_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
              "act_mem": {"backend": "kv_cache", "config": {
                  "cube_id": None, "memory_filename": "activation_memory.pickle",
                  "extractor_llm": llm}},
              "para_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
              "pref_mem": {"backend": "uninitialized", "config": {"cube_id": None}}}
    (folder / "activations").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    identity = cubepack.fingerprint(model_dir)
    for index in range(count):  # the item id in each header makes every file distinct
        cubepack.save_kv_cache(cache, folder / "activations" / f"item-{index}.kv.safetensors",
                               producer=identity, token_ids=ids, metadata={"id": f"item-{index}"})


def head_latency(port: int, repo: str, sha: str) -> float:
    """Median seconds for one HEAD /resolve of one file, over a keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    path = f"/datasets/{repo}/resolve/{sha}/activations/item-0.kv.safetensors"
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--smoke", action="store_true", help="10 and 100 memories (CI)")
    args = parser.parse_args()
    sizes = [10, 100] if args.smoke else sorted(args.sizes)

    import torch

    import cubepack
    from cubepack.hub import pull, push
    from cubepack.kv._torch import forward, output_cache
    from cubepack.testing import free_port, tiny

    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-scale-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cubepack.testing.hub", "--root",
                               str(root / "hub"), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        server.stdout.readline()  # "serving ..." once the socket is bound
        endpoint = f"http://127.0.0.1:{port}"
        model_dir = tiny.build_model(root / "model", tiny.llama_config(), seed=0,
                                     tokenizer=tiny.build_tokenizer())
        model = tiny.load(model_dir)
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            cache = output_cache(forward(model, ids))
        times: dict[int, dict[str, float]] = {}
        heads: dict[int, float] = {}
        for count in sizes:
            cube = root / f"cube-{count}"
            build_cube(cube, model_dir, cache, ids, count)
            repo = f"bench/scale-{count}"
            step: dict[str, float] = {}
            start = time.perf_counter()
            cubepack.pack(cube, progress=False)
            step["pack"] = time.perf_counter() - start
            start = time.perf_counter()
            cubepack.verify(cube, progress=False)
            step["verify"] = time.perf_counter() - start
            start = time.perf_counter()
            sha = push(cube, repo, endpoint=endpoint, allow_local_paths=True).commit_sha
            step["push"] = time.perf_counter() - start
            start = time.perf_counter()
            pull(f"{repo}@{sha}", endpoint=endpoint, cache_dir=root / f"hf-{count}",
                 local_dir=root / f"pulled-{count}", progress=False)
            step["pull --verify"] = time.perf_counter() - start
            times[count] = step
            heads[count] = head_latency(port, repo, sha)
            print(f"{count:>6} memories: " + ", ".join(f"{name} {seconds:.2f} s"
                                                       for name, seconds in step.items())
                  + f", HEAD {heads[count] * 1e3:.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)

    small, large = sizes[0], sizes[-1]
    print(f"\n{'step':<14}" + "".join(f"{count:>10} ms/item" for count in sizes)
          + "   ratio to linear (per item, vs the smallest)")
    worst = 0.0
    for name in STEPS:
        per_item = [times[count][name] / count for count in sizes]
        ratios = [value / per_item[0] for value in per_item]
        worst = max(worst, ratios[-1])
        print(f"{name:<14}" + "".join(f"{value * 1e3:>18.2f}" for value in per_item)
              + "   " + "  ".join(f"{ratio:.2f}x" for ratio in ratios))
    if len(sizes) > 2:  # the smallest size carries fixed costs: the top decade alone
        before = sizes[-2]
        print(f"from {before} to {large} memories: " + ", ".join(
            f"{name} {times[large][name] / large / (times[before][name] / before):.2f}x"
            for name in STEPS))
    print(f"HEAD /resolve: {heads[small] * 1e3:.2f} ms at {small} files, "
          f"{heads[large] * 1e3:.2f} ms at {large}: ratio {heads[large] / heads[small]:.2f}x "
          "(target <= 2x)")
    print(f"ratio to linear, worst step at {large} memories: {worst:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
