"""The lock parsed once into frozen values (``format/sections/``): every lock fixture of every
version gives its sections as typed entries that say what its JSON says, each memory with a
locator; the values cannot be changed; an index kept outside the lock is checked before it is
parsed."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from cubepack.errors import FormatError
from cubepack.format import _lock as lockfile
from cubepack.format.sections import Lock, Locator
from cubepack.format.sections.locator import Index

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"
LOCKS = sorted(FIXTURES.rglob("cubepack.lock"))


def _parsed(path: Path) -> tuple[Lock, dict]:
    data = path.read_bytes()
    return lockfile.parse(data, accept_version_1=True), lockfile.canonical.loads_strict(
        data.decode())


def test_there_are_locks_of_every_version():
    versions = {_parsed(path)[0].version for path in LOCKS}
    assert versions == set(lockfile.READABLE_VERSIONS)


@pytest.mark.parametrize("path", LOCKS, ids=lambda p: p.parent.parent.name)
def test_each_section_is_typed_and_says_what_its_json_says(path):
    lock, document = _parsed(path)
    assert lock.to_dict() == document and lockfile.dumps(lock.to_dict()) == path.read_text()
    assert (lock.version, lock.digest, lock.content_digest, lock.cube_id) == (
        document["lock_version"], document["digest"], document["content_digest"],
        document["cube_id"])
    for name, entry in document["files"].items():
        assert lock.files[name].to_dict() == entry
        assert lock.files[name].locator == Locator(name, 0, entry["size"], entry["sha256"])
    for role, pin in document["models"].items():
        typed = lock.models[role]
        assert (typed.name, typed.repo_id, typed.revision, typed.strict) == (
            pin.get("name"), pin.get("repo_id"), pin.get("revision"), pin.get("strict", False))
        assert (typed.identity is None) == (pin.get("identity") is None)
        if typed.identity is not None:
            assert typed.identity.weights_digest == pin["identity"]["weights_digest"]
            assert dict(typed.identity_fields) == pin["identity"]
        assert (typed.vectors is None) == ("vectors" not in pin)
        if typed.vectors is not None:
            assert typed.vectors.file == pin["vectors"]["file"]
            assert list(typed.vectors.sample) == pin["vectors"]["sample"]
    for item, entry in document["activations"].items():
        typed = lock.activations[item]
        assert (typed.file, typed.sha256, typed.token_count, typed.model_role) == (
            entry["file"], entry["sha256"], entry["token_count"], entry["model_role"])
        assert typed.locator == lock.files[entry["file"]].locator
        assert (typed.provenance is None) == ("provenance" not in entry)
        if typed.provenance is not None:
            assert typed.provenance.to_dict() == entry["provenance"]
            assert typed.label == entry["provenance"]["kind"]
    assert lock.holds("adapters") == ("adapters" in document)
    for name, entry in document.get("adapters", {}).items():
        typed = lock.adapters[name]
        assert (typed.digest, typed.rank, typed.model_role, typed.base_claimed) == (
            entry["digest"], entry["rank"], entry["model_role"], entry["base"]["claimed"])
        assert [loc.path for loc in typed.locators] == [entry["config_file"],
                                                         entry["weights_file"]]
    assert (lock.lineage is None) == ("lineage" not in document)
    if lock.lineage is not None:
        assert lock.lineage.to_dict() == document["lineage"]
        assert lock.lineage.parent.lock_digest == document["lineage"]["parent"]["lock_digest"]
    assert (lock.encryption is None) == ("encryption" not in document) == (not lock.private)
    if lock.encryption is not None:
        assert lock.encryption.to_dict() == document["encryption"]


def test_the_values_are_frozen():
    lock, _ = _parsed(FIXTURES / "lock4" / "cube" / "cubepack.lock")
    entry = next(iter(lock.activations.values()))
    for value, name in ((lock, "digest"), (entry, "file"), (entry.locator, "offset"),
                        (lock.files[entry.file], "sha256"), (entry.provenance, "kind")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    with pytest.raises(TypeError):
        lock.activations["x"] = entry  # type: ignore[index]
    with pytest.raises(TypeError):
        lock.document["digest"] = None  # type: ignore[index]
    # a copy for writers is the writer's: changing it leaves the lock as it was read
    copy = lock.to_dict()
    copy["files"].clear()
    assert lock.files and lock.to_dict()["files"]


def test_a_lock_built_by_pack_reads_as_one_parsed():
    lock, _ = _parsed(FIXTURES / "lock4" / "cube" / "cubepack.lock")
    built = lockfile.build_lock(cube_id=lock.cube_id, files=lock.to_dict()["files"],
                                models=lock.to_dict()["models"],
                                activations=lock.to_dict()["activations"],
                                cubepack_version=lock.cubepack_version)
    again = lockfile.typed(built)
    assert again == lockfile.parse(lockfile.dumps(built).encode())
    assert again.activations == lock.activations and again.files == lock.files


def test_an_index_outside_the_lock_is_checked_before_it_is_parsed():
    data = b'{"a": 1}'
    locator = Locator("index.json", 0, len(data), hashlib.sha256(data).hexdigest())
    parsed = []
    index = Index("demo", lambda raw, where: parsed.append(raw) or raw)
    assert index.load(locator, lambda where: data) == data
    for tampered in (b'{"a": 2}', data + b" "):
        with pytest.raises(FormatError, match="index.json"):
            index.load(locator, lambda where, tampered=tampered: tampered)
    assert parsed == [data]


def test_each_registered_section_has_its_module_and_its_lock_field():
    """The architecture page: a section is its entry in SECTIONS, its module
    format/sections/<key>.py (whose parse the entry calls) and a Lock field of its key."""
    import importlib

    fields = {field.name for field in dataclasses.fields(Lock)}
    for section in lockfile.SECTIONS:
        module = importlib.import_module(f"cubepack.format.sections.{section.key}")
        assert callable(module.parse), section.key
        assert {"_" + section.key, "parse"} <= set(section.parse.__code__.co_names), section.key
        assert section.key in fields, section.key
    lock, _ = _parsed(FIXTURES / "lock4" / "cube" / "cubepack.lock")
    for section in lockfile.SECTIONS:
        if not lock.holds(section.key):
            assert getattr(lock, section.key) == section.absent


def test_a_lock_is_read_by_its_fields_never_by_key():
    """The architecture page: a Lock is no mapping (a read by key fails when it runs)."""
    lock, _ = _parsed(FIXTURES / "lock4" / "cube" / "cubepack.lock")
    with pytest.raises(TypeError):
        lock["files"]  # noqa: B018
    with pytest.raises(AttributeError):
        lock.get("files")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        "files" in lock  # noqa: B015


def test_an_index_is_declared_once():
    from cubepack.format.sections import locator

    index = Index("test-index-once", lambda data, where: data)
    try:
        assert locator.register_index(index) is index
        with pytest.raises(ValueError, match="already declared"):
            locator.register_index(Index("test-index-once", lambda data, where: None))
    finally:
        locator.INDEXES.pop("test-index-once", None)
