"""The endpoint most Hub tests push to: write access needs :data:`data.HUB_TOKEN` (a module
that needs another endpoint, counting or faulty, defines its own ``hub``)."""

from __future__ import annotations

import pytest

from cubepack.testing.hub import InstrumentedHub

from data import HUB_TOKEN


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as server:
        yield server
