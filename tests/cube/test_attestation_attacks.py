"""Attacks on signed attestations and lineage chains: forged, spliced, replayed and malformed
envelopes, through verify, pull and the CLI. Each is refused with a precise check (or is the
one accepted case DSSE allows: several signatures, one of them trusted)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import canonical, constants
from cubepack.format import _envelope as envelope_format
from cubepack.format import _lock as lockfile
from cubepack.trust import _attestation as att
from cubepack.trust._attestation import Proved
from cubepack.trust._signing import write_signature as _write_signature

from helpers import copy_of, make_key

ATT = constants.ATTESTATION_FILENAME
ANC = constants.ANCESTORS_FILENAME


def write_signature(cube, key):
    """Sign ``cube`` as the step that made it would: pack (a root) or migrate (a cube whose
    lock names a parent), every pin and label stated as its own."""
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    derived = lock.lineage is not None
    _write_signature(cube, key, Proved.everything_of(lock, "migrate" if derived else "pack",
                                                     lineage=derived))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": make_key(folder, "alice"), "bob": make_key(folder, "bob", "p384"),
            "eve": make_key(folder, "eve"), "ed": make_key(folder, "ed", "ed25519")}


@pytest.fixture(scope="module")
def other_packed(packed_cube_factory):
    return packed_cube_factory({"item-9": [40, 41, 42]})


def checks(report, name):
    return [c for c in report.checks if c.name == name]


def failed(report, name):
    return [c for c in checks(report, name) if c.ok is False]


def run_verify(cube, pub, **options):
    return cubepack.verify(cube, trusted_keys=[pub], raise_on_failure=False, **options)


def derive(parent, child, key, *, ancestors=None, parent_link=None):
    """A child cube of ``parent`` as migrate would write it (a lineage section naming the
    parent, the parent's envelope first in the ancestors file), signed with ``key``."""
    shutil.copytree(parent, child)
    for name in (ATT, constants.SIGNATURE_FILENAME):
        (child / name).unlink(missing_ok=True)
    plock = json.loads((parent / constants.LOCK_FILENAME).read_text())
    if ancestors is None:
        ancestors = [json.loads((parent / ATT).read_text())]
        if (parent / ANC).is_file():
            ancestors += json.loads((parent / ANC).read_text())["envelopes"]
    write_ancestors(child, ancestors)
    link = {"lock_digest": plock["digest"], "content_digest": plock["content_digest"],
            "cube_id": plock["cube_id"], "repo_id": None, "revision": None}
    link.update(parent_link or {})
    relock(child, {"parent": link, "changes": {}})
    write_signature(child, key)
    return child


def write_ancestors(cube, envelopes):
    (cube / ANC).parent.mkdir(exist_ok=True)
    (cube / ANC).write_text(canonical.dumps({"envelopes": envelopes}))


def relock(cube, lineage):
    """Re-list every file of ``cube`` in a new lock carrying ``lineage`` (as pack would), in
    the lock's full format: what the test leaves out is migrate's default (no change; a parent
    of all zeros)."""
    lineage = {"parent": lineage.get("parent") or {
                   "lock_digest": "0" * 64, "content_digest": "0" * 64, "cube_id": None,
                   "repo_id": None, "revision": None},
               "changes": {"models": {}, "retokenized": [], "reembedded": 0,
                           "adapters_dropped": [], **lineage.get("changes", {})},
               "tool": "cubepack migrate", "cubepack_version": cubepack.__version__}
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    files = dict(lock["files"])
    if (cube / ANC).is_file():
        data = (cube / ANC).read_bytes()
        files[ANC] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    new = lockfile.build_lock(cube_id=lock["cube_id"], files=files, models=lock["models"],
                              activations=lock["activations"],
                              cubepack_version=lock["cubepack_version"], lineage=lineage)
    (cube / constants.LOCK_FILENAME).write_text(lockfile.dumps(new))


def envelope_of(cube):
    return json.loads((cube / ATT).read_text())


def statement_of(envelope):
    return json.loads(base64.b64decode(envelope["payload"]))


def sign_crafted(statement, key, *, raw=False):
    """An envelope of any statement signed with ``key`` (``raw``: over the payload, no PAE)."""
    if not raw:
        return att.sign_statement(statement, key)
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = serialization.load_pem_private_key(key.read_bytes(), None)
    payload = canonical.dumps(statement, compact=True).encode()
    sig = private.sign(payload, ec.ECDSA(hashes.SHA256()))
    return {"payloadType": envelope_format.PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": "x", "sig": base64.b64encode(sig).decode()}]}


def replace_attestation(cube, envelope, key):
    """Put ``envelope`` in the cube and re-sign cubepack.sig over it (with ``key``) the way
    write_signature does, so only the attestation check stands between it and acceptance."""
    data = envelope_format.envelope_bytes(envelope)
    (cube / ATT).write_bytes(data)
    _resign_keeping_attestation(cube, key)


def _resign_keeping_attestation(cube, key):
    from cubepack.trust import _signing

    real = _signing.attest
    data = (cube / ATT).read_bytes()
    _signing.attest = lambda *a, **k: data
    try:
        write_signature(cube, key)
    finally:
        _signing.attest = real


@pytest.fixture
def signed(cube, keys):
    write_signature(cube, keys["alice"][0])
    return cube


# --- a cube's own envelope ---------------------------------------------------------------------

def test_a_signed_cube_verifies_and_its_lineage_is_a_root(signed, keys):
    report = run_verify(signed, keys["alice"][1], require_lineage=True)
    assert report.ok, [c.to_dict() for c in report.failures]
    assert report.attested_by == str(keys["alice"][1])


def test_an_envelope_moved_from_another_cube_is_refused(signed, other_packed, tmp_path, keys):
    other = copy_of(other_packed, tmp_path / "o")
    write_signature(other, keys["alice"][0])
    replace_attestation(signed, envelope_of(other), keys["alice"][0])
    report = run_verify(signed, keys["alice"][1])
    [check, *_] = failed(report, "attestation")  # then each memory and statement that differs
    assert "another lock" in check.detail and check.expected != check.found


def test_an_old_envelope_after_the_lock_changed_is_refused(signed, keys):
    old = envelope_of(signed)
    relock(signed, {"changes": {"reembedded": 0}})
    replace_attestation(signed, old, keys["alice"][0])
    [check, difference] = failed(run_verify(signed, keys["alice"][1]), "attestation")
    assert "another lock" in check.detail and "lineage" in difference.subject


def test_two_signatures_one_trusted_is_accepted_and_none_trusted_is_refused(signed, keys):
    envelope = envelope_of(signed)
    eve = att.sign_statement(statement_of(envelope), keys["eve"][0])["signatures"]
    envelope["signatures"] = eve + envelope["signatures"]
    replace_attestation(signed, envelope, keys["alice"][0])
    assert run_verify(signed, keys["alice"][1]).ok
    envelope["signatures"] = eve + [{"keyid": envelope["signatures"][1]["keyid"],
                                     "sig": eve[0]["sig"]}]  # alice's keyid, eve's signature
    replace_attestation(signed, envelope, keys["alice"][0])
    [check] = failed(run_verify(signed, keys["alice"][1]), "attestation")
    assert "not signed by a trusted key" in check.detail


def test_a_signature_over_the_payload_without_pae_is_refused(signed, keys):
    envelope = sign_crafted(statement_of(envelope_of(signed)), keys["alice"][0], raw=True)
    replace_attestation(signed, envelope, keys["alice"][0])
    assert failed(run_verify(signed, keys["alice"][1]), "attestation")


def test_another_payload_type_is_refused(signed, keys):
    envelope = envelope_of(signed)
    envelope["payloadType"] = "application/json"
    replace_attestation(signed, envelope, keys["alice"][0])
    report = run_verify(signed, keys["alice"][1])
    assert "payloadType" in failed(report, "content")[0].detail


def test_non_canonical_base64_is_refused(signed, keys):
    """The same bytes under another spelling (non-zero padding bits) would let the file change
    while its DSSE signature still verifies."""
    envelope = envelope_of(signed)
    raw = base64.b64decode(envelope["payload"])
    if len(raw) % 3 == 0:  # no padding to hide bits in: one byte more (base64 is read first)
        raw += b" "
    payload = base64.b64encode(raw).decode("ascii")
    assert payload.endswith("=")
    stripped = payload.rstrip("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(stripped[-1])
    tweaked = stripped[:-1] + alphabet[last ^ 1] + payload[len(stripped):]  # an unused bit
    assert tweaked != payload and base64.b64decode(tweaked) == base64.b64decode(payload)
    envelope["payload"] = tweaked
    with pytest.raises(cubepack.FormatError, match="base64"):
        envelope_format.parse_envelope(envelope, ATT)


def test_duplicate_keys_in_the_payload_are_refused(signed, keys):
    statement = statement_of(envelope_of(signed))
    text = canonical.dumps(statement, compact=True)
    dup = text[:-1] + ',"predicateType":"x"}'
    envelope = envelope_of(signed)
    envelope["payload"] = base64.b64encode(dup.encode()).decode()
    with pytest.raises(cubepack.FormatError, match="strict JSON"):
        envelope_format.parse_envelope(envelope, ATT)


def test_huge_and_deeply_nested_attestations_fail_the_content_check(signed, keys):
    (signed / ATT).write_bytes(b"[" * 100_000 + b"]" * 100_000)
    report = run_verify(signed, keys["alice"][1])
    assert failed(report, "content") and not report.ok
    with open(signed / ATT, "wb") as handle:
        handle.truncate(envelope_format.MAX_ENVELOPE_BYTES + 1)
    report = run_verify(signed, keys["alice"][1])
    assert "larger than" in failed(report, "content")[0].detail


def test_a_symlink_named_like_the_attestation_is_refused(signed, other_packed, tmp_path, keys):
    other = copy_of(other_packed, tmp_path / "o")
    write_signature(other, keys["alice"][0])
    (signed / ATT).unlink()
    (signed / ATT).symlink_to(other / ATT)
    report = run_verify(signed, keys["alice"][1])
    assert not report.ok and failed(report, "path")
    report = cubepack.verify(signed, raise_on_failure=False)  # no keys: still not skipped
    assert not report.ok


def test_a_trusted_key_on_another_curve_is_a_usage_error(signed, keys, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    k1 = ec.generate_private_key(ec.SECP521R1()).public_key()
    path = tmp_path / "p521.pub.pem"
    path.write_bytes(k1.public_bytes(serialization.Encoding.PEM,
                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    for pub in (path, keys["ed"][1]):
        with pytest.raises(cubepack.UsageError, match="P-256 or P-384"):
            cubepack.verify(signed, trusted_keys=[pub], require_lineage=True,
                            raise_on_failure=False)


def test_a_p384_attestation_verifies_and_a_p256_key_does_not_accept_it(cube, keys):
    write_signature(cube, keys["bob"][0])
    assert run_verify(cube, keys["bob"][1], require_lineage=True).ok
    assert failed(run_verify(cube, keys["alice"][1]), "signature")


def test_require_lineage_with_a_missing_attestation_is_a_refusal(signed, keys):
    (signed / ATT).unlink()
    _resign_without_attestation(signed, keys["alice"][0])
    report = run_verify(signed, keys["alice"][1], require_lineage=True)
    [check] = failed(report, "attestation")
    assert check.found == "absent"
    assert failed(report, "lineage")


def _resign_without_attestation(cube, key):
    from cubepack.trust import _signing

    real_attest, real_write = _signing.attest, _signing.atomic.write_bytes
    _signing.attest = lambda *a, **k: b"{}"
    try:
        manifest = _signing._manifest_from_lock  # sign exactly the lock's files
        _signing._manifest_from_lock = lambda cube, h, lb, extra: manifest(cube, h, lb, {})
        _signing.atomic.write_bytes = lambda path, data: None
        write_signature(cube, key)
    finally:
        _signing.attest, _signing._manifest_from_lock = real_attest, manifest
        _signing.atomic.write_bytes = real_write


def test_require_lineage_without_a_trusted_key_is_a_usage_error(signed):
    with pytest.raises(cubepack.UsageError, match="trusted"):
        cubepack.verify(signed, require_lineage=True)


# --- stale attestations --------------------------------------------------------------------------

def test_a_re_pack_that_changes_the_cube_drops_the_attestation(signed, keys):
    (signed / "notes.txt").write_text("a new file\n")
    cubepack.pack(signed)
    assert not (signed / ATT).exists() and not (signed / constants.SIGNATURE_FILENAME).exists()


def test_a_re_pack_that_changes_nothing_keeps_a_valid_attestation(signed, keys):
    before = (signed / ATT).read_bytes()
    cubepack.pack(signed)
    assert (signed / ATT).read_bytes() == before
    assert run_verify(signed, keys["alice"][1], require_lineage=True).ok


def test_re_signing_with_another_key_replaces_the_attestation(signed, keys):
    cubepack.sign(signed, keys["bob"][0])
    assert run_verify(signed, keys["bob"][1], require_lineage=True).ok
    assert failed(run_verify(signed, keys["alice"][1]), "attestation")


# --- chains -------------------------------------------------------------------------------------

@pytest.fixture
def family(signed, tmp_path, keys):
    """root (signed) -> child -> grandchild, each signed by alice."""
    child = derive(signed, tmp_path / "child", keys["alice"][0])
    grandchild = derive(child, tmp_path / "grandchild", keys["alice"][0])
    return signed, child, grandchild


def test_a_genuine_chain_verifies_link_by_link(family, keys):
    _, _, grandchild = family
    report = run_verify(grandchild, keys["alice"][1], require_lineage=True)
    assert report.ok, [c.to_dict() for c in report.failures]
    assert [c.ok for c in checks(report, "lineage")] == [True, True]


def test_a_chain_that_skips_a_generation_is_refused(family, tmp_path, keys):
    root, child, _ = family
    skipped = derive(child, tmp_path / "skip", keys["alice"][0],
                     ancestors=[envelope_of(root)])
    [check] = failed(run_verify(skipped, keys["alice"][1], require_lineage=True), "lineage")
    assert "lock_digest" in check.expected


def test_a_link_with_the_right_lock_digest_but_another_content_digest_is_refused(family,
                                                                                 tmp_path, keys):
    root, _, _ = family
    forged = derive(root, tmp_path / "forged", keys["alice"][0],
                    parent_link={"content_digest": "0" * 64})
    [check] = failed(run_verify(forged, keys["alice"][1], require_lineage=True), "lineage")
    assert "content_digest" in check.detail


def test_an_ancestor_by_an_untrusted_key_is_refused(signed, tmp_path, keys):
    other = copy_of(signed, tmp_path / "eve-root")
    write_signature(other, keys["eve"][0])
    child = derive(other, tmp_path / "child", keys["alice"][0])
    [check] = failed(run_verify(child, keys["alice"][1], require_lineage=True), "lineage")
    assert "not signed by a trusted key" in check.detail


def test_a_root_that_claims_a_parent_stops_before_a_root(signed, tmp_path, keys):
    statement = statement_of(envelope_of(signed))
    statement["predicate"]["signer"]["step"] = "migrate"
    statement["predicate"]["proved"]["lineage"] = {
        "parent": {"lock_digest": "1" * 64, "content_digest": "2" * 64, "cube_id": None},
        "changes": {}}
    claims = sign_crafted(statement, keys["alice"][0])
    child = derive(signed, tmp_path / "child", keys["alice"][0], ancestors=[claims])
    [check] = failed(run_verify(child, keys["alice"][1], require_lineage=True), "lineage")
    assert "stops before a root" in check.detail


def test_an_envelope_after_the_root_and_a_cycle_are_refused(family, tmp_path, keys):
    root, child, _ = family
    extra = derive(child, tmp_path / "extra", keys["alice"][0],
                   ancestors=[envelope_of(child), envelope_of(root), envelope_of(child)])
    [check] = failed(run_verify(extra, keys["alice"][1], require_lineage=True), "lineage")
    assert "follows the root" in check.detail
    # a cycle: a (crafted, trusted) envelope A whose parent is B, and B whose parent is A
    a, b = statement_of(envelope_of(root)), statement_of(envelope_of(root))
    a["predicate"]["cube"]["lock_digest"] = "a" * 64
    b["predicate"]["cube"]["lock_digest"] = "b" * 64
    link = {"content_digest": a["predicate"]["cube"]["content_digest"], "cube_id": None}
    for one, other in ((a, "b"), (b, "a")):
        one["predicate"]["signer"]["step"] = "migrate"
        one["predicate"]["proved"]["lineage"] = {"parent": {**link, "lock_digest": other * 64},
                                                 "changes": {}}
    ea, eb = sign_crafted(a, keys["alice"][0]), sign_crafted(b, keys["alice"][0])
    cyc = derive(root, tmp_path / "cycle", keys["alice"][0], ancestors=[ea, eb] * 3,
                 parent_link={"lock_digest": "a" * 64})
    report = run_verify(cyc, keys["alice"][1], require_lineage=True)
    assert not report.ok and "stops before a root" in failed(report, "lineage")[0].detail


def test_a_loop_back_to_the_child_is_refused(family, tmp_path, keys):
    root, child, _ = family
    looped = derive(root, tmp_path / "loop", keys["alice"][0],
                    ancestors=[envelope_of(child), envelope_of(root)])
    assert failed(run_verify(looped, keys["alice"][1], require_lineage=True), "lineage")


def test_a_missing_ancestors_file_is_refused(family, keys):
    _, child, _ = family
    (child / ANC).unlink()
    lock = json.loads((child / constants.LOCK_FILENAME).read_text())
    del lock["files"][ANC]
    new = lockfile.build_lock(cube_id=lock["cube_id"], files=lock["files"],
                              models=lock["models"], activations=lock["activations"],
                              cubepack_version=lock["cubepack_version"],
                              lineage=lock["lineage"])
    (child / constants.LOCK_FILENAME).write_text(lockfile.dumps(new))
    write_signature(child, keys["alice"][0])
    [check] = failed(run_verify(child, keys["alice"][1], require_lineage=True), "lineage")
    assert check.found == "absent"


def test_json_says_signed_only_for_what_a_trusted_key_signed(family, keys):
    _, child, _ = family
    report = run_verify(child, keys["eve"][1], require_lineage=True)
    assert not report.ok
    for check in checks(report, "attestation") + checks(report, "lineage"):
        if check.basis == "signed":
            assert "trusted key" in check.detail and str(keys["eve"][1]) in check.detail


# --- the CLI ------------------------------------------------------------------------------------

def cli(*args):
    done = subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ))
    if "--json" not in args:
        return done.returncode, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is (done.returncode == 0), done.stdout + done.stderr
    return done.returncode, data


def test_cli_require_lineage_outcomes_are_one_json_object(family, keys):
    _, child, _ = family
    code, data = cli("verify", child, "--require-lineage", "--json")
    assert code == 2 and data["error"]["type"] == "UsageError"
    code, data = cli("verify", child, "--require-lineage", "--trusted-key", keys["eve"][1],
                     "--json")
    assert code == 1 and not data["ok"]
    code, data = cli("verify", child, "--require-lineage", "--trusted-key", keys["ed"][1],
                     "--json")
    assert code == 2 and data["error"]["type"] == "UsageError"
    code, data = cli("verify", child, "--require-lineage", "--trusted-key", keys["alice"][1],
                     "--json")
    assert code == 0 and data["attested_by"] == str(keys["alice"][1])


# --- through pull, from the local endpoint --------------------------------------------------------

TOKEN = "writer-token"


@pytest.fixture
def hub(tmp_path):
    from cubepack.testing.hub import InstrumentedHub

    with InstrumentedHub(tmp_path / "hub-root", tokens=[TOKEN]) as server:
        yield server


def publish(hub, folder, repo):
    """Commit ``folder`` as is (a hostile publisher: no cubepack checks)."""
    from cubepack.testing.hub import upload_folder

    return upload_folder(hub.url, repo, folder, repo_type="dataset", token=TOKEN)


def pull_it(hub, repo, target, tmp_path, **options):
    from cubepack.hub import pull

    return pull(repo, endpoint=hub.url, token=TOKEN, local_dir=target,
                cache_dir=tmp_path / "hf-cache", **options)


def test_pull_require_lineage_accepts_a_genuine_chain(hub, family, tmp_path, keys):
    _, _, grandchild = family
    publish(hub, grandchild, "ns/gc")
    result = pull_it(hub, "ns/gc", tmp_path / "out", tmp_path, trusted_keys=[keys["alice"][1]],
                     require_lineage=True)
    assert result.report.ok and result.report.attested_by == str(keys["alice"][1])
    assert (tmp_path / "out" / ATT).read_bytes() == (grandchild / ATT).read_bytes()


@pytest.mark.parametrize("attack", ["no attestation", "moved attestation", "untrusted parent",
                                    "skipped generation"])
def test_pull_require_lineage_refuses_a_forged_chain_and_places_nothing(hub, family, tmp_path,
                                                                        keys, attack):
    root, child, grandchild = family
    forged = tmp_path / "forged"
    if attack == "no attestation":
        shutil.copytree(child, forged)
        (forged / ATT).unlink()
        (forged / constants.SIGNATURE_FILENAME).unlink()
    elif attack == "moved attestation":
        shutil.copytree(child, forged)
        shutil.copy(grandchild / ATT, forged / ATT)
    elif attack == "untrusted parent":
        eve_root = copy_of(root, tmp_path / "eve")
        write_signature(eve_root, keys["eve"][0])
        derive(eve_root, forged, keys["alice"][0])
    else:
        derive(child, forged, keys["alice"][0], ancestors=[envelope_of(root)])
    publish(hub, forged, "ns/forged")
    with pytest.raises(cubepack.VerificationFailed) as caught:
        pull_it(hub, "ns/forged", tmp_path / "out", tmp_path, trusted_keys=[keys["alice"][1]],
                require_lineage=True)
    refused = {c.name for c in caught.value.report.failures}
    assert refused & {"attestation", "lineage"}, refused
    assert not (tmp_path / "out").exists()


def test_pull_require_lineage_without_a_key_or_with_no_verify_is_a_usage_error(hub, signed,
                                                                                tmp_path, keys):
    publish(hub, signed, "ns/c")
    with pytest.raises(cubepack.UsageError, match="trusted"):
        pull_it(hub, "ns/c", tmp_path / "out", tmp_path, require_lineage=True)
    with pytest.raises(cubepack.UsageError, match="no-verify"):
        pull_it(hub, "ns/c", tmp_path / "out", tmp_path, trusted_keys=[keys["alice"][1]],
                require_lineage=True, verify_cube=False)
    assert not (tmp_path / "out").exists()


def test_the_hook_refuses_require_lineage_without_keys(monkeypatch):
    from cubepack.memos import _hook

    with pytest.raises(cubepack.UsageError, match="trusted"):
        _hook.install(require_lineage=True)
    monkeypatch.setenv("CUBEPACK_MEMOS_REQUIRE_LINEAGE", "1")
    monkeypatch.delenv("CUBEPACK_MEMOS_TRUSTED_KEYS", raising=False)
    with pytest.raises(cubepack.UsageError, match="trusted"):
        _hook._from_environment()


def test_a_hostile_keyid_is_never_echoed_raw(signed, keys):
    """keyids are the envelope author's text: a newline or escape in one must not forge a line
    of the report."""
    envelope = envelope_of(signed)
    envelope["signatures"][0]["keyid"] = "\nok   attestation\x1b[2J"
    envelope["signatures"][0]["sig"] = base64.b64encode(b"\x30\x00").decode()
    replace_attestation(signed, envelope, keys["alice"][0])
    [check] = failed(run_verify(signed, keys["alice"][1]), "attestation")
    assert "\n" not in check.found and "\x1b" not in check.found
    code, text = cli("verify", signed, "--trusted-key", keys["alice"][1])
    assert code == 1 and "\x1b" not in text
    assert not any(line.startswith("ok   attestation") for line in text.splitlines())


def test_a_signature_by_an_untrusted_key_is_not_reported_as_signed(signed, keys):
    report = run_verify(signed, keys["eve"][1])
    [check] = failed(report, "signature")
    assert check.basis == "proved" and report.signed_by is None


def test_cli_pull_and_sign_refusals_are_one_json_object(signed, keys):
    code, data = cli("pull", "ns/nowhere", "--require-lineage", "--json")
    assert code == 2 and "trusted" in data["error"]["message"]
    before = (signed / ATT).read_bytes()
    code, data = cli("sign", signed, "--key", keys["ed"][0], "--json")
    assert code == 2 and data["error"]["type"] == "UsageError"
    assert (signed / ATT).read_bytes() == before


def test_model_signings_own_envelope_signed_by_the_same_key_is_not_an_attestation(signed, keys):
    """cubepack.sig holds a DSSE envelope of the same payloadType, signed by the same key over
    the same PAE: only the statement's exact layout and predicateType tell them apart."""
    lifted = json.loads((signed / constants.SIGNATURE_FILENAME).read_text())["dsseEnvelope"]
    assert lifted["payloadType"] == envelope_format.PAYLOAD_TYPE
    lifted["signatures"][0]["keyid"] = "k"
    with pytest.raises(cubepack.FormatError):
        envelope_format.parse_envelope(lifted, ATT)
    replace_attestation(signed, lifted, keys["alice"][0])
    assert failed(run_verify(signed, keys["alice"][1], require_lineage=True), "content")


def test_a_link_with_the_right_digests_but_another_cube_id_is_refused(family, tmp_path, keys):
    """The child's lineage says it descends from bank/official; the envelope its digests name
    attests another cube id: the link must not verify."""
    root, _, _ = family
    forged = derive(root, tmp_path / "forged", keys["alice"][0],
                    parent_link={"cube_id": "bank/official"})
    [check] = failed(run_verify(forged, keys["alice"][1], require_lineage=True), "lineage")
    assert "cube_id" in check.detail and "bank/official" in check.expected


def test_install_require_lineage_without_keys_changes_nothing():
    from cubepack import memos

    assert memos.settings() is None
    with pytest.raises(cubepack.UsageError, match="trusted"):
        memos.install(require_lineage=True)
    assert memos.settings() is None and not memos.installed()


def test_the_memos_loader_refuses_a_forged_chain_before_memos_reads_it(family, tmp_path, keys):
    pytest.importorskip("memos", reason="the real MemoryOS (the memos environment)")
    from cubepack import memos

    root, _, _ = family
    forged = derive(root, tmp_path / "forged", keys["alice"][0],
                    parent_link={"content_digest": "0" * 64})
    with pytest.raises(cubepack.VerificationFailed) as caught:
        memos.init_from_dir(forged, trusted_keys=[keys["alice"][1]], require_lineage=True)
    assert {c.name for c in caught.value.report.failures} == {"lineage"}


@pytest.mark.parametrize("how", ["sign", "pack --sign-key"])
def test_signing_never_writes_through_a_symlink_named_like_the_attestation(signed, tmp_path,
                                                                           keys, how):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (signed / ATT).unlink()
    (signed / ATT).symlink_to(victim)
    with pytest.raises(cubepack.CubepackError):
        if how == "sign":
            cubepack.sign(signed, keys["alice"][0])
        else:
            cubepack.pack(signed, sign_key=keys["alice"][0])
    assert victim.read_text() == "precious\n" and (signed / ATT).is_symlink()


def test_a_symlinked_ancestors_file_is_refused(family, tmp_path, keys):
    _, child, _ = family
    real = tmp_path / "elsewhere.json"
    shutil.move(child / ANC, real)
    (child / ANC).symlink_to(real)
    report = run_verify(child, keys["alice"][1], require_lineage=True)
    assert failed(report, "path") and not report.ok


def test_a_chain_across_curves_verifies_with_both_keys_and_not_with_one(cube, tmp_path, keys):
    write_signature(cube, keys["bob"][0])  # the root on P-384
    child = derive(cube, tmp_path / "child", keys["alice"][0])  # the child on P-256
    both = cubepack.verify(child, trusted_keys=[keys["alice"][1], keys["bob"][1]],
                           require_lineage=True, raise_on_failure=False)
    assert both.ok, [c.to_dict() for c in both.failures]
    [check] = failed(run_verify(child, keys["alice"][1], require_lineage=True), "lineage")
    assert check.basis == "proved" and "not signed by a trusted key" in check.detail


def test_an_empty_folder_named_like_the_attestation_is_refused_before_signing(cube, keys):
    (cube / ATT).mkdir()
    code, data = cli("sign", cube, "--key", keys["alice"][0], "--json")
    assert code in (1, 2) and not data["ok"], data
    assert not (cube / constants.SIGNATURE_FILENAME).exists() and (cube / ATT).is_dir()
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]], require_lineage=True,
                             raise_on_failure=False)
    assert not report.ok


@pytest.mark.parametrize("name", [ATT, constants.SIGNATURE_FILENAME])
def test_pack_sign_key_refuses_a_folder_where_it_writes_and_changes_nothing(cube, keys, name):
    (cube / constants.SIGNATURE_FILENAME).unlink(missing_ok=True)
    (cube / name).mkdir()
    with pytest.raises(cubepack.UnsafeInputError, match="is a folder"):
        cubepack.pack(cube, sign_key=keys["alice"][0])
    assert not (cube / ATT).is_file() and not (cube / constants.SIGNATURE_FILENAME).is_file()


def test_duplicate_keys_and_deep_nesting_anywhere_are_format_errors(signed):
    good = (signed / ATT).read_text()
    envelope = envelope_of(signed)
    evil = base64.b64encode(b'{"a": 1}').decode()
    doubled = good.rstrip().rstrip("}") + f', "payload": "{evil}"}}'
    with pytest.raises(cubepack.FormatError, match="repeats the key 'payload'"):
        envelope_format.parse_envelope_bytes(doubled.encode(), ATT)
    with pytest.raises(cubepack.FormatError, match="repeats the key 'envelopes'"):
        envelope_format._loads(b'{"envelopes": [], "envelopes": []}', ANC)
    envelope["payload"] = base64.b64encode(b"[" * 50_000 + b"]" * 50_000).decode()
    with pytest.raises(cubepack.FormatError, match="nesting"):
        envelope_format.parse_envelope(envelope, ATT)


def test_stock_model_signing_accepts_a_derived_cube_and_refuses_a_swapped_attestation(family,
                                                                                      keys):
    from pathlib import Path

    _, child, grandchild = family
    stock = Path(sys.executable).with_name("model_signing")

    def stock_verify(cube):
        return subprocess.run([str(stock), "verify", "key", str(cube), "--signature",
                               str(cube / constants.SIGNATURE_FILENAME), "--public_key",
                               str(keys["alice"][1])], capture_output=True, text=True,
                              check=False, timeout=300)

    done = stock_verify(grandchild)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.copy(child / ATT, grandchild / ATT)
    assert stock_verify(grandchild).returncode != 0


@pytest.mark.parametrize("field", ["producers", "recomputed"])
def test_a_hostile_name_inside_a_payload_is_quoted_in_the_refusal(signed, field):
    """Role and item names in a payload are its author's text; the content check (which runs
    on every verify, keys or not) must not print them raw."""
    envelope = envelope_of(signed)
    statement = statement_of(envelope)
    hostile = "x\nok   attestation \x1b[2J"
    if field == "producers":
        statement["predicate"]["proved"]["producers"][hostile] = {"bad": 1}
    else:
        statement["predicate"]["proved"]["recomputed"][hostile] = {"bad": 1}
    envelope["payload"] = base64.b64encode(canonical.dumps(statement).encode()).decode()
    (signed / ATT).write_bytes(envelope_format.envelope_bytes(envelope))
    [check] = failed(cubepack.verify(signed, raise_on_failure=False), "content")
    assert "\n" not in check.detail and "\x1b" not in check.detail


def test_a_re_pack_of_a_derived_cube_keeps_its_lineage_as_a_claim(family, keys):
    """A re-pack (to sign an edit, say) keeps the lock's lineage, but did not derive it: signed
    by pack, the lineage is a claim, and --require-lineage says so and what derives it."""
    _, child, _ = family
    (child / "notes.txt").write_text("edited after migrate\n")
    cubepack.pack(child, sign_key=keys["alice"][0])
    assert "lineage" in json.loads((child / constants.LOCK_FILENAME).read_text())
    report = run_verify(child, keys["alice"][1], require_lineage=True)
    [check] = failed(report, "lineage")
    assert "as a claim" in check.detail and "cubepack migrate PARENT" in check.detail
    assert [c.name for c in report.failures] == ["lineage"]
