"""bench/runtimes.py runs end to end at its ``--smoke`` size in the mlx environment, under the
same rules as every other benchmark (tests/e2e/test_bench_smoke.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SMOKE = Path(__file__).resolve().parents[1] / "e2e" / "test_bench_smoke.py"
_spec = importlib.util.spec_from_file_location("bench_smoke", _SMOKE)
bench_smoke = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_smoke)


def test_the_runtimes_benchmark_runs_at_smoke_size(tmp_path):
    assert "runtimes.py" in bench_smoke.OTHER_RUNTIMES
    outcomes = bench_smoke.run_smoke(["runtimes.py"], tmp_path)
    assert outcomes["runtimes.py"][0], outcomes["runtimes.py"][1]
