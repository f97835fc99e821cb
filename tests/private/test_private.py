"""Private cubes (issue #32): encrypted to recipients, verified by anyone, opened by them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import cubepack
from cubepack import VerificationFailed
from cubepack._util import constants
from cubepack.errors import RefusedError, UnsafeInputError, UsageError
from cubepack.format import _fileset as fileset
from cubepack.ops._encrypt import encrypt, rekey
from cubepack.ops._private import open_private

from helpers import make_key


def private_copy(packed, tmp_path, agekeys, *names, **options):
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    encrypt(cube, [agekeys[name][1] for name in names or ("alice",)], **options)
    return cube


def test_every_file_becomes_a_ciphertext_and_the_lock_lists_them(packed, tmp_path, agekeys):
    clear_lock = json.loads((packed / constants.LOCK_FILENAME).read_text())
    cube = private_copy(packed, tmp_path, agekeys)
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["lock_version"] == 5 and lock["activations"] == {}
    section = lock["encryption"]
    assert section["version"] == 3 and section["counts"]["activations"] == len(
        clear_lock["activations"])
    assert section["generation"] == 1  # encrypt starts it; each rekey adds one
    assert len(section["series"]) == 32  # which private cube this is: encrypt draws it
    expected = {name + ".age" for name in [*clear_lock["files"], constants.LOCK_FILENAME]}
    assert set(section["ciphertexts"]) == expected
    on_disk = {p.relative_to(cube).as_posix() for p in cube.rglob("*") if p.is_file()}
    assert on_disk == expected | {fileset.PRIVATE_MANIFEST, constants.LOCK_FILENAME,
                                  constants.CONFIG_FILENAME, constants.CARD_FILENAME}
    for name in expected:
        assert (cube / name).read_bytes().startswith(b"age-encryption.org/v1\n")


def test_verify_without_a_key_checks_structure_and_says_what_it_did_not(packed, tmp_path,
                                                                         agekeys):
    cube = private_copy(packed, tmp_path, agekeys)
    report = cubepack.verify(cube)
    [private] = [c for c in report.checks if c.name == "private"]
    assert report.ok and private.ok is None and "--identity" in private.detail
    # Each check it could not run says why: the KV files are encrypted (not "failed above").
    for name in ("kv header", "kv checksums"):
        [skipped] = [c for c in report.checks if c.name == name]
        assert skipped.ok is None and "encrypted" in skipped.detail, skipped
    with pytest.raises(VerificationFailed, match="recompute"):
        cubepack.verify(cube, recompute=True)


def test_verify_with_a_key_runs_every_clear_check(packed, tmp_path, agekeys, zoo):
    cube = private_copy(packed, tmp_path, agekeys, "alice", "bob")
    # The fixture's caches record no token ids: recompute refuses them, clear or private alike.
    clear = cubepack.verify(packed, model=str(zoo["a"]), recompute=True, raise_on_failure=False)
    report = cubepack.verify(cube, model=str(zoo["a"]), recompute=True,
                             decrypt_with=agekeys["bob"][0], raise_on_failure=False)
    assert [str(c) for c in report.failures] == [str(c) for c in clear.failures]
    assert [c for c in report.checks if c.name == "private"][0].ok is True
    names = lambda r: sorted({(c.name, str(c.ok)) for c in r.checks if c.name not in (  # noqa: E731
        "private", "signature", "attestation")})
    assert set(names(clear)) <= set(names(report)) and ("kv header", "True") in names(report)
    assert report.private_lock.digest == json.loads(
        (packed / constants.LOCK_FILENAME).read_text())["digest"]


def test_a_key_that_is_not_a_recipient_is_named_as_such(packed, tmp_path, agekeys):
    cube = private_copy(packed, tmp_path, agekeys)
    report = cubepack.verify(cube, decrypt_with=agekeys["mallory"][0], raise_on_failure=False)
    [private] = [c for c in report.checks if c.name == "private"]
    assert private.ok is False and "not encrypted to the identity given" in private.detail
    with pytest.raises(RefusedError):
        with open_private(cube, agekeys["mallory"][0]):
            pass


def test_an_identity_file_readable_by_others_is_refused(packed, tmp_path, agekeys):
    cube = private_copy(packed, tmp_path, agekeys)
    loose = tmp_path / "loose.key"
    shutil.copyfile(agekeys["alice"][0], loose)
    os.chmod(loose, 0o644)
    with pytest.raises(UnsafeInputError, match="chmod 600"):
        with open_private(cube, loose):
            pass
    # The reader's own key file is at fault, not the cube: typed so, even when failures are
    # returned rather than raised, and before any check of the cube (issue #32).
    with pytest.raises(UnsafeInputError, match="chmod 600") as refused:
        cubepack.verify(cube, decrypt_with=loose, raise_on_failure=False)
    assert not refused.value.report.ok


def test_hidden_names_carry_no_item_id(packed, tmp_path, agekeys):
    cube = private_copy(packed, tmp_path, agekeys, hide_names=True)
    clear_lock = json.loads((packed / constants.LOCK_FILENAME).read_text())
    public = (cube / constants.LOCK_FILENAME).read_text()
    for item in clear_lock["activations"]:
        assert item not in public
        assert not any(item in p.name for p in cube.rglob("*"))
    assert cubepack.verify(cube, decrypt_with=agekeys["alice"][0]).ok


def test_an_ssh_key_is_a_recipient_and_an_identity(packed, tmp_path, agekeys):
    if "ssh" not in agekeys:
        pytest.skip("no ssh-keygen")
    cube = private_copy(packed, tmp_path, agekeys, "ssh")
    assert cubepack.verify(cube, decrypt_with=agekeys["ssh"][0]).ok


def test_a_signed_cube_refuses_a_swapped_ciphertext(packed, tmp_path, agekeys):
    pytest.importorskip("model_signing")
    from cubepack.trust import _age as age

    private, public = make_key(tmp_path, "signer")
    cube = private_copy(packed, tmp_path, agekeys, sign_key=private)
    assert cubepack.verify(cube, trusted_keys=[public]).ok
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    target = next(n for n in lock["encryption"]["ciphertexts"] if "activations/" in n)
    # Another valid encryption to the same recipient, of the same plaintext with one byte
    # changed: every age check passes, the signed lock's size and sha256 do not (the age crate
    # adds a random "grease" stanza, so even the sizes differ).
    plain = bytearray(age.decrypt((cube / target).read_bytes(),
                                  age.load_identities(agekeys["alice"][0]), target))
    plain[-1] ^= 1
    (cube / target).write_bytes(age.encrypt(bytes(plain),
                                            age.parse_recipients([agekeys["alice"][1]])))
    with pytest.raises(VerificationFailed, match="size differs|sha256"):
        cubepack.verify(cube, trusted_keys=[public], decrypt_with=agekeys["alice"][0])


def test_rekey_adds_and_removes_recipients(packed, tmp_path, agekeys):
    pytest.importorskip("model_signing")
    owner, owner_pub = make_key(tmp_path, "owner")
    cube = private_copy(packed, tmp_path, agekeys, "alice", sign_key=owner)
    # The cube's own recipients are kept only when a trusted key signed them.
    result = rekey(cube, agekeys["alice"][0], add=[agekeys["bob"][1]],
                   remove=[agekeys["alice"][1]], trusted_keys=[owner_pub])
    assert result.added == [agekeys["bob"][1]] and result.signed_with is None
    assert result.removed == [agekeys["alice"][1]] and result.generation == 2
    assert cubepack.verify(cube, decrypt_with=agekeys["bob"][0]).ok
    report = cubepack.verify(cube, decrypt_with=agekeys["alice"][0], raise_on_failure=False)
    assert not report.ok
    # Unsigned now: only a rekey naming every recipient (--to) is accepted.
    result = rekey(cube, agekeys["bob"][0], to=[agekeys["bob"][1], agekeys["alice"][1]])
    assert result.added == [agekeys["alice"][1]] and result.generation == 3
    assert result.readded == [{"recipient": agekeys["alice"][1], "removed_at": 2}]
    with pytest.raises(UsageError, match="--to names every recipient"):
        rekey(cube, agekeys["bob"][0], to=[agekeys["bob"][1]], add=[agekeys["alice"][1]])
    signed = private_copy(packed, tmp_path / "signed", agekeys, "bob", sign_key=owner)
    with pytest.raises(UsageError, match="nobody can open"):
        rekey(signed, agekeys["bob"][0], remove=[agekeys["bob"][1]], sign_key=owner)


def test_rekey_that_changes_no_recipient_writes_nothing(packed, tmp_path, agekeys):
    """Adding a recipient the cube already has would rewrite every file (and re-upload the
    whole cube on the next push) for nothing: refused, the cube untouched; --rotate is the way
    to new file keys for the same readers."""
    pytest.importorskip("model_signing")
    owner, owner_pub = make_key(tmp_path, "owner")
    cube = private_copy(packed, tmp_path, agekeys, "alice", sign_key=owner)
    trusted = {"trusted_keys": [owner_pub]}
    before = {p.relative_to(cube): p.read_bytes() for p in cube.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match=r"1 recipient\(s\) would stay as they are.*--rotate"):
        rekey(cube, agekeys["alice"][0], add=[agekeys["alice"][1]], **trusted)
    with pytest.raises(UsageError, match="would stay as they are"):  # add and remove the same
        rekey(cube, agekeys["alice"][0], add=[agekeys["alice"][1]],
              remove=[agekeys["alice"][1]], **trusted)
    with pytest.raises(UsageError, match="would stay as they are"):  # the same set, named
        rekey(cube, agekeys["alice"][0], to=[agekeys["alice"][1]])
    assert {p.relative_to(cube): p.read_bytes() for p in cube.rglob("*") if p.is_file()} == before
    rekey(cube, agekeys["alice"][0], add=[agekeys["alice"][1]], rotate=True, **trusted)
    assert (cube / fileset.PRIVATE_MANIFEST).read_bytes() != before[Path(fileset.PRIVATE_MANIFEST)]


def test_rekey_re_signs_only_a_signature_it_can_check(packed, tmp_path, agekeys):
    pytest.importorskip("model_signing")
    from cubepack.errors import SignatureError

    owner, owner_pub = make_key(tmp_path, "owner")
    other, other_pub = make_key(tmp_path, "other")
    cube = private_copy(packed, tmp_path, agekeys, sign_key=owner)
    with pytest.raises(SignatureError, match="--trusted-key"):
        rekey(cube, agekeys["alice"][0], add=[agekeys["bob"][1]], sign_key=other)
    result = rekey(cube, agekeys["alice"][0], add=[agekeys["bob"][1]], sign_key=other,
                   trusted_keys=[owner_pub])
    assert result.signed_with == str(other)
    assert cubepack.verify(cube, trusted_keys=[other_pub]).ok
    rekey(cube, agekeys["alice"][0], rotate=True, sign_key=other)  # its own signature: fine
    rekey(cube, agekeys["alice"][0], rotate=True, trusted_keys=[other_pub])  # unsigned now
    with pytest.raises(SignatureError, match="unsigned"):
        rekey(cube, agekeys["alice"][0], rotate=True, sign_key=other)


def test_pack_migrate_and_upgrade_never_rebuild_a_private_cube_as_a_clear_one(packed, tmp_path,
                                                                               agekeys, zoo):
    cube = private_copy(packed, tmp_path, agekeys)
    before = {p.name: p.read_bytes() for p in cube.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="private cube"):
        cubepack.pack(cube)
    with pytest.raises(UsageError, match="private cube"):
        cubepack.migrate(cube, out=tmp_path / "migrated", model=str(zoo["a"]))
    with pytest.raises(UsageError, match="private cube: upgrade rewrites KV files"):
        cubepack.upgrade(cube, model=str(zoo["a"]))
    assert {p.name: p.read_bytes() for p in cube.rglob("*") if p.is_file()} == before


def test_a_private_lock_holds_nothing_private_in_clear():
    """The lock's own rule: a private lock beside activation entries, adapters, lineage or a
    vectors record (whose sample names memories) is refused."""
    from cubepack.format import _lock as lockfile

    files = {"a.age": {"sha256": "0" * 64, "size": 1},
             fileset.PRIVATE_MANIFEST: {"sha256": "1" * 64, "size": 1}}
    encryption = {"version": 1, "scheme": lockfile.ENCRYPTION_SCHEME,
                  "manifest": fileset.PRIVATE_MANIFEST, "ciphertexts": ["a.age"],
                  "counts": {"files": 1, "activations": 0, "adapters": 0, "recipients": 1},
                  "hidden_names": False}
    good = lockfile.build_lock(cube_id="x/y", files=files, models={}, activations={},
                               cubepack_version="t", encryption=encryption)
    assert lockfile.parse(lockfile.dumps(good).encode()).version == 5
    vectors = {"e": {"name": "e", "vectors": {"file": "v", "dimension": 1, "count": 1,
                                              "sample": ["secret-id"]}}}
    for bad in (dict(models=vectors), dict(lineage={"parent": {}}),
                dict(encryption={**encryption, "version": 3}),
                dict(encryption={**encryption, "version": 2}),  # and no generation
                dict(files={**files, "b.age": {"sha256": "2" * 64, "size": 1}})):
        arguments = dict(cube_id="x/y", files=files, models={}, activations={},
                         cubepack_version="t", encryption=encryption) | bad
        lock = lockfile.build_lock(**arguments)
        with pytest.raises(cubepack.FormatError):
            lockfile.parse(lockfile.dumps(lock).encode())


#: Every CLI command, and what it writes of a private cube's memories (issue #37 item 1): a
#: writer of memories is given a private cube (or one of its KV files) and must refuse naming
#: it, writing nothing; the others write no plaintext (``encrypted``: only ciphertexts).
CLI_WRITERS = {
    "pack": "refuses", "compact": "refuses", "migrate": "refuses", "upgrade": "refuses", "export mlx": "refuses",
    "export llamacpp": "refuses",
    "import mlx": "reads another runtime's clear file", "import llamacpp": "reads another "
    "runtime's clear file",
    "encrypt": "refuses", "rekey": "encrypted", "push": "encrypted", "pull": "encrypted",
    "sign": "no memory", "verify": "no memory", "inspect": "no memory", "fingerprint":
    "no memory", "diff": "no memory", "lineage": "no memory", "hub serve": "no memory",
    "hub gc": "no memory", "search": "no memory",
}


def _commands(group, prefix=""):
    import click

    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}"


def test_cubepacks_own_writers_never_write_a_private_memory_in_clear(packed, tmp_path, agekeys,
                                                                      zoo, monkeypatch):
    """Swept over every CLI command: each one that writes memories, given a private cube or
    one of its KV files (with the identity that opens it in the environment), refuses naming
    what it was given and leaves it as it was."""
    import subprocess
    import sys

    from cubepack.cli import cli

    assert set(_commands(cli)) == set(CLI_WRITERS)
    cube = private_copy(packed, tmp_path, agekeys)
    [kv] = sorted(cube.glob("activations/*.age"))[:1]
    before = {p: p.read_bytes() for p in cube.rglob("*") if p.is_file()}
    env = {**os.environ, "CUBEPACK_IDENTITY": str(agekeys["alice"][0]),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    calls = {"pack": ["pack", str(cube)], "compact": ["compact", str(cube)],
             "migrate": ["migrate", str(cube), "--model", str(zoo["a"]), "--out",
                         str(tmp_path / "out-migrate")],
             "upgrade": ["upgrade", str(cube), "--model", str(zoo["a"])],
             "upgrade file": ["upgrade", str(kv), "--model", str(zoo["a"])],
             "export mlx": ["export", "mlx", str(kv), "--out", str(tmp_path / "out.mlx")],
             "export llamacpp": ["export", "llamacpp", str(kv), "--out",
                                 str(tmp_path / "out.bin")],
             "encrypt": ["encrypt", str(cube), "--to", agekeys["bob"][1]]}
    assert {name.split(" file")[0] for name in calls} == \
        {name for name, how in CLI_WRITERS.items() if how == "refuses"}
    for name, args in calls.items():
        done = subprocess.run([sys.executable, "-m", "cubepack", *args], env=env,
                              capture_output=True, text=True, check=False)
        assert done.returncode != 0, name
        assert "private" in done.stderr or "age-encrypted" in done.stderr, (name, done.stderr)
        assert not list(tmp_path.glob("out*")), name
    assert {p: p.read_bytes() for p in cube.rglob("*") if p.is_file()} == before


def written_before_generations(cube, recipients):
    """``cube`` (private) rewritten as a cubepack of issue #32 wrote it: a version-1 manifest
    (no generation, no history) and a version-1 encryption section, the lock re-sealed."""
    import hashlib

    from cubepack._util import canonical
    from cubepack.format import _lock as lockfile
    from cubepack.trust import _age as age

    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    name = lock["encryption"]["manifest"]
    manifest = json.loads(bytes(age.decrypt((cube / name).read_bytes(), age.load_identities(
        recipients[0][0]), name)))
    old = {key: manifest[key] for key in ("format", "lock", "names", "recipients")}
    data = bytes(age.encrypt(canonical.dumps({**old, "version": 1}).encode(),
                             age.parse_recipients([public for _, public in recipients])))
    (cube / name).write_bytes(data)
    lock["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    section = {key: value for key, value in lock["encryption"].items()
               if key not in ("series", "generation")}
    (cube / constants.LOCK_FILENAME).write_text(lockfile.dumps(lockfile.build_lock(
        cube_id=lock["cube_id"], files=lock["files"], models=lock["models"], activations={},
        cubepack_version=lock["cubepack_version"], encryption={**section, "version": 1})))
    return lock


def test_a_private_cube_from_before_generations_is_still_read_and_rekeyed_into_one(
        packed, tmp_path, agekeys):
    cube = private_copy(packed, tmp_path, agekeys, "alice")
    written_before_generations(cube, [agekeys["alice"]])
    report = cubepack.verify(cube)
    [replay] = [c for c in report.checks if c.name == "replay"]
    assert report.ok and replay.ok is None and "before private cubes had generations" in \
        replay.detail
    assert cubepack.verify(cube, decrypt_with=agekeys["alice"][0]).ok
    with open_private(cube, agekeys["alice"][0]) as opened:
        assert opened.manifest["generation"] is None and opened.manifest["history"] == []
    result = rekey(cube, agekeys["alice"][0], to=[agekeys["alice"][1], agekeys["bob"][1]])
    assert result.generation == 1 and result.added == [agekeys["bob"][1]]
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["encryption"]["version"] == 3 and lock["encryption"]["generation"] == 1
    with open_private(cube, agekeys["bob"][0]) as opened:
        assert opened.manifest["history"] == [{"generation": 1, "added": [agekeys["bob"][1]],
                                               "removed": []}]


def test_a_version_2_lock_over_a_version_1_manifest_is_refused(packed, tmp_path, agekeys):
    """The generation the public lock states is the one the encrypted manifest records: a
    lock claiming a generation over a manifest without one (or another) is refused."""
    cube = private_copy(packed, tmp_path, agekeys, "alice")
    lock = written_before_generations(cube, [agekeys["alice"]])
    from cubepack.format import _lock as lockfile

    current = json.loads((cube / constants.LOCK_FILENAME).read_text())
    (cube / constants.LOCK_FILENAME).write_text(lockfile.dumps(lockfile.build_lock(
        cube_id=current["cube_id"], files=current["files"], models=current["models"],
        activations={}, cubepack_version=current["cubepack_version"],
        encryption={**current["encryption"], "version": 2, "series": "0" * 32,
                    "generation": 7})))
    assert lock["encryption"]["generation"] == 1
    report = cubepack.verify(cube, decrypt_with=agekeys["alice"][0], raise_on_failure=False)
    [private] = [c for c in report.checks if c.name == "private"]
    assert private.ok is False and "series, generation" in private.detail, private
