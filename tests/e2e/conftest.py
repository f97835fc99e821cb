"""Fixtures shared by the end-to-end tests: a local endpoint per test, a private packed cube."""

from __future__ import annotations

import pytest

from cubepack.testing.hub import InstrumentedHub

from helpers import copy_of


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub-root") as server:
        yield server


@pytest.fixture
def cube(packed_cube_factory, tmp_path):
    return copy_of(packed_cube_factory(), tmp_path)
