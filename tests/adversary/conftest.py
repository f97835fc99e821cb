"""Adversary tests (round 29): helpers in this folder are importable by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture
def cube(packed_cube_factory, tmp_path):
    """A fresh copy of the session's packed MemOS cube (free to change)."""
    from helpers import copy_of

    return copy_of(packed_cube_factory(), tmp_path)
