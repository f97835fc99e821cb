"""Adversary (issue #38, item 5, the push side): a push uploads its files in parallel too
(huggingface_hub's LFS uploads, 5 threads, in 0.36 and 2.x alike), and the low-speed rule judged
each upload alone: an honest link at 2.5x the limit shared by 5 uploads (each under the limit)
is declared stalled. The promise: a push is judged on the bytes all of its uploads move.

The endpoint paces the uploads' bodies itself (an InstrumentedHub "link" fault: they share one
link of a fixed rate, a slept-over slot made up, read through a small receive buffer), and the
client's sockets to it get a slow link's small send buffer (:func:`slow_link_buffers`): without
it loopback's buffers swallow each ~290 KB body at once. The rule runs at 128 KiB/s over 2 s;
nothing asserts on time."""

from __future__ import annotations

import pytest

from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from hub_deadlines import HANG, nothing_left_running, slow_link_buffers

LIMIT = 128 * 1024
TIME = 2
#: Five activations of ~290 KB: the push uploads them at once, in huggingface_hub's 5 threads.
PARTS = {f"part{i}": list(range(4 + i, 560 + i)) for i in range(5)}


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub") as server:
        yield server


def test_an_honest_link_above_the_limit_shared_by_parallel_uploads_never_stalls(
        hub, packed_cube_factory, tmp_path, monkeypatch):
    cube = packed_cube_factory(PARTS)
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", str(LIMIT))
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", str(TIME))
    slow_link_buffers(monkeypatch, hub)
    link = hub.add_fault("link", path=r"^/lfs/upload/", method="PUT", times=100,
                         rate=2.5 * LIMIT, step=16 * 1024)
    result = push(cube, "ns/slow", endpoint=hub.url, allow_local_paths=True, timeout=HANG)
    assert result.changed and link.hits == len(PARTS) and hub.stats.commits == 1
    nothing_left_running()
    assert pull(f"ns/slow@{result.commit_sha}", endpoint=hub.url, local_dir=tmp_path / "out",
                cache_dir=tmp_path / "c").report.ok
