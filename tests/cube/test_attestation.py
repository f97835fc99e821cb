"""Signed in-toto attestations (DSSE) of a cube's lock, and ``--require-lineage``: a chain of
attestations from a derived cube up to a root, each link signed by a trusted key.

Derived cubes are built here in the shared lineage format (the lock's ``lineage`` section and
``lineage/ancestors.intoto.json``), as ``cubepack migrate`` writes them, by re-locking a packed
cube with ``build_lock(..., lineage=...)``."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack import UsageError, VerificationFailed
from cubepack._util import canonical, constants
from cubepack._util.hashing import sha256_file
from cubepack.format import _envelope as envelope_format
from cubepack.format import _lock as lockfile
from cubepack.trust import _attestation as attestation
from cubepack.trust._signing import verify_signature, write_signature

from helpers import copy_of, make_key

LOCK, ATTESTATION, ANCESTORS = (constants.LOCK_FILENAME, constants.ATTESTATION_FILENAME,
                                constants.ANCESTORS_FILENAME)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": make_key(folder, "alice"), "bob": make_key(folder, "bob", "p384"),
            "mallory": make_key(folder, "mallory")}


def read_lock(cube: Path) -> dict:
    """The cube's lock document (what these tests edit and compare, key for key)."""
    return lockfile.parse((cube / LOCK).read_bytes()).to_dict()


def parsed_lock(cube: Path) -> lockfile.Lock:
    return lockfile.parse((cube / LOCK).read_bytes())


def envelope_of(cube: Path) -> dict:
    return json.loads((cube / ATTESTATION).read_text())


def derive(parent: Path, folder: Path, *, ancestors: list | None = None,
           changes: dict | None = None) -> Path:
    """A cube derived from the signed cube ``parent``, as migrate writes one: its lock's
    lineage names the parent's lock; its ancestors' file holds the parent's envelope, then the
    parent's own ancestors' (unless ``ancestors`` says otherwise). Unsigned."""
    shutil.copytree(parent, folder)
    for stale in (constants.SIGNATURE_FILENAME, ATTESTATION):
        (folder / stale).unlink(missing_ok=True)
    lock = read_lock(parent)
    if ancestors is None:
        ancestors = [envelope_of(parent)]
        if (parent / ANCESTORS).is_file():
            ancestors += json.loads((parent / ANCESTORS).read_text())["envelopes"]
    (folder / ANCESTORS).parent.mkdir(exist_ok=True)
    (folder / ANCESTORS).write_text(canonical.dumps({"envelopes": ancestors}))
    files = dict(lock["files"])
    files[ANCESTORS] = {"sha256": sha256_file(folder / ANCESTORS),
                        "size": (folder / ANCESTORS).stat().st_size}
    lineage = {"parent": {"lock_digest": lock["digest"], "content_digest": lock["content_digest"],
                          "cube_id": lock["cube_id"], "repo_id": None, "revision": None},
               "changes": changes or {"models": {}, "retokenized": [], "reembedded": 0,
                                      "adapters_dropped": []},
               "tool": "cubepack migrate", "cubepack_version": cubepack.__version__}
    relock(folder, files=files, lineage=lineage)
    return folder


def relock(cube: Path, **change) -> None:
    lock = read_lock(cube)
    fields = {"cube_id": lock["cube_id"], "files": lock["files"], "models": lock["models"],
              "activations": lock["activations"], "cubepack_version": lock["cubepack_version"],
              **lockfile.sections(lock), **change}
    (cube / LOCK).write_text(lockfile.dumps(lockfile.build_lock(**fields)))


def sign_derived(cube: Path, key: Path) -> None:
    """Sign a cube :func:`derive` made as ``migrate --sign-key`` signs the cube it derives:
    every pin, label and the lineage stated as established by the signing step."""
    write_signature(cube, key, attestation.Proved.everything_of(parsed_lock(cube), "migrate",
                                                                lineage=True))


@pytest.fixture
def chain(cube, keys, tmp_path):
    """root -> child -> grandchild, each signed by alice: the root by cubepack.sign (verify,
    then sign), each derived cube as the migrate that made it signs it."""
    cubepack.sign(cube, keys["alice"][0])
    child = derive(cube, tmp_path / "child")
    sign_derived(child, keys["alice"][0])
    grandchild = derive(child, tmp_path / "grandchild")
    sign_derived(grandchild, keys["alice"][0])
    return cube, child, grandchild


def checks(report, name):
    return [c for c in report.checks if c.name == name]


def failures(cube, **policy):
    report = cubepack.verify(cube, raise_on_failure=False, **policy)
    assert not report.ok
    return report.failures


# --- the attestation ----------------------------------------------------------------------------

def test_sign_writes_an_attestation_of_the_lock_that_stock_model_signing_still_accepts(cube, keys):
    cubepack.sign(cube, keys["alice"][0])
    envelope = envelope_of(cube)
    assert set(envelope) == {"payloadType", "payload", "signatures"}
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == envelope_format.PREDICATE_TYPE
    # The first subject is what anyone recomputes from the file: sha256 of the lock's bytes;
    # the second, the cube's memories, pins and other files by digest (version 4).
    lock_sha256 = hashlib.sha256((cube / LOCK).read_bytes()).hexdigest()
    assert statement["subject"] == [
        {"name": LOCK, "digest": {"sha256": lock_sha256}},
        {"name": envelope_format.MEMORIES_SUBJECT,
         "digest": {"sha256": envelope_format.memories_root(
             lockfile.parse((cube / LOCK).read_bytes()))}}]
    lock = read_lock(cube)
    predicate = statement["predicate"]
    assert predicate["cube"] == {"cube_id": lock["cube_id"], "lock_digest": lock["digest"],
                                 "content_digest": lock["content_digest"]}
    pin = lock["models"]["act_mem"]
    # No model was at hand to fingerprint (a local-folder pin): sign proved nothing of the
    # pins or labels, and signs them as the claims they are.
    assert predicate["claimed"]["producers"]["act_mem"] == {
        "repo_id": pin["repo_id"], "revision": pin["revision"],
        "weights_digest": pin["identity"]["weights_digest"], "dtype": pin["identity"]["dtype"]}
    assert predicate["proved"] == {"producers": {}, "provenance": {}, "recomputed": {},
                                   "lineage": None}
    assert set(predicate["claimed"]["provenance"]) == set(lock["activations"])
    assert predicate["claimed"]["lineage"] is None and predicate["claimed"]["origin"] is None
    assert predicate["signer"] == {"step": "sign", "cubepack_version": cubepack.__version__}
    [signature] = envelope["signatures"]
    assert signature["keyid"] == attestation.key_id(keys["alice"][1])
    # The DSSE signature is over PAE(type, payload), ECDSA P-256 / SHA-256, DER-encoded.
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = serialization.load_pem_public_key(keys["alice"][1].read_bytes())
    payload = base64.b64decode(envelope["payload"])
    public.verify(base64.b64decode(signature["sig"]),
                  b"DSSEv1 28 application/vnd.in-toto+json %d %s" % (len(payload), payload),
                  ec.ECDSA(hashes.SHA256()))
    stock = Path(sys.executable).with_name("model_signing")
    done = subprocess.run([str(stock), "verify", "key", str(cube), "--signature",
                           str(cube / constants.SIGNATURE_FILENAME), "--public_key",
                           str(keys["alice"][1])], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # The signature covers the attestation: a changed attestation is a changed cube.
    (cube / ATTESTATION).write_text(json.dumps(envelope, indent=1))
    done = subprocess.run([str(stock), "verify", "key", str(cube), "--signature",
                           str(cube / constants.SIGNATURE_FILENAME), "--public_key",
                           str(keys["alice"][1])], capture_output=True, text=True, check=False)
    assert done.returncode != 0


def test_verify_with_a_trusted_key_reports_the_attestation_signed(cube, keys):
    cubepack.pack(cube, sign_key=keys["bob"][0])  # pack --sign-key writes it too (P-384 here)
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1], keys["bob"][1]])
    [check] = checks(report, "attestation")
    assert check.ok is True and check.basis == "signed"
    assert "its subject is this cubepack.lock" in check.detail
    assert report.attested_by == str(keys["bob"][1])
    assert checks(report, "lineage") == []  # not asked for
    skipped = checks(cubepack.verify(cube), "attestation")  # no key: nothing to trust it by
    assert [(c.ok, c.detail) for c in skipped] == [(None, "skipped: no trusted key given")]


def test_an_attestation_by_an_untrusted_key_is_refused(cube, keys):
    cubepack.sign(cube, keys["mallory"][0])
    failed = failures(cube, trusted_keys=[keys["alice"][1]])
    [check] = [f for f in failed if f.name == "attestation"]
    assert "not signed by a trusted key" in check.detail
    assert attestation.key_id(keys["alice"][1])[:16] in check.expected
    assert attestation.key_id(keys["mallory"][1])[:16] in check.found


def test_an_attestation_moved_to_another_cube_is_refused(cube, keys, packed_cube_factory,
                                                         tmp_path):
    other = copy_of(packed_cube_factory({"other": [5, 6, 7, 8]}), tmp_path / "other")
    cubepack.sign(other, keys["alice"][0])
    cubepack.sign(cube, keys["alice"][0])
    shutil.copy(other / ATTESTATION, cube / ATTESTATION)
    failed = failures(cube, trusted_keys=[keys["alice"][1]])
    [check, *differences] = [f for f in failed if f.name == "attestation"]
    assert "its subject is another lock" in check.detail
    assert any("predicate.memories.other" in f.subject for f in differences)
    assert hashlib.sha256((cube / LOCK).read_bytes()).hexdigest() in check.expected
    assert hashlib.sha256((other / LOCK).read_bytes()).hexdigest() in check.found


def test_a_tampered_payload_is_refused(cube, keys):
    cubepack.sign(cube, keys["alice"][0])
    envelope = envelope_of(cube)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["signer"]["step"] = "pack"  # claim more than was signed
    envelope["payload"] = base64.b64encode(canonical.dumps(statement, compact=True)
                                           .encode()).decode()
    (cube / ATTESTATION).write_text(canonical.dumps(envelope))
    failed = failures(cube, trusted_keys=[keys["alice"][1]])
    [check] = [f for f in failed if f.name == "attestation"]
    assert "payload was changed after signing" in check.detail


def test_a_signed_predicate_that_disagrees_with_the_lock_is_refused(cube, keys):
    """Signed by a trusted key, naming this lock, but claiming other pins: refused, by field."""
    cubepack.sign(cube, keys["alice"][0])
    lock_bytes = (cube / LOCK).read_bytes()
    statement = attestation.statement_for(parsed_lock(cube), lock_bytes,
                                          attestation.Proved("sign"))
    statement["predicate"]["claimed"]["producers"]["act_mem"]["dtype"] = "bfloat16"
    envelope = attestation.sign_statement(statement, keys["alice"][0])
    (cube / ATTESTATION).write_bytes(envelope_format.envelope_bytes(envelope))
    [check] = [f for f in failures(cube, trusted_keys=[keys["alice"][1]])
               if f.name == "attestation"]
    assert check.subject.endswith("predicate.claimed.producers.act_mem.dtype")
    assert (check.expected, check.found) == ("float32", "bfloat16")


@pytest.mark.parametrize("mutate, says", [
    (lambda e: e.update(extra=1), "exactly payloadType, payload and signatures"),
    (lambda e: e.update(payloadType="text/plain"), "payloadType must be"),
    (lambda e: e.update(signatures=[]), "1 to 16 signatures"),
    (lambda e: e["signatures"][0].update(sig="not base64!"), "standard padded base64"),
    (lambda e: e.update(payload=base64.b64encode(b'{"_type": 1, "_type": 2}').decode()),
     "repeats the key"),
    (lambda e: e.update(payload=base64.b64encode(b"[" * 100 + b"]" * 100).decode()),
     "nesting deeper"),
])
def test_a_malformed_attestation_is_refused_by_the_content_check(cube, keys, mutate, says):
    """Strictly parsed whenever present, with or without keys (like every file of a cube)."""
    cubepack.sign(cube, keys["alice"][0])
    envelope = envelope_of(cube)
    mutate(envelope)
    (cube / ATTESTATION).write_text(json.dumps(envelope))
    [check] = [f for f in failures(cube) if f.name == "content"]
    assert check.subject == ATTESTATION and says in check.detail


def test_an_oversized_attestation_is_refused_unread(cube):
    (cube / ATTESTATION).write_bytes(b" " * (envelope_format.MAX_ENVELOPE_BYTES + 1))
    [check] = [f for f in failures(cube) if f.name == "content"]
    assert "refused unread" in check.detail


def test_a_repack_that_changes_the_cube_drops_the_stale_attestation(cube, keys):
    cubepack.sign(cube, keys["alice"][0])
    assert cubepack.pack(cube).changed is False and (cube / ATTESTATION).is_file()
    cubepack.pack(cube, pretty_name="Renamed")
    assert not (cube / ATTESTATION).exists() and not (cube / constants.SIGNATURE_FILENAME).exists()


def test_a_failed_signature_leaves_the_old_attestation(cube, keys, monkeypatch):
    from cubepack.trust import _signing

    cubepack.sign(cube, keys["alice"][0])
    before = (cube / ATTESTATION).read_bytes(), (cube / constants.SIGNATURE_FILENAME).read_bytes()
    relock(cube, cube_id="other/cube")  # a new lock: a new attestation would be written
    real = _signing.os.replace

    def failing(source, target):
        if str(target).endswith(constants.SIGNATURE_FILENAME):
            raise OSError("disk full")
        return real(source, target)
    monkeypatch.setattr(_signing.os, "replace", failing)
    with pytest.raises(OSError):
        _signing.write_signature(cube, keys["alice"][0], attestation.Proved("sign"))
    monkeypatch.undo()
    assert ((cube / ATTESTATION).read_bytes(),
            (cube / constants.SIGNATURE_FILENAME).read_bytes()) == before


# --- the chain ----------------------------------------------------------------------------------

def test_a_three_cube_chain_signed_by_trusted_keys_passes_require_lineage(chain, keys):
    root, child, grandchild = chain
    report = cubepack.verify(grandchild, trusted_keys=[keys["alice"][1]], require_lineage=True)
    links = checks(report, "lineage")
    assert [c.ok for c in links] == [True, True] and all(c.basis == "signed" for c in links)
    child_lock, root_lock = read_lock(child), read_lock(root)
    assert links[0].subject == f"link 1: this cube -> parent {child_lock['digest']}"
    assert links[1].subject == (f"link 2: parent {child_lock['digest'][:12]} -> parent "
                                f"{root_lock['digest']}")
    assert hashlib.sha256((root / LOCK).read_bytes()).hexdigest() in links[1].detail
    [own] = checks(report, "attestation")
    assert own.ok is True
    predicate = envelope_format.read_envelope(grandchild / ATTESTATION).predicate
    assert predicate["proved"]["lineage"]["parent"]["lock_digest"] == child_lock["digest"]
    root_report = cubepack.verify(root, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert [(c.subject, c.ok) for c in checks(root_report, "lineage")] == [("this cube", True)]
    # Mixed keys are fine when each is trusted.
    sign_derived(grandchild, keys["bob"][0])
    assert cubepack.verify(grandchild, trusted_keys=[keys["alice"][1], keys["bob"][1]],
                           require_lineage=True).ok


def test_an_ancestor_signed_by_an_untrusted_key_is_refused(cube, keys, tmp_path):
    cubepack.sign(cube, keys["mallory"][0])
    child = derive(cube, tmp_path / "child")
    sign_derived(child, keys["alice"][0])
    assert cubepack.verify(child, trusted_keys=[keys["alice"][1]]).ok  # lineage not asked
    [link] = [f for f in failures(child, trusted_keys=[keys["alice"][1]], require_lineage=True)]
    assert link.name == "lineage" and link.subject.startswith("link 1: this cube -> parent ")
    assert "envelope 1 of lineage/ancestors.intoto.json is not signed by a trusted key" in \
        link.detail
    assert attestation.key_id(keys["mallory"][1])[:16] in link.found


def signed_stranger(packed_cube_factory, tmp_path, key):
    """Another cube (other caches), signed: a genuine envelope of the wrong lock."""
    stranger = copy_of(packed_cube_factory({"other": [5, 6, 7, 8]}), tmp_path / "stranger")
    cubepack.sign(stranger, key)
    return stranger


def test_a_parent_link_naming_another_lock_is_refused(chain, keys, tmp_path, packed_cube_factory):
    """The grandchild's ancestors hold a genuine, trusted envelope, but of another cube than
    the one its lineage names."""
    root, child, _ = chain
    stranger = signed_stranger(packed_cube_factory, tmp_path, keys["alice"][0])
    forged = derive(child, tmp_path / "forged", ancestors=[envelope_of(stranger),
                                                           envelope_of(root)])
    sign_derived(forged, keys["alice"][0])
    [link] = failures(forged, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert link.name == "lineage" and link.subject.startswith("link 1: this cube -> parent ")
    assert "its lock_digest differs" in link.detail
    assert link.expected == f"lock_digest {read_lock(child)['digest']}"
    assert link.found == f"lock_digest {read_lock(stranger)['digest']}"


def test_a_broken_link_higher_up_is_named(chain, keys, tmp_path, packed_cube_factory):
    root, child, _ = chain
    stranger = signed_stranger(packed_cube_factory, tmp_path, keys["alice"][0])
    forged = derive(child, tmp_path / "forged", ancestors=[envelope_of(child),
                                                           envelope_of(stranger)])
    sign_derived(forged, keys["alice"][0])
    failed = failures(forged, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert [(f.name, f.subject.split(":")[0]) for f in failed] == [("lineage", "link 2")]
    assert read_lock(root)["digest"] in failed[0].expected


def test_a_missing_ancestors_file_is_refused(chain, keys, tmp_path):
    _, child, _ = chain
    orphan = derive(child, tmp_path / "orphan")
    (orphan / ANCESTORS).unlink()
    lock = read_lock(orphan)
    relock(orphan, files={k: v for k, v in lock["files"].items() if k != ANCESTORS})
    sign_derived(orphan, keys["alice"][0])
    [link] = failures(orphan, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert link.name == "lineage" and "carries no lineage/ancestors.intoto.json" in link.detail
    assert (link.expected, link.found) == ("the parent's envelope", "absent")


def test_a_chain_that_stops_before_a_root_is_refused(chain, keys, tmp_path):
    _, child, _ = chain
    cut = derive(child, tmp_path / "cut", ancestors=[envelope_of(child)])  # root's left out
    sign_derived(cut, keys["alice"][0])
    [link] = failures(cut, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert link.subject.startswith("link 2: ") and "stops before a root" in link.detail


def test_an_envelope_after_the_root_is_refused(chain, keys, tmp_path):
    root, child, _ = chain
    extra = derive(child, tmp_path / "extra", ancestors=[envelope_of(child), envelope_of(root),
                                                         envelope_of(root)])
    sign_derived(extra, keys["alice"][0])
    failed = failures(extra, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert [(f.subject, f.detail) for f in failed] == [
        ("envelope 3", "follows the root (envelope 2 names no parent)")]


def test_a_malformed_ancestors_file_is_refused_with_or_without_keys(chain, keys, tmp_path):
    _, child, _ = chain
    broken = derive(child, tmp_path / "broken", ancestors=[{"payloadType": "x"}])
    [check] = failures(broken)
    assert (check.name, check.subject) == ("content", ANCESTORS)
    assert "exactly payloadType, payload and signatures" in check.detail
    with pytest.raises(cubepack.FormatError, match="ancestors.intoto.json"):
        cubepack.pack(broken)  # pack refuses to lock what verify would refuse


def test_the_keyid_is_a_hint_every_trusted_key_is_tried(cube, keys):
    cubepack.sign(cube, keys["alice"][0])
    envelope = envelope_of(cube)
    envelope["signatures"][0]["keyid"] = "whatever"  # unsigned field: changes no signature
    (cube / ATTESTATION).write_text(canonical.dumps(envelope))
    report = cubepack.verify(cube, trusted_keys=[keys["bob"][1], keys["alice"][1]],
                             raise_on_failure=False)
    assert [c.ok for c in checks(report, "attestation")] == [True]
    assert report.attested_by == str(keys["alice"][1])


def test_require_lineage_without_any_attestation_refuses(cube, keys):
    failed = failures(cube, trusted_keys=[keys["alice"][1]], require_lineage=True)
    [missing] = [f for f in failed if f.name == "attestation"]
    assert (missing.expected, missing.found) == ("a DSSE envelope signed by a trusted key",
                                                 "absent")
    assert [f.name for f in failed if f.name == "lineage"] == ["lineage"]
    # Signed by model_signing but without the attestation (an older cubepack): still refused.
    write_signature(cube, keys["alice"][0], attestation.Proved("sign"))
    (cube / ATTESTATION).unlink()
    assert "attestation" in [f.name for f in failures(cube, trusted_keys=[keys["alice"][1]],
                                                       require_lineage=True)]
    with pytest.raises(UsageError, match="needs the keys"):
        cubepack.verify(cube, require_lineage=True)


def test_what_migrate_derived_is_in_the_signed_predicate(cube, keys, tmp_path):
    cubepack.sign(cube, keys["alice"][0])
    changes = {"models": {}, "embedder": {"from": "mini-a", "to": "mini-b"},
               "retokenized": ["item-1", "item-2"], "reembedded": 12, "adapters_dropped": []}
    child = derive(cube, tmp_path / "child", changes=changes)
    sign_derived(child, keys["alice"][0])
    predicate = envelope_format.read_envelope(child / ATTESTATION).predicate
    assert predicate["proved"]["lineage"]["changes"] == changes
    assert predicate["claimed"]["lineage"] is None
    assert cubepack.verify(child, trusted_keys=[keys["alice"][1]], require_lineage=True).ok
    # Signed again by a step that did not derive it, the same lineage is a claim.
    cubepack.sign(child, keys["alice"][0])
    predicate = envelope_format.read_envelope(child / ATTESTATION).predicate
    assert predicate["proved"]["lineage"] is None
    assert predicate["claimed"]["lineage"]["changes"] == changes
    [link] = failures(child, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert "names parent" in link.detail and "as a claim" in link.detail
    assert (link.expected, link.found) == ("a parent link its signer derived (migrate)",
                                           "a carried claim")


def test_a_lineage_the_predicate_cannot_state_is_not_signed(cube, keys, tmp_path):
    cubepack.sign(cube, keys["alice"][0])
    odd = derive(cube, tmp_path / "odd", changes={"reembedded": "lots", "retokenized": [1, "a"]})
    # the lock's own reader refuses the section first (sign verifies before it signs)
    with pytest.raises(cubepack.VerificationFailed, match="lineage changes must hold"):
        cubepack.sign(odd, keys["alice"][0])
    assert not (odd / ATTESTATION).exists() and not (odd / constants.SIGNATURE_FILENAME).exists()


# --- through pull, the hook's settings and the CLI ------------------------------------------------

def test_pull_refuses_a_broken_chain_and_places_nothing(chain, keys, tmp_path):
    from cubepack.hub import pull, push
    from cubepack.testing.hub import InstrumentedHub

    from helpers import tree_bytes

    _, child, grandchild = chain
    (child / ANCESTORS).write_text(canonical.dumps({"envelopes": [envelope_of(child)]}))
    relock(child, files={**read_lock(child)["files"], ANCESTORS: {
        "sha256": sha256_file(child / ANCESTORS), "size": (child / ANCESTORS).stat().st_size}})
    sign_derived(child, keys["alice"][0])  # names itself as its own parent's envelope
    with InstrumentedHub(tmp_path / "hub") as hub:
        good = push(grandchild, "ns/good", endpoint=hub.url, allow_local_paths=True)
        result = pull(f"ns/good@{good.commit_sha}", endpoint=hub.url, local_dir=tmp_path / "ok",
                      cache_dir=tmp_path / "c", trusted_keys=[keys["alice"][1]],
                      require_lineage=True)
        assert [c.ok for c in checks(result.report, "lineage")] == [True, True]
        assert (tmp_path / "ok" / ATTESTATION).is_file()
        bad = push(child, "ns/bad", endpoint=hub.url, allow_local_paths=True)
        target = tmp_path / "refused"
        target.mkdir()
        with pytest.raises(VerificationFailed, match="lineage"):
            pull(f"ns/bad@{bad.commit_sha}", endpoint=hub.url, local_dir=target,
                 cache_dir=tmp_path / "c", trusted_keys=[keys["alice"][1]],
                 require_lineage=True)
        assert tree_bytes(target) == {}


def test_the_hook_settings_carry_require_lineage(keys, monkeypatch):
    from cubepack.memos import _hook

    monkeypatch.setitem(_hook._STATE, "settings", None)
    monkeypatch.setattr(_hook, "_patch", lambda: None)
    with pytest.raises(UsageError, match="needs the keys"):
        _hook.install(require_lineage=True)
    settings = _hook.install(trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert settings.require_lineage is True
    assert _hook.install(require_lineage=False).require_lineage is True  # only tightens
    monkeypatch.setitem(_hook._STATE, "settings", None)
    monkeypatch.setenv("CUBEPACK_MEMOS_REQUIRE_LINEAGE", "1")
    monkeypatch.setenv("CUBEPACK_MEMOS_TRUSTED_KEYS", str(keys["alice"][1]))
    assert _hook.install().require_lineage is True


def test_cli_json_outcomes(chain, keys, tmp_path, capsys):
    from cubepack.cli import main

    root, _, grandchild = chain
    alice, mallory = str(keys["alice"][1]), str(keys["mallory"][1])
    assert main(["verify", str(grandchild), "--trusted-key", alice, "--require-lineage",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["attested_by"] == alice
    assert [c["ok"] for c in data["checks"] if c["check"] == "lineage"] == [True, True]
    assert main(["verify", str(grandchild), "--trusted-key", mallory, "--require-lineage",
                 "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["error"]["type"] == "VerificationFailed"
    failed = {c["check"] for c in data["report"]["checks"] if c["ok"] is False}
    assert {"attestation", "lineage"} <= failed
    assert main(["verify", str(grandchild), "--require-lineage", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["error"]["type"] == "UsageError" and "--trusted-key" in data["error"]["message"]
    fresh = copy_of(root, tmp_path / "fresh")
    assert main(["sign", str(fresh), "--key", str(keys["alice"][0]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["attestation"] == str(fresh / ATTESTATION)
    assert main(["verify", str(fresh), "--trusted-key", alice]) == 0
    assert "attested by trusted key" in capsys.readouterr().out
    assert verify_signature(fresh, [keys["alice"][1]]) == alice
