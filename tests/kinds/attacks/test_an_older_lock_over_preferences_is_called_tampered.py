"""Adversary #39: a cube packed before the ``preferences`` section (a version-4/5 lock over a
MemOS preference dump, which cubepack then locked as a plain file) fails verify with a message
that calls it tampered ("a packed cube always does: was the record removed?").

Promise (principle 3, issue #39 "Compatible"): a cube an older cubepack wrote still verifies,
or is refused with what upgrades it; a refusal says what differed and a fix that works.

What happened: the check cannot tell an old lock from a record removed, so it blames the cube;
``cubepack upgrade`` refuses it too (it verifies first). The fix that works is packing the
cube again, which records the preference memory at version 6.
"""

from __future__ import annotations

import pytest

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile

from helpers import reseal_lock

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")


def test_an_older_lock_is_refused_naming_its_version_and_the_fix(default_dump):
    cubepack.pack(default_dump)

    def as_before(lock):  # what cubepack wrote before #39: the dump a plain locked file
        del lock["preferences"]  # (build_lock then writes the lowest version that holds it)
    reseal_lock(default_dump, as_before)
    report = cubepack.verify(default_dump, raise_on_failure=False)
    [failed] = [c for c in report.checks if c.name == "preferences" and c.ok is False]
    old = lockfile.parse((default_dump / constants.LOCK_FILENAME).read_bytes()).version
    assert old < 6 and f"version {old}, was written before" in failed.detail
    assert "was the record removed" not in failed.detail
    assert "cubepack pack" in failed.detail
    cubepack.pack(default_dump)  # the fix it names works
    assert lockfile.parse((default_dump / constants.LOCK_FILENAME).read_bytes()).version == 6
    assert cubepack.verify(default_dump).ok
