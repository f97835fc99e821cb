"""A repo whose cubepack.lock is larger than the lock's parse limit (64 MiB): ``open`` must
refuse it without downloading it whole (the endpoint states its size in the HEAD it already
makes, and a body is read no further than the limit)."""

from __future__ import annotations

import pytest

from cubepack._util import constants
from cubepack.errors import FormatError
from cubepack.format import _lock as lockfile


def test_open_refuses_a_huge_lock_before_fetching_it(hub, cube, remote):
    remote.push(hub, cube)
    (cube / constants.LOCK_FILENAME).write_bytes(b" " * (lockfile.MAX_LOCK_BYTES + 1))
    remote.upload(hub, cube, [constants.LOCK_FILENAME])
    hub.stats.reset()
    with pytest.raises(FormatError, match="limit"):
        remote.open(hub)
    assert hub.stats.sent_bytes < 1024 * 1024, hub.stats.sent_bytes
