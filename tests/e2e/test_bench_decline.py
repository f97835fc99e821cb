"""A benchmark run outside its environment declines in one line naming the environment and how
to run it there (exit 2), never a traceback (``No module named 'mlx'``, ``KeyError:
'CUBEPACK_LLAMACPP_CONVERT'``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script, module, environment", [
    ("runtimes.py", "mlx", "mlx"), ("llamacpp.py", "llama_cpp", "llama.cpp")])
def test_a_benchmark_outside_its_environment_declines_in_one_line(tmp_path, script, module,
                                                                  environment):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here: this is the benchmark's own environment")
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_LLAMACPP_CONVERT"}
    done = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith(f"bench/{script} needs the {environment} environment (the {module} "
                           "package"), line
    assert "Traceback" not in done.stderr and ": run " in line
