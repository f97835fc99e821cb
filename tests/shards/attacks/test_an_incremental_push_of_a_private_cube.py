"""An incremental push of a private sharded cube (issue #40 item 3 with item 2's private
shards): one memory added to a pushed private cube of several shards, packed (the clear cube's
older shards kept byte for byte), encrypted again continuing its series, and pushed. encrypt
re-encrypts every shard under fresh file keys (it does not reuse a ciphertext of the revision
it continues: which plaintext each holds is only in that revision's encrypted manifest, and
``--continue`` decrypts nothing), so the push uploads the whole cube again: the limit
docs/how-to/private-cubes.md ("A private cube's push is not incremental") and
docs/reference/shards.md ("Private shards") document, asserted here so a change of it is
seen."""

from __future__ import annotations

import os
import shutil

import pytest

import cubepack

from data import HUB_TOKEN

pytest.importorskip("model_signing")


@pytest.fixture
def alice(tmp_path):
    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / "alice.key"
    path.write_text(f"# public key: {identity.to_public()}\n{identity}\n")
    os.chmod(path, 0o600)
    return path, str(identity.to_public())


def test_adding_one_memory_uploads_every_shard_again_as_documented(bundle, bundle_factory, zoo, hub,
                                                             alice, tmp_path):
    from helpers import make_key

    identity, recipient = alice
    signer, _ = make_key(tmp_path, "signer")
    clear = bundle(8, tokens=200)
    (clear / "activations" / "item-005.kv.safetensors").unlink()
    size = next((clear / "activations").iterdir()).stat().st_size
    cubepack.pack(clear, cube_id="me/cube", model=str(zoo["a"]), shard_size=2 * size + 100)
    first = tmp_path / "first"
    shutil.copytree(clear, first)
    cubepack.encrypt(first, [recipient], sign_key=str(signer))
    cubepack.push(first, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)

    (clear / "activations").mkdir(exist_ok=True)
    shutil.copy(bundle_factory(8, tokens=200) / "activations" / "item-005.kv.safetensors",
                clear / "activations" / "item-005.kv.safetensors")
    cubepack.pack(clear, cube_id="me/cube", model=str(zoo["a"]), shard_size=2 * size + 100)
    cubepack.encrypt(clear, [recipient], continue_from=first, sign_key=str(signer))
    old = {path.relative_to(first).as_posix() for path in first.rglob("*.kvshard.age")}
    assert len(old) == 4
    hub.stats.reset()
    result = cubepack.push(clear, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    uploaded = sum(hub.stats.uploaded_bytes.values())
    shards = sum(path.stat().st_size for path in (clear).rglob("*.age"))
    print(f"uploaded {uploaded} bytes; one memory {size}; the cube's ciphertexts {shards}")
    assert old <= set(result.uploaded), "a ciphertext was reused: update the docs"
    assert uploaded >= shards  # every ciphertext again, not item 3's bound for clear cubes
