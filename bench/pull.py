"""Benchmark: ``cubepack pull --verify`` against ``hf download --local-dir`` of the same commit.

A ~500 MB cube is pushed to a local endpoint (``cubepack.testing.hub`` in its own process, on
127.0.0.1); each contender then downloads that commit into a fresh folder (and a fresh HF
cache), in the same run, taking turns (which goes first alternates) for ``--rounds`` rounds.
The baseline is what ``hf download REPO --local-dir DIR`` runs (``snapshot_download(
local_dir=...)``: files of their own in the folder, no HF cache); the pull does the same
(huggingface_hub's local-dir mode into its staging folder, issue #40 item 5), hashes each file
as it arrives, verifies the commit against its lock, then places it. Prints the ratio of the
best times and the median of the rounds' ratios (target <= 1.15x), and the bytes each wrote
(this process's ``write_bytes`` in ``/proc/self/io``; target <= 1.02x the cube's size). Not a
test (``--smoke`` runs a tiny size in seconds, as CI does, so the script cannot rot).

Run: .venv/latest/bin/python bench/pull.py [--mb 500] [--files 6] [--rounds 6] [--link-mb 250]
[--smoke]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - a report without progress bars or library warnings

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def write_bytes() -> int:
    """Bytes this process has caused to be written to a block device (0 where the kernel does
    not count them: a tmpfs, or no /proc)."""
    try:
        with open("/proc/self/io") as handle:
            fields = dict(line.split(": ") for line in handle.read().splitlines())
    except OSError:
        return 0
    return int(fields.get("write_bytes", 0))


def cpu_seconds() -> float:
    """CPU time of this process (every thread): less at the mercy of other tenants than wall."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--link-mb", type=float, default=None,
                        help="cap the endpoint's bandwidth (MB/s) to model a real network link")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.files, args.rounds = 2, 2, 1

    from huggingface_hub import snapshot_download

    import cubepack
    from cubepack.hub import pull, push
    from cubepack.testing.blobs import write_safetensors_blob

    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-pull-"))
    try:
        cube = root / "cube"
        block = os.urandom(8 * 1024 * 1024)
        per_file = args.mb * 1024 * 1024 // args.files
        for index in range(args.files):  # distinct first bytes: no two files share a blob
            write_safetensors_blob(cube / "data" / f"part-{index}.safetensors", per_file,
                                   seed=index, block=block)
        (cube / "config.json").write_text('{"cube_id": "bench/cube"}')
        cubepack.pack(cube, progress=False)
        # The endpoint runs in its own process, as `cubepack hub serve` would: sharing this
        # process's interpreter would make the server and the client contend for one GIL.
        from cubepack.testing import free_port

        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "cubepack.testing.hub", "--root",
                                   str(root / "hub"), "--port", str(port)]
                                  + (["--max-rate-mb", str(args.link_mb)] if args.link_mb else []),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            server.stdout.readline()  # "serving ..." once the socket is bound
            hub_url = f"http://127.0.0.1:{port}"
            sha = push(cube, "bench/cube", endpoint=hub_url).commit_sha
            plain, verified = [], []
            cpu = {"plain": 0.0, "pull": 0.0}
            written = {"plain": 0, "pull": 0}

            def run_plain(round_: int) -> None:
                start, used, wrote = time.perf_counter(), cpu_seconds(), write_bytes()
                snapshot_download("bench/cube", repo_type="dataset", revision=sha,
                                  endpoint=hub_url, local_dir=root / f"plain-{round_}",
                                  cache_dir=root / f"plain-cache-{round_}")
                plain.append(time.perf_counter() - start)
                cpu["plain"] += cpu_seconds() - used
                written["plain"] += write_bytes() - wrote

            def run_pull(round_: int) -> None:
                start, used, wrote = time.perf_counter(), cpu_seconds(), write_bytes()
                pull(f"bench/cube@{sha}", endpoint=hub_url, cache_dir=root / f"pull-{round_}",
                     local_dir=root / f"out-{round_}", progress=False)
                verified.append(time.perf_counter() - start)
                cpu["pull"] += cpu_seconds() - used
                written["pull"] += write_bytes() - wrote

            for round_ in range(args.rounds):  # take turns, fresh caches every time
                for run in ((run_plain, run_pull) if round_ % 2 == 0 else (run_pull, run_plain)):
                    run(round_)
                    # Each starts with no dirty pages: the other's writeback would slow it.
                    for folder in ("plain", "plain-cache", "pull", "out"):
                        shutil.rmtree(root / f"{folder}-{round_}", ignore_errors=True)
                    os.sync()
        finally:
            server.terminate()
            server.wait()
        size = sum(p.stat().st_size for p in cube.rglob("*") if p.is_file())
        link = f"{args.link_mb:.0f} MB/s link" if args.link_mb else "unthrottled loopback"
        print(f"cube: {size / 1e6:.0f} MB in {args.files + 4} files, local endpoint on 127.0.0.1, {link}")
        print(f"hf download --local-dir (no verification) best {min(plain):6.2f} s")
        print(f"cubepack pull --verify (resolve, verify)  best {min(verified):6.2f} s")
        print("each round (s):", ", ".join(f"{p:.2f} vs {v:.2f}" for p, v in zip(plain, verified)))
        print(f"client CPU per round: hf download --local-dir {cpu['plain'] / args.rounds:.2f} s, "
              f"cubepack pull {cpu['pull'] / args.rounds:.2f} s "
              f"({cpu['pull'] / cpu['plain']:.2f}x)")
        for who, label in (("plain", "hf download --local-dir"), ("pull", "cubepack pull")):
            print(f"bytes written per round, {label}: {written[who] / args.rounds / 1e6:.1f} MB "
                  f"({written[who] / args.rounds / size:.3f}x the cube; target <= 1.02x)")
        rounds = statistics.median(v / p for v, p in zip(verified, plain))
        print(f"ratio cubepack pull / hf download --local-dir: {min(verified) / min(plain):.2f}x "
              f"best to best, {rounds:.2f}x median of {args.rounds} rounds (target <= 1.15x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
