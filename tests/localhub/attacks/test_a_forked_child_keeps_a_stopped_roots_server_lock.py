"""Adversary (issue #38, round 2): a process forked while a ``LocalHub`` serves keeps the root's
``server.lock`` after the hub stops: the root can no longer be served, and the refusal names a
pid that serves nothing.

The promise: docs/reference/local-hub.md: "One server process serves a root: it holds a lock
on `ROOT/server.lock` (naming its pid) while it runs [...] the lock goes with its process,
however it ends"; `ServeLock`'s docstring: "The kernel releases the lock when its process ends,
however it ends, so a killed server never blocks the next." `LocalHub` is the Python API
(docs/reference/local-hub.md: "`LocalHub` constructor arguments"; `InstrumentedHub` for tests).

The attack: a program that embeds the endpoint forks a worker while it serves (multiprocessing's
default start method on Linux before Python 3.14 is fork: a data loader, a pool of hashers). The
``flock`` is held by the open file description, which the child inherits (O_CLOEXEC closes it
only on exec), so ``stop()`` closing the parent's descriptor releases nothing.

What happened: after ``hub.stop()``, a new ``LocalHub`` on the same root, in the same process,
is refused: "already served by another `cubepack hub serve` (pid <this process>)", though no
endpoint serves it, until the worker exits. (A SIGKILLed `hub serve` does release it: held.)
"""

from __future__ import annotations

import multiprocessing
import os
import time

from cubepack.localhub import LocalHub

from envs import once

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once


def test_a_stopped_hub_can_be_served_again_while_a_forked_worker_runs(tmp_path):
    root = tmp_path / "root"
    hub = LocalHub(root).start()
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(10,))
    worker.start()
    try:
        hub.stop()
        try:
            LocalHub(root).start().stop()
            refusal = None
        except Exception as error:  # noqa: BLE001 - the refusal, whatever its type
            refusal = f"{type(error).__name__}: {error}"
    finally:
        worker.terminate()
        worker.join()
    assert refusal is None, (
        f"a stopped hub's root cannot be served again while a worker it forked runs "
        f"(this pid {os.getpid()}): {refusal}")
