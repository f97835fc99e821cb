"""Where the checkout's folders are, for tests that name a file of it or hand a child process
its import path: from here, not counted up from a test's own file, which moves as the tests
follow the code."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
