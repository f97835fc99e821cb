"""Run the test suite in several environments at once (``make test``), readably.

``run_suites.py [--jobs N] [--logs DIR] [--only NAME=PATH]... NAME=PYTHON ... [-- PYTEST_ARGS]``

Each environment's pytest runs in its own process with its output written to
``DIR/NAME-tests.log`` (nothing interleaves); each log is printed whole, under a header, as its
run ends, then a line per environment and one closing line add them up
(``N passed, N failed, N skipped``; errors count as failed). The exit status is 0 only if
every run exited 0. ``--only NAME=PATH`` runs only the tests under PATH in that environment (the
mlx one runs ``tests/mlx``). When two environments run the whole suite, each gets the other's
interpreter as ``CUBEPACK_OTHER_PYTHON`` (the cross-version tests). Suites start in the order
given, ``--jobs`` at a time (``--jobs 1``: one after another). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COUNTS = ("passed", "failed", "errors", "skipped")


@dataclass
class Plan:
    jobs: int
    logs: Path
    suites: dict[str, str]  # name -> interpreter, in the order given
    pytest_args: list[str] = field(default_factory=list)
    only: dict[str, list[str]] = field(default_factory=dict)  # name -> test paths it runs


def parse_args(argv: list[str]) -> Plan:
    """The command line: options and ``NAME=PYTHON`` specs before ``--``, pytest's after."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="run_suites.py", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="suites run at once (default 2)")
    parser.add_argument("--logs", type=Path, default=Path("."), help="folder for NAME-tests.log")
    parser.add_argument("--only", action="append", default=[], metavar="NAME=PATH",
                        help="run only the tests under PATH in environment NAME (repeatable)")
    parser.add_argument("suites", nargs="+", metavar="NAME=PYTHON")
    args = parser.parse_args(argv[:split])
    suites: dict[str, str] = {}
    for spec in args.suites:
        name, sep, python = spec.partition("=")
        if not (sep and name and python) or not re.fullmatch(r"[\w.-]+", name):
            parser.error(f"not NAME=PYTHON: {spec!r}")
        if name in suites:
            parser.error(f"environment named twice: {name}")
        suites[name] = python
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    only: dict[str, list[str]] = {}
    for spec in args.only:
        name, sep, path = spec.partition("=")
        if not (sep and path) or name not in suites:
            parser.error(f"--only must name a given environment and a path: {spec!r}")
        only.setdefault(name, []).append(path)
    return Plan(args.jobs, args.logs, suites, argv[split + 1:], only)


#: pytest's closing line: counts, then "in 2.01s" (``-q`` drops the ``=`` border).
CLOSING = re.compile(r"\b(\d+ (passed|failed|errors?|skipped)|no tests ran)\b.* in [\d.]+s\b")


def summary(text: str) -> dict[str, int] | None:
    """The counts on pytest's closing line (``== 3 passed, 1 skipped in 2.0s ==``), the last
    line of that form; None when there is none (a run that crashed or was killed)."""
    lines = [line for line in text.splitlines() if CLOSING.search(line)]
    if not lines:
        return None
    found = dict.fromkeys(COUNTS, 0)
    for number, word in re.findall(r"(\d+) (\w+)", lines[-1]):
        word = "errors" if word == "error" else word
        if word in found:
            found[word] = int(number)
    return found


def closing_line(totals: dict[str, int]) -> str:
    """The plain line CI reads: ``N passed, N failed, N skipped`` (errors counted as failed)."""
    return (f"{totals['passed']} passed, {totals['failed'] + totals['errors']} failed, "
            f"{totals['skipped']} skipped")


def environment_for(name: str, pythons: dict[str, str], base: dict[str, str],
                    jobs: int = 1, partial: frozenset[str] | set[str] = frozenset()
                    ) -> dict[str, str]:
    """A run's environment: ``base`` plus, when exactly two suites run the whole suite (not
    ``partial``: restricted by ``--only``), the other's interpreter as
    ``CUBEPACK_OTHER_PYTHON``; with several suites at once, each one's share of the cores as
    ``OMP_NUM_THREADS`` (unless set): torch otherwise starts a thread per core in every suite,
    and the suites' threads fight over the same cores."""
    env = dict(base)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // min(jobs, len(pythons))))
    whole = {other: python for other, python in pythons.items() if other not in partial}
    others = [python for other, python in whole.items() if other != name]
    if len(whole) == 2 and name in whole:
        env["CUBEPACK_OTHER_PYTHON"] = others[0]
    return env


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(sys.argv[1:] if argv is None else argv)
    pythons = {name: os.path.abspath(python) for name, python in plan.suites.items()}
    plan.logs.mkdir(parents=True, exist_ok=True)
    waiting = list(pythons)
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    results: dict[str, str] = {}
    totals = dict.fromkeys(COUNTS, 0)
    failed: list[str] = []
    start = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < plan.jobs:
                name = waiting.pop(0)
                log = plan.logs / f"{name}-tests.log"
                command = [pythons[name], "-m", "pytest", *plan.pytest_args,
                           *plan.only.get(name, [])]
                try:
                    with open(log, "wb") as out:
                        process = subprocess.Popen(
                            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=environment_for(name, pythons, dict(os.environ), plan.jobs,
                                                set(plan.only)))
                except OSError as error:
                    print(f"\n== {name}: FAILED to start {pythons[name]}: {error}", flush=True)
                    failed.append(name)
                    results[name] = "did not start"
                    continue
                running[name] = (process, log, time.monotonic())
                print(f"== {name}: started ({plan.suites[name]} -m pytest; log {log})",
                      flush=True)
            time.sleep(0.2)
            for name, (process, log, began) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                text = log.read_text(errors="replace")
                took = time.monotonic() - began
                status = "passed" if process.returncode == 0 else \
                    f"FAILED (exit {process.returncode})"
                print(f"\n== {name}: {status} in {took:.0f} s, its log ({log}):", flush=True)
                sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
                counts = summary(text)
                for count, value in (counts or {}).items():
                    totals[count] += value
                results[name] = f"{status} in {took:.0f} s: " + (
                    closing_line(counts) if counts else "no pytest summary")
                if process.returncode:
                    failed.append(name)
                sys.stdout.flush()
    finally:  # interrupted: stop what still runs
        for process, _, _ in running.values():
            process.terminate()
        for process, _, _ in running.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    print(f"\n== {len(pythons)} environment(s) in {time.monotonic() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    for name in pythons:
        print(f"   {name}: {results.get(name, 'not run')}")
    print(closing_line(totals), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
