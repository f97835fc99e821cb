"""Adversary (issue #30, item 6): the low-speed rule judges only requests in flight. An endpoint
that answers every file request at once with ``503`` and ``Retry-After: <long>`` moves a few
hundred bytes and then nothing: huggingface_hub sleeps between its retries with no request in
flight, so the rule never judges anything and the pull runs on until the overall deadline
(default 3600 s; five retries of ``Retry-After: 600`` is ~50 minutes), ended by a deadline
error that names no stall. The promise: a hostile endpoint that moves (almost) nothing ends
with a HubError naming the stall within CUBEPACK_LOW_SPEED_TIME.

The overall deadline here is short (HANG_HERE) so the test ends quickly on main; the endpoint
misbehaves by itself (no sleeps in the test), and nothing is asserted on timing."""

from __future__ import annotations

import re

import pytest

from cubepack import HubError
from cubepack.hub import pull
from cubepack.testing.hub import InstrumentedHub

from hub_deadlines import published

#: The overall deadline of the pull: long against the 2 s rule, short for a test.
HANG_HERE = 20


class RetryAfterHub(InstrumentedHub):
    """Answers every file request (``/resolve/``) with 503 and a long Retry-After, at once."""

    def before_request(self, handler, method, path):
        if self.stopping_after_publish and "/resolve/" in path:
            handler.drain()
            handler.send_json({"error": "busy"}, 503, {"Retry-After": "600"})
            return False
        return super().before_request(handler, method, path)

    stopping_after_publish = False


@pytest.fixture
def hub(tmp_path):
    with RetryAfterHub(tmp_path / "hub-root") as server:
        yield server


def test_a_retry_after_endpoint_is_a_stall_not_an_hour(hub, packed_cube_factory, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", "2")
    commit = published(hub, packed_cube_factory())
    hub.stopping_after_publish = True
    with pytest.raises(HubError) as caught:
        pull(f"ns/slow@{commit}", endpoint=hub.url, local_dir=tmp_path / "out",
             cache_dir=tmp_path / "cache", timeout=HANG_HERE)
    assert re.search(r"stall", str(caught.value)), str(caught.value)
    assert not (tmp_path / "out").exists()
