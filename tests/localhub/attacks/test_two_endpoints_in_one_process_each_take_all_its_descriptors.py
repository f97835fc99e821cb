"""Adversary (issue #38, round 2): two endpoints in one process each size their connections to
every descriptor the process has left, so together they can take more than it has.

The promise: docs/reference/local-hub.md, Limits: "Connections never exhaust the process's
descriptors: at start the soft `RLIMIT_NOFILE` is raised to the hard one where allowed, and if
served and waiting connections (3 descriptors for each served, 1 for each waiting) would not
fit below it with 64 to spare, both are lowered". `LocalHub` is the Python API (its constructor
arguments are the page's deadlines), and `InstrumentedHub` is one per test: a process may run
several (the docs test gives every page its own endpoint).

The attack: a process whose descriptor limit is 256 (soft and hard) starts two `LocalHub`s on
two roots. `_fit_descriptors` counts the descriptors in use when each starts (/proc/self/fd) and
gives each endpoint everything left, the first endpoint's future connections included.

What happened (0.36 and 2.x): each endpoint takes 46 served and 47-49 waiting connections,
~186 descriptors at its worst; the two together 372 with 8 in use, past the process's 256 and
its 64 spare: under load the process runs out (accept fails, a blob cannot be opened). The
test asks that the endpoints of one process fit its limit together.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from envs import once

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once

SCRIPT = textwrap.dedent("""
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from cubepack.localhub import LocalHub
    from cubepack.localhub._server import SERVED_DESCRIPTORS
    hubs = [LocalHub(os.path.join(sys.argv[1], name)).start() for name in ("one", "two")]
    worst = sum(SERVED_DESCRIPTORS * hub._httpd.limit + hub._httpd.max_waiting for hub in hubs)
    in_use = len(os.listdir("/proc/self/fd"))
    print(worst, in_use, [(hub._httpd.limit, hub._httpd.max_waiting) for hub in hubs])
    for hub in hubs:
        hub.stop()
""")


def test_two_endpoints_of_one_process_fit_its_descriptors_together(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert done.returncode == 0, done.stderr
    worst, in_use, sizes = done.stdout.split(" ", 2)
    assert int(worst) + int(in_use) <= 256, (
        f"two endpoints of one process (limit 256, {in_use} in use) may use {worst} descriptors "
        f"for their connections at worst (served, waiting: {sizes.strip()})")
