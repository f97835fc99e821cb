"""The core-dump tests scan a process's own memory (``tests/support/coredump.py``: the
kernel's ``coredump_filter``, less MADV_DONTDUMP) instead of dumping a core, so they run where
ptrace is blocked. Here, where it is not, a real core (gdb's ``gcore``, which honours the same
filter and advice) is held to the scan: a marker in the heap is in both, a marker in
cubepack's private anonymous memory in neither."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coredump import shift

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not shutil.which("gcore"),
                                reason="needs Linux and gdb's gcore")
MARKER = "QZXJ-GCORE-SCAN-MARK-5t"

#: Builds the marker in place (from its shifted form: no other copy of it exists) either in
#: a heap bytearray or in anonymous_memory, reports its own scan, then waits for the core.
CHILD = r"""
import sys
import coredump
from cubepack._util.ramdir import anonymous_memory
shifted, where = sys.argv[1].encode("latin-1"), sys.argv[2]
held = bytearray(len(shifted)) if where == "heap" else anonymous_memory(1 << 20)
for index, byte in enumerate(shifted):
    held[index] = (byte - 1) % 256
print(coredump.holds(sys.argv[1]), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("where", ["heap", "anonymous_memory"])
def test_gcore_holds_the_marker_exactly_where_the_scan_finds_it(where, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), str(root / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, shift(MARKER), where], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        scanned = child.stdout.readline().strip() == "True"
        done = subprocess.run(["gcore", "-o", str(tmp_path / "core"), str(child.pid)],
                              capture_output=True, text=True, timeout=120)
        core = tmp_path / f"core.{child.pid}"
        if done.returncode != 0 or not core.exists():
            pytest.skip(f"gcore could not attach (ptrace blocked?): {done.stderr[-200:]}")
        in_core = MARKER.encode() in core.read_bytes()
    finally:
        child.kill()
        child.wait()
    assert scanned == in_core == (where == "heap")
