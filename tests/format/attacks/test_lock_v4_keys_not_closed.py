"""Promise 2: the lock's section registry, lock version 4 "with closed keys": "a key the format
does not define is refused, never ignored" (``_lock._closed``).

Two places of a version-4 lock still take any key and drop it silently: a pin's ``identity``
(``ModelIdentity.from_dict`` keeps the fields it knows) and an embedder pin's ``vectors``
record (``check_record`` checks the keys it needs). A pusher's ``"basis": "proved"`` there
verifies.
"""

from __future__ import annotations

import json

import pytest

from cubepack.errors import FormatError
from cubepack.format import _lock as lockfile

from helpers import reseal_lock


def test_an_unknown_key_in_a_pin_identity_is_refused(cube):
    def change(lock):
        lock["models"]["act_mem"]["identity"]["basis"] = "proved"
    reseal_lock(cube, change)
    data = (cube / "cubepack.lock").read_bytes()
    assert json.loads(data)["lock_version"] == 4
    with pytest.raises(FormatError, match="unknown keys"):
        lockfile.parse(data)


def test_an_unknown_key_in_a_vectors_record_is_refused(cube):
    def change(lock):
        lock["models"]["text_mem.embedder"] = {
            "name": None, "strict": False, "repo_id": None, "revision": None, "identity": None,
            "reason": "config.json names no embedder",
            "vectors": {"file": "textual_memory.json", "dimension": 4, "count": 1,
                        "sample": [], "verified_by": "alice"}}
    reseal_lock(cube, change)
    with pytest.raises(FormatError, match="unknown keys"):
        lockfile.parse((cube / "cubepack.lock").read_bytes())
