"""Every benchmark runs end to end at its ``--smoke`` size, so none can rot unnoticed.

No ratio is asserted (speed is measured by ``make bench``, not by tests): a benchmark passes
here when it runs to completion and prints its ratio line, and no progress bar or library
warning (the environment as a user's shell has it: no switch that hides them). They run one
after another in one process (``RUNNER``), each with the environment it started with.
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


#: Runs each benchmark named on its command line at ``--smoke`` size, one after the other in this
#: one process (a new process per benchmark was most of their smoke time: torch and
#: transformers imported each time), each with the environment, ``sys.path`` and torch's thread
#: count it started with, between marker lines on both streams; a benchmark that raises or
#: exits non-zero is reported and the next one runs.
RUNNER = """
import os, runpy, sys, traceback
bench = sys.argv[1]
for script in sys.argv[2:]:
    print(f"=== {script}", flush=True)
    print(f"=== {script}", file=sys.stderr, flush=True)
    saved = (dict(os.environ), list(sys.path), list(sys.argv))
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    sys.argv[:] = [os.path.join(bench, script), "--smoke"]
    sys.path.insert(0, bench)
    status = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(); sys.stderr.flush()
    print(f"=== {script} exit {status}", flush=True)
    os.environ.clear(); os.environ.update(saved[0]); sys.path[:] = saved[1]; sys.argv[:] = saved[2]
    if threads is not None:
        sys.modules["torch"].set_num_threads(threads)
"""

SCRIPTS = sorted(p.name for p in BENCH.glob("*.py")
                 if not p.name.startswith("_") and p.name not in OTHER_RUNTIMES)


def test_every_benchmark_runs_at_smoke_size(tmp_path):
    outcomes = run_smoke(SCRIPTS, tmp_path)
    assert sorted(outcomes) == SCRIPTS
    failed = {name: text for name, (ok, text) in outcomes.items() if not ok}
    assert failed == {}, failed


def run_smoke(scripts: list[str], tmp_path: Path) -> dict[str, tuple[bool, str]]:
    """Each script's (passed, its output): it ran to completion, printed its ratio line, and no
    progress bar or library warning (the environment as a user's shell has it: no switch that
    hides them)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUBEPACK_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hf"), CUBEPACK_CACHE=str(tmp_path / "cp"))
    done = subprocess.run([sys.executable, "-c", RUNNER, str(BENCH), *scripts], env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out, err = _sections(done.stdout), _sections(done.stderr)
    outcomes = {}
    for script in scripts:
        stdout, stderr = out.get(script, ""), err.get(script, "")
        output = stdout + stderr
        ok = (f"=== {script} exit 0" in stdout and "ratio" in stdout and "\r" not in output
              and "Loading weights" not in output
              and not [line for line in stderr.splitlines() if "warn" in line.lower()])
        outcomes[script] = (ok, stdout[-2000:] + stderr[-3000:])
    return outcomes


def _sections(text: str) -> dict[str, str]:
    """The runner's output split at its ``=== SCRIPT`` marker lines."""
    sections: dict[str, str] = {}
    current = None
    markers = {f"=== {name}" for name in (*SCRIPTS, *OTHER_RUNTIMES)}
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") in markers:
            current = line.rstrip("\n")[4:]
            sections[current] = ""
        elif current is not None:
            sections[current] += line
    return sections
