"""What the deadline and low-speed tests of a pull or push share (tests/hub/test_deadlines.py,
tests/hub/test_stall.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from cubepack.hub import _deadline, push

KEPT = {"kept.txt": b"the folder as it was"}
#: The deadline of the tests that let it pass by itself: they assert nothing about the step it
#: falls in (a loaded machine may not have reached the held request by then).
SHORT = 4
#: A safety net so a broken deadline fails a test instead of hanging it (never asserted on).
HANG = 120


def published(hub, cube, repo="ns/slow"):
    return push(cube, repo, endpoint=hub.url, allow_local_paths=True).commit_sha


def nothing_left_running():
    """Every thread cubepack started for the operation ends (joined, not polled): the worker
    the caller stopped waiting for, and the pull's download threads."""
    for thread in threading.enumerate():
        if thread.name.startswith(("cubepack-call", "cubepack-pull")):
            thread.join(HANG)
            assert not thread.is_alive(), thread.name
    assert _deadline._ACTIVE == [] and _deadline._UNINSTALL == []


def cubepack_cli(hub, tmp_path, *args, env=None):
    done = subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)],
                          env=dict(os.environ, HF_ENDPOINT=hub.url,
                                   HF_HUB_CACHE=str(tmp_path / "cli-cache"), **(env or {})),
                          capture_output=True, text=True, timeout=HANG, cwd=tmp_path, check=False)
    return done.returncode, done.stdout, done.stderr
