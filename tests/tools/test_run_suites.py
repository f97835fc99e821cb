"""tools/run_suites.py, the runner behind ``make test``: its command line, how it reads
pytest's closing lines and adds them up, the environment each run gets, and (with stand-in
interpreters that print a closing line) its logs, summary and exit status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envs import once
from helpers import load_tool

pytestmark = once

run_suites = load_tool("run_suites")

#: The plain closing line CI reads: 'N passed, N failed' alone (', N skipped' may follow, one
#: word with a colon may stand before it).
CI_LINE = re.compile(r"^(\w+: )?\d+ passed, \d+ failed(, \d+ skipped)?$")


def test_the_command_line_splits_at_the_double_dash():
    plan = run_suites.parse_args(["--jobs", "1", "--logs", "out", "latest=.venv/latest/bin/python",
                                  "memos=/m/python", "--", "-q", "tests/kv", "--", "x"])
    assert plan.jobs == 1 and plan.logs == Path("out")
    assert plan.suites == {"latest": ".venv/latest/bin/python", "memos": "/m/python"}
    assert plan.pytest_args == ["-q", "tests/kv", "--", "x"]


def test_defaults_and_no_pytest_arguments():
    plan = run_suites.parse_args(["only=python3"])
    assert (plan.jobs, plan.logs, plan.suites, plan.pytest_args) == \
        (2, Path("."), {"only": "python3"}, [])


@pytest.mark.parametrize("argv", [["latest"], ["=python"], ["latest="], ["a=x", "a=y"],
                                  ["--jobs", "0", "a=x"], ["--", "-q"], ["a b=x"]])
def test_bad_command_lines_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_suites.parse_args(argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("line, counts", [
    ("1203 passed, 31 skipped, 2 warnings in 412.33s (0:06:52)", (1203, 0, 0, 31)),
    ("==== 2 failed, 10 passed, 1 error in 3.10s ====", (10, 2, 1, 0)),
    ("3 errors in 0.50s", (0, 0, 3, 0)),
    ("5 passed, 7 deselected in 1.00s", (5, 0, 0, 0)),
    ("no tests ran in 0.01s", (0, 0, 0, 0)),
])
def test_pytest_closing_lines_are_counted(line, counts):
    text = f"..F.s\n{'=' * 20} short test summary info\nFAILED tests/x.py::y\n{line}\n"
    assert tuple(run_suites.summary(text)[key] for key in run_suites.COUNTS) == counts


def test_the_last_closing_line_counts_and_a_crash_has_none():
    text = "test said '1 passed in 2.0s' inside\n...\n4 passed, 1 skipped in 9.00s\n"
    assert run_suites.summary(text) == {"passed": 4, "failed": 0, "errors": 0, "skipped": 1}
    assert run_suites.summary("Fatal Python error: Segmentation fault\n") is None
    assert run_suites.summary("") is None


def test_the_closing_line_is_the_plain_one_ci_reads():
    line = run_suites.closing_line({"passed": 12, "failed": 1, "errors": 2, "skipped": 3})
    assert line == "12 passed, 3 failed, 3 skipped"  # errors are failures
    assert CI_LINE.match(line)


def test_each_of_two_runs_gets_the_other_interpreter():
    pythons = {"latest": "/l/python", "memos": "/m/python"}
    base = {"PATH": "/bin"}
    assert run_suites.environment_for("latest", pythons, base) == \
        {"PATH": "/bin", "CUBEPACK_OTHER_PYTHON": "/m/python"}
    assert run_suites.environment_for("memos", pythons, base)["CUBEPACK_OTHER_PYTHON"] == \
        "/l/python"
    assert base == {"PATH": "/bin"}
    assert "CUBEPACK_OTHER_PYTHON" not in run_suites.environment_for(
        "a", {"a": "/a"}, base)
    assert "CUBEPACK_OTHER_PYTHON" not in run_suites.environment_for(
        "a", {"a": "/a", "b": "/b", "c": "/c"}, base)


def _interpreter(folder: Path, name: str, body: str) -> Path:
    """A stand-in for an environment's python: a script run as ``PYTHON -m pytest ARGS``."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_runs_print_whole_logs_a_summary_and_fail_if_any_failed(tmp_path, capsys):
    good = _interpreter(tmp_path, "good", 'echo "other=$CUBEPACK_OTHER_PYTHON args=$*"\n'
                        'echo "to stderr" >&2\necho "3 passed, 1 skipped in 0.10s"\n')
    bad = _interpreter(tmp_path, "bad", 'echo "F."\necho "1 failed, 1 passed in 0.10s"\n'
                       "exit 1\n")
    logs = tmp_path / "logs"
    status = run_suites.main(["--logs", str(logs), f"good={good}", f"bad={bad}", "--", "-q"])
    out = capsys.readouterr().out
    assert status == 1
    assert f"other={bad} args=-m pytest -q\nto stderr\n3 passed, 1 skipped in 0.10s\n" in out
    assert "== bad: FAILED (exit 1)" in out and "== good: passed" in out
    assert "; failed: bad" in out
    assert out.splitlines()[-1] == "4 passed, 1 failed, 1 skipped"
    assert (logs / "good-tests.log").read_text().startswith(f"other={bad}")


def test_all_passing_runs_exit_0_one_after_another(tmp_path, capsys):
    first = _interpreter(tmp_path, "first", 'echo "2 passed in 0.01s"\n')
    second = _interpreter(tmp_path, "second", 'echo "5 passed in 0.01s"\n')
    status = run_suites.main(["--jobs", "1", "--logs", str(tmp_path), f"a={first}",
                              f"b={second}"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.index("== a: passed") < out.index("== b: started")
    assert out.splitlines()[-1] == "7 passed, 0 failed, 0 skipped"


def test_a_run_without_a_summary_or_an_interpreter_fails(tmp_path, capsys):
    crash = _interpreter(tmp_path, "crash", 'echo "Segmentation fault"\nexit 139\n')
    status = run_suites.main(["--logs", str(tmp_path), f"crash={crash}",
                              f"gone={tmp_path / 'missing'}"])
    out = capsys.readouterr().out
    assert status == 1
    assert "crash: FAILED (exit 139)" in out and "no pytest summary" in out
    assert "gone: FAILED to start" in out and "gone: did not start" in out
    assert out.splitlines()[-1] == "0 passed, 0 failed, 0 skipped"


def test_suites_run_at_once_share_the_cores_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(run_suites.os, "cpu_count", lambda: 4)
    pythons = {"latest": "/l/python", "memos": "/m/python"}
    assert run_suites.environment_for("latest", pythons, {}, 2)["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in run_suites.environment_for("latest", pythons, {}, 1)
    assert run_suites.environment_for("latest", pythons, {"OMP_NUM_THREADS": "3"}, 2)[
        "OMP_NUM_THREADS"] == "3"
    monkeypatch.setattr(run_suites.os, "cpu_count", lambda: 1)
    assert run_suites.environment_for("latest", pythons, {}, 2)["OMP_NUM_THREADS"] == "1"


def test_only_restricts_one_suite_and_the_two_whole_suites_pair_up(tmp_path, capsys):
    plan = run_suites.parse_args(["--only", "mlx=tests/mlx", "a=/a", "b=/b", "mlx=/x", "--",
                                  "-q"])
    assert plan.only == {"mlx": ["tests/mlx"]} and plan.pytest_args == ["-q"]
    pythons = {"a": "/a", "b": "/b", "mlx": "/x"}
    assert run_suites.environment_for("a", pythons, {}, partial={"mlx"})[
        "CUBEPACK_OTHER_PYTHON"] == "/b"
    assert "CUBEPACK_OTHER_PYTHON" not in run_suites.environment_for("mlx", pythons, {},
                                                                     partial={"mlx"})
    with pytest.raises(SystemExit):
        run_suites.parse_args(["--only", "nope=tests/mlx", "a=/a"])
    echo = _interpreter(tmp_path, "echo", 'echo "args=$*"\necho "1 passed in 0.10s"\n')
    status = run_suites.main(["--logs", str(tmp_path / "logs"), "--only", "x=tests/mlx",
                              f"x={echo}", f"y={echo}", "--", "-q"])
    out = capsys.readouterr().out
    assert status == 0
    assert "args=-m pytest -q tests/mlx\n" in out and "args=-m pytest -q\n" in out
