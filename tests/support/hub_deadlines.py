"""What the deadline and low-speed tests of a pull or push share (tests/hub/test_deadlines.py,
tests/hub/test_stall.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit

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


def slow_link_buffers(monkeypatch, hub, size=8192):
    """This process's connections to ``hub`` get a send buffer of ``size`` bytes, as they would
    over a slow link: Linux sizes a connection's send buffer by its congestion window, megabytes
    on loopback and a few KB on a slow link. An upload's bytes count as the client hands them
    to its socket, so on loopback megabytes would count at once, however slowly the endpoint
    reads them (a link fault's connections also get a small receive buffer, endpoint side)."""
    port, connect = urlsplit(hub.url).port, socket.socket.connect

    def connect_small(sock, address):
        if isinstance(address, tuple) and len(address) >= 2 and address[1] == port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect_small)
