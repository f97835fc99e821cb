"""What a private sharded cube leaves public: an attacker reads every public byte of it (its
public lock, cubepack.yaml, card, signature files, every ciphertext's age header) and the
``--json`` of ``cubepack verify`` run without a key, looking for its memories: their item ids
(with hidden names), their offsets and lengths in their shards, their plaintext digests, the
shards' and indexes' plaintext sizes and digests. None is there; what is public is the shard
and index count, each ciphertext's size (so each shard's plaintext size, to 16 bytes a 64 KiB
chunk: docs/how-to/private-cubes.md says so), and the memory count."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile
from cubepack.format.sections import shards
from cubepack.trust import _age_range as ranges

from helpers import build_cache, cli_in_process

ITEMS = [f"secret-topic-{index:03d}" for index in range(5)]


@pytest.fixture(scope="module")
def clear_cube(zoo, models, tmp_path_factory):
    cube = tmp_path_factory.mktemp("leak") / "clear"
    (cube / "activations").mkdir(parents=True)
    producer = cubepack.fingerprint(zoo["a"])
    for index, item in enumerate(ITEMS):
        ids = [(index * 7 + k) % 900 + 1 for k in range(20 + 30 * index)]
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               cube / "activations" / f"{item}.kv.safetensors",
                               producer=producer, token_ids=ids)
    cubepack.pack(cube, cube_id="me/leak", model=str(zoo["a"]), shards=True)
    return cube


def _secrets(clear):
    """Every string a public byte must not hold, by what it is."""
    lock = lockfile.parse((clear / constants.LOCK_FILENAME).read_bytes())
    resolved = shards.resolved(lock, shards.local_fetch(clear))
    found = {}
    for item, entry in resolved.activations.items():
        found[f"item id {item}"] = item
        found[f"sha256 of {item}"] = entry.locator.sha256
        found[f"offset of {item}"] = f'"offset": {entry.locator.offset}'
        found[f"compact offset of {item}"] = f'"offset":{entry.locator.offset}'
        found[f"length of {item}"] = f'"length": {entry.locator.length}'
    for name in lock.files:
        if name.startswith("shards/"):
            found[f"plaintext sha256 of {name}"] = lock.files[name].sha256
            found[f"plaintext size of {name}"] = f'"size": {lock.files[name].size}'
            found[f"compact plaintext size of {name}"] = f'"size":{lock.files[name].size}'
    return found


@pytest.mark.parametrize("hide_names", [False, True])
def test_no_public_byte_holds_a_memorys_id_offset_size_or_digest(clear_cube, agekeys,
                                                                  tmp_path, hide_names):
    cube = tmp_path / "cube"
    shutil.copytree(clear_cube, cube)
    cubepack.encrypt(cube, [agekeys["alice"][1], agekeys["ssh"][1]] if "ssh" in agekeys
                     else [agekeys["alice"][1]], hide_names=hide_names)
    public_lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    public = b""
    for path in sorted(cube.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        # a ciphertext's header is public (its stanzas, its MAC); the rest is ciphertext
        public += data[:ranges.head_digest(data)[0]] if path.suffix == ".age" else data
        public += path.relative_to(cube).as_posix().encode()
    done = cli_in_process(["verify", cube, "--json"], env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert all(check["scope"] == "public" for check in report["checks"])
    public += done.stdout.encode()
    secrets = _secrets(clear_cube)
    if not hide_names:  # the shard and index names are public then; the item ids are not
        assert any(name.startswith("shards/") for name in public_lock.files)
    leaked = sorted(what for what, text in secrets.items() if text.encode() in public)
    assert leaked == []
    assert public_lock.encryption.counts.of("activations") == len(ITEMS)
    assert not public_lock.shards and not public_lock.activations


def test_verify_json_with_the_key_says_which_checks_read_the_plaintext(clear_cube, agekeys,
                                                                       tmp_path):
    cube = tmp_path / "cube"
    shutil.copytree(clear_cube, cube)
    cubepack.encrypt(cube, [agekeys["alice"][1]], hide_names=True)
    done = cli_in_process(["verify", cube, "--json", "--identity", agekeys["alice"][0]],
                          env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    checks = json.loads(done.stdout)["checks"]
    scoped = {(check["check"], check["scope"]) for check in checks}
    assert ("shards", "decrypted") in scoped and ("shards", "public") not in scoped
    assert ("sha256", "public") in scoped and ("sha256", "decrypted") in scoped
