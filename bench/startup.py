"""Benchmark: ``cubepack --help`` against ``hf --help`` (huggingface_hub's CLI), same run.

The two commands take turns for ``--rounds`` rounds, each a fresh interpreter; prints each one's
best and median wall time and the ratios. Target: ``cubepack --help`` <= 0.5x ``hf --help``
(``--help`` imports no torch, transformers or huggingface_hub). Not a test.

Run: .venv/latest/bin/python bench/startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _command(name: str) -> list[str]:
    found = Path(sys.executable).with_name(name)
    if not found.exists():
        sys.exit(f"bench/startup.py needs {name} beside {sys.executable}: run it with "
                 ".venv/latest/bin/python")
    return [str(found), "--help"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="two rounds (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 2
    commands = {"cubepack --help": _command("cubepack"), "hf --help": _command("hf")}
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
    times: dict[str, list[float]] = {name: [] for name in commands}
    for name, command in commands.items():  # one untimed run each: warm page cache
        subprocess.run(command, capture_output=True, env=env, check=True)
    for _ in range(args.rounds):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, capture_output=True, env=env, check=True)
            times[name].append(time.perf_counter() - start)
    for name, seen in times.items():
        print(f"{name:<16} best {min(seen):.3f} s  median {statistics.median(seen):.3f} s")
    ours, theirs = times["cubepack --help"], times["hf --help"]
    print(f"ratio (cubepack / hf): best {min(ours) / min(theirs):.2f}x, median "
          f"{statistics.median(ours) / statistics.median(theirs):.2f}x (target <= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
