"""Every benchmark runs end to end at its ``--smoke`` size, so none can rot unnoticed.

No ratio is asserted (speed is measured by ``make bench``, not by tests): a benchmark passes
here when it runs to completion, prints a ratio, draws no progress bar and writes nothing to
stderr (no library warning or log line; the environment as a user's shell has it: no switch
that hides them). They run one after another in one process (``RUNNER``), each started as a
fresh process would start it.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

from envs import once

BENCH = Path(__file__).resolve().parents[2] / "bench"


# Once is enough to keep a benchmark from rotting: the latest environment runs them.
pytestmark = once


#: Benchmarks of another runtime, smoke-run by that runtime's suite (tests/mlx, tests/llamacpp).
OTHER_RUNTIMES = {"runtimes.py", "llamacpp.py"}


#: Runs each benchmark named on its command line at ``--smoke`` size, one after the other in this
#: one process (a new process per benchmark was most of their smoke time: torch and
#: transformers imported each time), each as a fresh process would start it: the environment,
#: working folder, ``sys.path``, torch's thread count and the warning filters it started with,
#: and the quieting ``bench/_common.py`` applies at its import undone (so a benchmark that does
#: not quiet its libraries is caught, whatever ran before it). Its output lies between marker
#: lines carrying a token of this run (``argv[1]``) on both streams; a benchmark that raises or
#: exits non-zero is reported and the next one runs.
RUNNER = """
import os, runpy, sys, traceback, warnings
token, bench = sys.argv[1], sys.argv[2]
for script in sys.argv[3:]:
    print(f"=== {token} {script}", flush=True)
    print(f"=== {token} {script}", file=sys.stderr, flush=True)
    saved = (dict(os.environ), list(sys.path), list(sys.argv), os.getcwd())
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    sys.argv[:] = [os.path.join(bench, script), "--smoke"]
    sys.path.insert(0, bench)
    status = 0
    with warnings.catch_warnings():
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        common = sys.modules.pop("_common", None)
        if common is not None:
            common._QUIET.__exit__(None, None, None)
    sys.stdout.flush(); sys.stderr.flush()
    print(f"=== {token} {script} exit {status}", flush=True)
    os.chdir(saved[3])
    os.environ.clear(); os.environ.update(saved[0]); sys.path[:] = saved[1]; sys.argv[:] = saved[2]
    if threads is not None:
        sys.modules["torch"].set_num_threads(threads)
"""

SCRIPTS = sorted(p.name for p in BENCH.glob("*.py")
                 if not p.name.startswith("_") and p.name not in OTHER_RUNTIMES)
#: A benchmark's report: at least one ratio, a number with its "x".
RATIO = re.compile(r"\bratio\b[^\n]{0,60}?\d+(\.\d+)?x")


def test_every_benchmark_runs_at_smoke_size(tmp_path):
    outcomes = run_smoke(SCRIPTS, tmp_path)
    assert sorted(outcomes) == SCRIPTS
    failed = {name: text for name, (ok, text) in outcomes.items() if not ok}
    assert failed == {}, failed


def run_smoke(scripts: list[str], tmp_path: Path) -> dict[str, tuple[bool, str]]:
    """Each script's (passed, its output): it ran to completion, printed a ratio, drew no
    progress bar (a ``\\r``: the output is read as bytes, so none is turned into a newline) and
    wrote nothing to stderr (no library warning or log line; the environment as a user's shell
    has it: no switch that hides them)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUBEPACK_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hf"), CUBEPACK_CACHE=str(tmp_path / "cp"))
    token = secrets.token_hex(8)
    done = subprocess.run([sys.executable, "-c", RUNNER, token, str(BENCH), *scripts], env=env,
                          capture_output=True, timeout=1200, check=False)
    stdout = done.stdout.decode("utf-8", "replace")
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, stdout[-2000:] + stderr[-3000:]
    out, err = _sections(stdout, token), _sections(stderr, token)
    outcomes = {}
    for script in scripts:
        printed, logged = out.get(script, ""), err.get(script, "")
        ok = (f"=== {token} {script} exit 0\n" in printed and RATIO.search(printed) is not None
              and "\r" not in printed and logged == "")
        outcomes[script] = (ok, printed[-2000:] + logged[-3000:])
    return outcomes


def _sections(text: str, token: str) -> dict[str, str]:
    """The runner's output split at its ``=== TOKEN SCRIPT`` marker lines."""
    sections: dict[str, str] = {}
    current = None
    prefix = f"=== {token} "
    for line in text.splitlines(keepends=True):
        name = line.rstrip("\n")[len(prefix):] if line.startswith(prefix) else None
        if name is not None and " " not in name:
            current = name
            sections[current] = ""
        elif current is not None:
            sections[current] += line
    return sections
