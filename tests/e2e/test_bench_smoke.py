"""Every benchmark runs end to end at its ``--smoke`` size, so none can rot unnoticed.

No ratio is asserted (speed is measured by ``make bench``, not by tests): a benchmark passes
here when it runs to completion and prints its ratio line, and no progress bar or library
warning (the environment as a user's shell has it: no switch that hides them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs import once

BENCH = Path(__file__).resolve().parents[2] / "bench"


# Once is enough to keep a benchmark from rotting: the latest environment runs them.
pytestmark = once


#: Benchmarks of another runtime, smoke-run by that runtime's suite (tests/mlx, tests/llamacpp).
OTHER_RUNTIMES = {"runtimes.py", "llamacpp.py"}


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")
                                           if not p.name.startswith("_")
                                           and p.name not in OTHER_RUNTIMES))
def test_benchmark_runs_at_smoke_size(script, tmp_path):
    run_smoke(script, tmp_path)


def run_smoke(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUBEPACK_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hf"), CUBEPACK_CACHE=str(tmp_path / "cp"))
    done = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ratio" in done.stdout
    output = done.stdout + done.stderr
    assert "\r" not in output and "Loading weights" not in output, output[-3000:]
    assert not [line for line in done.stderr.splitlines() if "warn" in line.lower()], done.stderr
