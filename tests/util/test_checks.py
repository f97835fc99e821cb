"""The check catalogue (``cubepack/_util/checks.py``): one row per check, each complete, and
the tables it replaces agree with it row for row."""

from __future__ import annotations

import json

import pytest

from cubepack._util.checks import DAMAGE_FIX, Basis, Catalogue

from envs import once

pytestmark = once


@pytest.mark.parametrize("entry", list(Catalogue), ids=str)
def test_each_entry_is_its_name_and_says_what_to_do_when_it_refuses(entry):
    assert entry == entry.value and str(entry) == f"{entry}" == entry.value
    assert Catalogue(entry.value) is entry
    assert hash(entry) == hash(entry.value) and entry.value in {entry}
    assert json.loads(json.dumps({"check": entry})) == {"check": entry.value}
    assert isinstance(entry.basis, Basis)
    assert entry.fix and entry.fix[0].islower() and not entry.fix.endswith(".")
    assert entry.damage == (entry.fix == DAMAGE_FIX)
    # A check of who sent the cube, or one needing the plaintext, is never about the bytes.
    assert not (entry.damage and (entry.trust or entry.plaintext))


def test_the_columns_a_private_cube_is_decided_by():
    """Which checks stop a decryption when they fail (who sent the cube, which revision, to
    which readers), which the decrypted pass leaves to the public one, and which need the
    plaintext: pinned, so a change to the catalogue is a decision."""
    assert {e.value for e in Catalogue if e.trust} == {
        "signature", "attestation", "lineage", "recipients", "replay"}
    assert {e.value for e in Catalogue if e.public_only} == {
        "cube", "signature", "attestation", "lineage"}
    assert {e.value for e in Catalogue if e.plaintext} == {"recompute", "provenance", "embedder"}
    assert {e.value for e in Catalogue if e.optional} == {
        "adapter", "adapter base", "lineage", "recipients", "replay", "private", "remote model",
        "recompute", "provenance", "embedder", "preferences", "shards", "partial"}


def test_a_check_is_made_only_from_its_catalogue_entry(tmp_path):
    """A report's line names its check by the entry; a plain string (a name spelled again, or
    mistyped) is refused at once, so no check is declared outside the catalogue."""
    from cubepack.trust import Check, VerifyReport

    with pytest.raises(TypeError, match="Catalogue"):
        Check("sha256", "x", True)
    report = VerifyReport(tmp_path)
    with pytest.raises(TypeError, match="Catalogue"):
        report.add("sha 256", "x", False)
    report.add(Catalogue.SHA256, "x", False)
    [check] = report.checks
    assert check.basis is Catalogue.SHA256.basis
    assert check.to_dict()["check"] == "sha256" and type(check.to_dict()["basis"]) is str
