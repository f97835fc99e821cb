"""A new memory kind needs no format change for what a private cube's public lock counts of
it, nor for what a lineage states it changed: both iterate what the kinds and their sections
declare, and every older version is still read as it was written.

- encryption section version 3 counts each kind under its lock section's key (any section of
  ``SECTIONS``); versions 1 and 2 count exactly files, activations, adapters, recipients;
- a lineage's ``changes`` hold exactly the keys declared for the lock's version
  (``sections.lineage.register_change``, by the section module of the kind that writes one).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cubepack.errors import FormatError
from cubepack.format import _lock as lockfile
from cubepack.format.sections import encryption as encryption_section
from cubepack.format.sections import lineage as lineage_section
from cubepack.kinds import KINDS
from cubepack.trust import _lineage as lineage

COMPAT = Path(__file__).parent.parent / "fixtures" / "compat"


def _document(name: str) -> dict:
    return json.loads((COMPAT / name / "cube" / "cubepack.lock").read_text())


def _version_3(document: dict) -> dict:
    section = copy.deepcopy(document["encryption"])
    section["version"] = 3
    return section


def test_version_3_counts_a_kind_under_its_section_s_key():
    document = _document("private2-age")
    section = _version_3(document)
    section["counts"]["preferences"] = 2
    lockfile._check_encryption(section, document)
    counts = encryption_section.parse(section).counts
    assert (counts.of("preferences"), counts.of("activations"), counts.of("adapters")) == (
        2, document["encryption"]["counts"]["activations"], 0)
    assert counts.to_dict() == section["counts"]


@pytest.mark.parametrize("version, counts, found", [
    (2, {"preferences": 2}, "version 2's counts must map exactly"),
    (1, {"preferences": 2}, "version 1's counts must map exactly"),
    (3, {"glossary": 1}, "only memory sections"),
    (3, {"lineage": 1}, "only memory sections"),
    (3, {"encryption": 1}, "only memory sections"),
    (3, {"models": 3}, "only memory sections"),
    (3, {"recipients": None}, "non-negative integers"),
    (3, {"activations": -1}, "non-negative integers"),
])
def test_counts_other_than_a_version_s_are_refused(version, counts, found):
    document = _document("private2-age" if version >= 2 else "private1-age")
    section = _version_3(document) if version == 3 else copy.deepcopy(document["encryption"])
    section["counts"] |= counts
    if counts == {"recipients": None}:
        del section["counts"]["recipients"]
        section["counts"]["files"] = None
    with pytest.raises(FormatError, match=found):
        lockfile._check_encryption(section, document)


def test_version_3_requires_files_and_recipients():
    document = _document("private2-age")
    section = _version_3(document)
    del section["counts"]["recipients"]
    with pytest.raises(FormatError, match="must hold \\['files', 'recipients'\\]"):
        lockfile._check_encryption(section, document)


def test_older_counts_read_as_they_were_written():
    for name in ("private1-age", "private2-age", "private2-ssh-hidden"):
        document = _document(name)
        counts = encryption_section.parse(document["encryption"]).counts
        assert counts.to_dict() == document["encryption"]["counts"], name


def test_every_kind_counts_only_under_its_own_section():
    """What the kinds count is keyed by their memory sections (what version 3 accepts)."""
    from cubepack.format.sections import MEMORY_SECTIONS

    sections = set(MEMORY_SECTIONS)
    for kind in KINDS:
        assert set(kind.counts(lockfile.parse((COMPAT / "lock4" / "cube" / "cubepack.lock")
                                              .read_bytes()))) <= sections, kind.name
        assert kind.section is None or kind.section in sections, kind.name


@pytest.fixture
def declared():
    """A toy kind's change, declared as its section module would (from lock version 6,
    optional: the locks written before it stay what they were)."""
    change = lineage_section.register_change(lineage_section.ChangeKey(
        "glossary_dropped", 6, lambda value: None if isinstance(value, list)
        else "must be a list", optional=True, normal=sorted))
    yield change
    del lineage_section.CHANGES[change.key]


def test_a_declared_change_is_stated_by_every_new_lineage_and_read(declared):
    parent = _document("lineage")["lineage"]["parent"]
    built = lineage.build(parent, {"glossary_dropped": ["b", "a"], "reembedded": 2})
    assert built["changes"]["glossary_dropped"] == ["a", "b"]
    assert built["changes"]["reembedded"] == 2 and built["changes"]["models"] == {}
    assert "embedder" not in built["changes"]
    lockfile._check_lineage(built, 6)
    assert lineage_section.parse(built).changes.others == {"glossary_dropped": ["a", "b"]}
    # nothing recorded: not stated (the lock keeps the version it had)
    assert "glossary_dropped" not in lineage.build(parent, {})["changes"]
    lock = lockfile.build_lock(cube_id=None, files={}, models={}, cubepack_version="t",
                               lineage=built)
    assert lock["lock_version"] == 6


def test_a_change_is_refused_in_a_lock_older_than_its_declaration(declared):
    built = lineage.build(_document("lineage")["lineage"]["parent"],
                          {"glossary_dropped": ["x"]})
    with pytest.raises(FormatError, match="glossary_dropped"):
        lockfile._check_lineage(built, 5)
    lockfile._check_lineage(built, 6)
    built["changes"]["glossary_dropped"] = "x"
    with pytest.raises(FormatError, match="changes.glossary_dropped must be a list"):
        lockfile._check_lineage(built, 6)


def test_a_change_no_section_declares_is_never_stated():
    with pytest.raises(ValueError, match="no lock section declares"):
        lineage.build(_document("lineage")["lineage"]["parent"], {"glossary_dropped": []})


def test_every_lineage_fixture_still_reads():
    for path in sorted(COMPAT.rglob("cubepack.lock")):
        document = json.loads(path.read_text())
        if "lineage" in document:
            lockfile._check_lineage(document["lineage"], document["lock_version"])
