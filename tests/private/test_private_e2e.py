"""Private cubes end to end: the age CLI reads what cubepack wrote and the reverse, loads
decrypt to memory only, push / pull at a SHA / verify / rekey on the local endpoint, and a
marker planted in every private field is found in no public byte and no output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.errors import RefusedError
from cubepack.format import _fileset as fileset
from cubepack.hub import pull, push
from cubepack.ops._encrypt import encrypt, rekey
from cubepack.testing.hub import InstrumentedHub

from data import HUB_TOKEN
from helpers import cli_in_process

AGE = shutil.which("age")
MARKER = "zqxj-private-marker"
ITEM = f"{MARKER}-item"


@pytest.fixture(scope="module")
def marked(packed_cube_factory, tmp_path_factory):
    """A packed cube whose every private field carries MARKER: the item id (so the KV file's
    name), the source text in its KV header, a text memory file, its prompt's metadata."""
    source = packed_cube_factory({ITEM: [5, 6, 7, 8, 9, 10], "item-2": [11, 12, 13]},
                                 texts={ITEM: f"the user said {MARKER} in confidence"})
    cube = tmp_path_factory.mktemp("marked") / "cube"
    shutil.copytree(source, cube)
    (cube / "notes.txt").write_text(f"memory text: {MARKER}\n")
    cubepack.pack(cube)
    assert MARKER.encode() in (cube / constants.LOCK_FILENAME).read_bytes()  # the item id
    return cube


def private_of(source, tmp_path, recipients, **options):
    cube = tmp_path / "private"
    shutil.copytree(source, cube)
    encrypt(cube, recipients, **options)
    return cube


def public_bytes(cube: Path) -> dict[str, bytes]:
    return {p.relative_to(cube).as_posix(): p.read_bytes()
            for p in cube.rglob("*") if p.is_file()}


def no_marker_in(folder: Path) -> list[str]:
    """Every file under ``folder`` whose name or bytes hold the marker."""
    if not folder.exists():
        return []
    return [str(p) for p in folder.rglob("*") if MARKER in p.name or (
        p.is_file() and not p.is_symlink() and MARKER.encode() in p.read_bytes())]


@pytest.mark.skipif(AGE is None, reason="needs Debian's age CLI (apt-get install age)")
def test_the_age_cli_decrypts_what_cubepack_wrote_and_cubepack_reads_what_age_wrote(
        marked, tmp_path, agekeys):
    keys = [agekeys["alice"][1]] + ([agekeys["ssh"][1]] if "ssh" in agekeys else [])
    cube = private_of(marked, tmp_path, keys)
    clear_lock = json.loads((marked / constants.LOCK_FILENAME).read_text())
    for name in clear_lock["files"]:
        for key in [agekeys["alice"][0]] + ([agekeys["ssh"][0]] if "ssh" in agekeys else []):
            done = subprocess.run([AGE, "--decrypt", "-i", str(key), str(cube / (name + ".age"))],
                                  capture_output=True, check=True)
            assert done.stdout == (marked / name).read_bytes(), name
    # The reverse: age encrypts the clear cube's KV file; cubepack loads it, decrypted in memory.
    kv = next(entry["file"] for entry in clear_lock["activations"].values())
    encrypted = tmp_path / "by-age.kv.safetensors.age"
    subprocess.run([AGE, "--encrypt", "-r", agekeys["bob"][1], "-o", str(encrypted),
                    str(marked / kv)], check=True)
    from cubepack.testing import tiny  # noqa: F401 - the zoo's models are loaded by conftest

    with pytest.raises(RefusedError, match="not encrypted to the identity"):
        cubepack.load_kv_cache(encrypted, None, decrypt_with=agekeys["alice"][0])


@pytest.mark.skipif(AGE is None, reason="needs Debian's age CLI (apt-get install age)")
def test_load_kv_cache_decrypts_to_memory_what_age_encrypted(marked, models, tmp_path, agekeys,
                                                             monkeypatch):
    clear_lock = json.loads((marked / constants.LOCK_FILENAME).read_text())
    kv = clear_lock["activations"][ITEM]["file"]
    encrypted = tmp_path / "by-age.age"
    subprocess.run([AGE, "--encrypt", "-r", agekeys["bob"][1], "-o", str(encrypted),
                    str(marked / kv)], check=True)
    spool = tmp_path / "tmpdir"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    cache = cubepack.load_kv_cache(encrypted, models["a"], decrypt_with=agekeys["bob"][0])
    clear = cubepack.load_kv_cache(marked / kv, models["a"])
    for mine, theirs in zip(cache.layers, clear.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    assert list(spool.iterdir()) == []


def test_push_pull_verify_and_rekey_on_the_endpoint_leave_no_plaintext_on_disk(
        marked, tmp_path, agekeys, monkeypatch):
    spool = tmp_path / "tmpdir"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    cube = private_of(marked, tmp_path, [agekeys["alice"][1]], hide_names=True)
    cache = tmp_path / "hf-cache"
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        pushed = push(cube, "ns/private", endpoint=hub.url, token=HUB_TOKEN,
                      allow_local_paths=True)
        target = tmp_path / "pulled"
        result = pull(f"ns/private@{pushed.commit_sha}", endpoint=hub.url, token=HUB_TOKEN,
                      local_dir=target, cache_dir=cache, decrypt_with=agekeys["alice"][0])
        assert result.report.ok and any(c.name == "kv header" and c.ok
                                        for c in result.report.checks)
        # Without a key: the ciphertexts are verified, the content is said to be unchecked.
        keyless = pull(f"ns/private@{pushed.commit_sha}", endpoint=hub.url, token=HUB_TOKEN,
                       local_dir=tmp_path / "keyless", cache_dir=cache)
        assert keyless.report.ok
        # A wrong identity is refused, naming why; nothing is placed.
        with pytest.raises(cubepack.VerificationFailed, match="not encrypted to the identity"):
            pull(f"ns/private@{pushed.commit_sha}", endpoint=hub.url, token=HUB_TOKEN,
                 local_dir=tmp_path / "wrong", cache_dir=cache,
                 decrypt_with=agekeys["mallory"][0])
        assert not (tmp_path / "wrong").exists()
        # Rekey the pulled copy to bob, push it, pull it again with bob's key.
        rekey(target, agekeys["alice"][0], to=[agekeys["bob"][1]])  # unsigned: named
        again = push(target, "ns/private", endpoint=hub.url, token=HUB_TOKEN,
                     allow_local_paths=True)
        final = pull(f"ns/private@{again.commit_sha}", endpoint=hub.url, token=HUB_TOKEN,
                     local_dir=tmp_path / "bob", cache_dir=cache, decrypt_with=agekeys["bob"][0])
        assert final.report.ok
    for folder in (cube, target, tmp_path / "keyless", tmp_path / "bob", cache, spool,
                   tmp_path / "hub-root"):
        assert no_marker_in(folder) == [], folder
    assert not [p for p in Path("/dev/shm").glob(f"cubepack-private-{os.getpid()}.*")]


def test_a_marker_in_every_private_field_is_in_no_public_byte_and_no_output(
        marked, tmp_path, agekeys):
    cube = private_of(marked, tmp_path, [agekeys["alice"][1]], hide_names=True)
    other = tmp_path / "other"
    shutil.copytree(marked, other)
    encrypt(other, [agekeys["bob"][1]], hide_names=True)
    for name, data in public_bytes(cube).items():
        assert MARKER not in name and MARKER.encode() not in data, name
    env = {**os.environ, "CUBEPACK_IDENTITY": ""}
    env.pop("CUBEPACK_IDENTITY")
    outputs = []
    for args in (["verify", cube, "--json"], ["verify", cube],
                 ["verify", cube, "--recompute", "--json"],
                 ["--debug", "verify", cube, "--identity", agekeys["mallory"][0]],
                 ["--debug", "verify", cube, "--identity", agekeys["mallory"][0], "--json"],
                 ["diff", other, cube, "--json"], ["diff", other, cube],
                 ["--debug", "rekey", cube, "--identity", agekeys["mallory"][0], "--add",
                  agekeys["bob"][1]],
                 ["encrypt", cube, "--to", agekeys["bob"][1], "--json"],
                 ["--debug", "inspect",
                  cube / fileset.HIDDEN_DIR / sorted((cube / fileset.HIDDEN_DIR).iterdir())[0]]):
        done = cli_in_process(args, env=env, cwd=tmp_path)
        outputs.append((args, done.returncode, done.stdout + done.stderr))
    for args, code, text in outputs:
        assert MARKER not in text, (args, text)
    codes = [code for _, code, _ in outputs]
    assert codes[0] == 0 and codes[2] == 1 and codes[3] == 1


def test_the_cli_packs_encrypts_verifies_and_rekeys(packed, tmp_path, agekeys):
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    env = dict(os.environ)
    done = cli_in_process(["pack", cube, "--encrypt-to", agekeys["alice"][1], "--json"],
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["private"]["recipients"] == [agekeys["alice"][1]] and not data["activations"]
    env["CUBEPACK_IDENTITY"] = str(agekeys["alice"][0])
    done = cli_in_process(["verify", cube, "--json"], env=env, cwd=tmp_path)
    checks = json.loads(done.stdout)["checks"]
    assert done.returncode == 0 and [c["ok"] for c in checks if c["check"] == "private"] == [True]
    # Every check says what it was run on: the public ciphertexts, or the decrypted plaintext.
    assert [c["scope"] for c in checks if c["check"] == "private"] == ["decrypted"]
    assert {c["scope"] for c in checks} == {"public", "decrypted"}
    assert [c["scope"] for c in checks if c["check"] == "sha256"] == ["public", "decrypted"]
    text = cli_in_process(["verify", cube], env=env, cwd=tmp_path).stdout
    public, decrypted = text.index("-- public:"), text.index("-- decrypted in memory:")
    assert public < text.index("sha256") < decrypted < text.rindex("sha256"), text
    # Unsigned: its recipient list is whoever wrote it last's; rekey keeps none of it unnamed.
    done = cli_in_process(["rekey", cube, "--add", agekeys["bob"][1]], env=env, cwd=tmp_path)
    assert done.returncode == 1 and "--to RECIPIENT" in done.stderr, done.stdout + done.stderr
    done = cli_in_process(["rekey", cube, "--to", agekeys["alice"][1], "--to", agekeys["bob"][1]],
                          env=env, cwd=tmp_path)
    assert done.returncode == 0 and "unsigned" in done.stdout, done.stdout + done.stderr
    assert "generation 2" in done.stdout
    recipients = tmp_path / "keys.txt"  # a GitHub-style keys file: one key a line
    recipients.write_text(f"{agekeys['alice'][1]}\n# a comment\n")
    done = cli_in_process(["encrypt", cube, "--to", recipients], env=env, cwd=tmp_path)
    assert done.returncode == 2 and "already a private cube" in done.stderr


#: Token ids as a KV header writes them (a JSON list): the sweep looks for this run of them.
SECRET_IDS = [911, 733, 877, 601, 919, 787]


def test_token_ids_and_header_metadata_of_a_plain_bundle_stay_private(models, zoo, tmp_path,
                                                                       agekeys):
    from helpers import build_cache

    cube = tmp_path / "bundle"
    cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([SECRET_IDS])),
                           cube / "activations" / f"{ITEM}.kv.safetensors",
                           producer=models["a"], token_ids=SECRET_IDS,
                           metadata={"id": ITEM, "source_text": MARKER,
                                     "prompt": f"system: {MARKER}"})
    (cube / "prompts.jsonl").parent.mkdir(exist_ok=True)
    (cube / "prompts.jsonl").write_text(json.dumps({"prompt": MARKER}) + "\n")
    cubepack.pack(cube, cube_id="ns/bundle", model=str(zoo["a"]), recompute=True)
    ids = ",".join(map(str, SECRET_IDS))  # as the header writes them: "911,733,..."
    assert ids.encode() in (cube / "activations" / f"{ITEM}.kv.safetensors").read_bytes()
    encrypt(cube, [agekeys["alice"][1]], hide_names=True)
    for name, data in public_bytes(cube).items():
        assert MARKER not in name and MARKER.encode() not in data and ids.encode() not in data
    done = cli_in_process(["verify", cube, "--json"], env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0 and MARKER not in done.stdout and ids not in done.stdout
    report = cubepack.verify(cube, decrypt_with=agekeys["alice"][0], model=str(zoo["a"]),
                             recompute=True, require_provenance="recomputed")
    assert report.private_lock.activations[ITEM].token_count == len(SECRET_IDS)
    assert [c.ok for c in report.checks if c.name == "recompute"] == [True]
    assert "private_lock" not in report.to_dict()


def test_a_command_given_an_identity_writes_no_core_dump(tmp_path, agekeys):
    """SECURITY.md: plaintext a load leaves in the ordinary heap (a KV header's fields) would
    reach a disk in a core dump; the CLI makes its process undumpable once it is given an
    identity (by option or CUBEPACK_IDENTITY), and only then."""
    import subprocess
    import sys

    probe = ("import ctypes, sys\n"
             "from cubepack.cli import cli\n"
             "try:\n"
             "    cli.main(sys.argv[1:], standalone_mode=False)\n"
             "except Exception:\n"
             "    pass\n"
             "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n")  # PR_GET_DUMPABLE
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}

    def dumpable(*args: str, **extra: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe, "rekey", str(tmp_path), *args],
                              env={**env, **extra}, capture_output=True, text=True, check=True)
        return done.stdout.strip().splitlines()[-1]

    assert dumpable() == "1"
    assert dumpable("--identity", str(agekeys["alice"][0])) == "0"
    assert dumpable(CUBEPACK_IDENTITY=str(agekeys["alice"][0])) == "0"
