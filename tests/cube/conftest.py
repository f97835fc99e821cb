"""The cube most tests here start from: the session's packed MemOS cube (``packed``, read
only) and a fresh copy of it per test (``cube``, free to change). A module needing another
cube defines its own ``cube``."""

from __future__ import annotations

import pytest

from helpers import copy_of


@pytest.fixture(scope="module")
def packed(packed_cube_factory):
    return packed_cube_factory()


@pytest.fixture
def cube(packed, tmp_path):
    return copy_of(packed, tmp_path)
