"""Fixtures shared by the MemOS tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def installed():
    """The hook installed (no pin required) for one test, and removed after it."""
    import cubepack.memos as hook

    hook.uninstall()
    yield hook.install(require_pin=False)
    hook.uninstall()
