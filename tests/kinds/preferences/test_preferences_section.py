"""The lock's ``preferences`` section (version 6): validated, parsed once into frozen entries
with a locator, refused beside a private cube's encryption section, written at version 6 only
by a lock that holds it, diffed leaf by leaf."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from cubepack._util import canonical
from cubepack.errors import FormatError
from cubepack.format import _diff
from cubepack.format import _lock as lockfile

SHA = "a" * 64
ITEM = "explicit_preference/0b0e6e7c-8f5e-4b64-9f7e-1b1f1f1f1f1f"


def _entry(**changes):
    entry = {"embedder": "pref_mem.embedder", "collections": {"explicit_preference": 2,
                                                              "implicit_preference": 1},
             "count": 3, "dimension": 4, "sample": [ITEM]}
    entry.update(changes)
    return entry


def _lock(preferences=None, **sections):
    files = {"prefs.json": {"sha256": SHA, "size": 10}, "config.json": {"sha256": SHA, "size": 2}}
    models = {"pref_mem.embedder": {"name": "e", "strict": False, "repo_id": None,
                                    "revision": None, "identity": None, "reason": "none"}}
    return lockfile.build_lock(cube_id="u/c", files=files, models=models, activations={},
                               cubepack_version="t", preferences=preferences, **sections)


def _bytes(document):
    return lockfile.dumps(document).encode()


def _resealed(document):
    document = copy.deepcopy(document)
    document["content_digest"] = lockfile.content_digest(document)
    document.pop("digest")
    document["digest"] = canonical.digest(document)
    return document


def test_a_lock_holding_preferences_is_version_6_and_parses_to_frozen_entries():
    lock = lockfile.parse(_bytes(_lock({"prefs.json": _entry(probes=[[0.0] * 4] * 4)})))
    assert lock.version == 6
    entry = lock.preferences["prefs.json"]
    assert (entry.file, entry.count, entry.dimension, dict(entry.collections)) == (
        "prefs.json", 3, 4, {"explicit_preference": 2, "implicit_preference": 1})
    assert entry.locator.path == "prefs.json" and entry.locator.sha256 == SHA
    assert entry.vectors.count == 3 and entry.vectors.probes == ((0.0,) * 4,) * 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.count = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        lock.preferences["other"] = entry  # type: ignore[index]


def test_a_lock_without_preferences_stays_at_its_version_with_an_empty_section():
    lock = lockfile.parse(_bytes(_lock()))
    assert lock.version == 4 and dict(lock.preferences) == {} and not lock.holds("preferences")


@pytest.mark.parametrize("change, message", [
    (lambda e: e.update(count=4), "count 4 is not the sum"),
    (lambda e: e.update(embedder="text_mem.embedder"), "which the lock's models do not pin"),
    (lambda e: e.update(dimension=0), "dimension must be a positive integer"),
    (lambda e: e.update(collections={}), "collections must map"),
    (lambda e: e.update(collections={"explicit_preference": 3.0}), "collections must map"),
    (lambda e: e.update(sample=[ITEM, ITEM]), "sample must list distinct"),
    (lambda e: e.update(sample=["other/x"]), "sample must list distinct"),
    (lambda e: e.update(sample=[]), "sample must list distinct"),
    (lambda e: e.update(probes=[[0.0] * 4]), "probes must be 4 vectors of dimension 4"),
    (lambda e: e.update(probes=[[0.0] * 3] * 4), "probes must be 4 vectors of dimension 4"),
    (lambda e: e.update(extra=1), "must hold the keys"),
    (lambda e: e.pop("sample"), "must hold the keys"),
])
def test_a_resealed_but_invalid_entry_is_refused(change, message):
    document = _lock({"prefs.json": _entry()})
    change(document["preferences"]["prefs.json"])
    with pytest.raises(FormatError, match=message):
        lockfile.parse(_bytes(_resealed(document)))


def test_an_entry_for_a_file_the_lock_does_not_list_is_refused():
    document = _lock({"prefs.json": _entry()})
    document["preferences"]["nowhere.json"] = document["preferences"].pop("prefs.json")
    with pytest.raises(FormatError, match="'nowhere.json' is not a file the lock's file list"):
        lockfile.parse(_bytes(_resealed(document)))


def test_an_empty_section_is_refused():
    document = _lock({"prefs.json": _entry()})
    document["preferences"] = {}
    with pytest.raises(FormatError, match="non-empty object"):
        lockfile.parse(_bytes(_resealed(document)))


def test_a_version_5_lock_cannot_hold_preferences():
    document = _lock({"prefs.json": _entry()})
    document["lock_version"] = 5
    with pytest.raises(FormatError, match="unexpected keys \\['preferences'\\]"):
        lockfile.parse(_bytes(_resealed(document)))


def test_preferences_beside_a_private_cubes_encryption_are_refused():
    """A private cube's public lock keeps no sample of its items: the section is refused
    there (it is in the encrypted manifest), by the section's own validation."""
    document = _lock({"prefs.json": _entry()})
    document["encryption"] = {"stand-in": True}
    with pytest.raises(FormatError):
        lockfile.parse(_bytes(_resealed(document)))
    from cubepack.format.sections import preferences

    with pytest.raises(FormatError, match="cannot sit in a private cube's public lock"):
        preferences.validate(document["preferences"], document, 4)


def test_diff_names_the_entry_and_the_leaf_that_changed():
    old = _lock({"prefs.json": _entry()})
    new = _lock({"prefs.json": _entry(count=4, collections={"explicit_preference": 3,
                                                           "implicit_preference": 1})})
    found = _diff.diff_locks(old, new)["sections"]["preferences"]
    fields = sorted(leaf["field"] for leaf in found["changed"]["prefs.json"])
    assert fields == ["collections.explicit_preference", "count"]
    assert "preferences prefs.json: 4 items" in found["describe"]["prefs.json"]
    assert _diff.diff_locks(_lock(), old)["sections"]["preferences"]["added"] == ["prefs.json"]
