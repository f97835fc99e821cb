"""Issue #37 item 3, ``encrypt --continue``. docs/how-to/private-cubes.md: "Replacing a
private cube's content (a re-pack, encrypted again) makes a new private cube, with a new
series, unless you continue the old one:

    cubepack pull owner/cube --local-dir current        # the private cube being replaced
    cubepack encrypt CUBE --to age1alice... --continue current --sign-key signer.pem

The new cube takes the series one generation above the one it replaces (and above any of it
you have seen), so readers refuse every revision it replaces". Principle 4: "A claim never
gains strength through a later step."

The chain: the owner encrypts to alice and bob and signs (generation 1), removes bob and signs
(generation 2), pushes both. Someone who can push (the threat model's attacker) pushes
generation 2 again with its public lock re-sealed to name another series (an unsigned claim:
the signature files dropped). The owner follows the how-to literally: pulls ``current``, then
``encrypt --continue current --sign-key``. ``--continue`` reads the series from ``current``'s
unverified lock (a claim, "which can only make the new cube's generation higher": but the
series is not a generation) and the owner's key signs it: the new cube continues the pusher's
series, not the cube it replaces. The pusher then pushes the owner's signed generation 2 back
(the replaced content): a fresh reader trusting the owner pulls it, the history walk finds no
newer revision of its series, and the old memories load. A pushed lock claiming the last
generation (2^53 - 1) likewise makes ``encrypt --continue`` write and sign, without a word, a
cube whose manifest holds generation 2^53: its readers' verify (and the owner's rekey) refuse
it as "malformed".

Fixed: ``--continue`` reads a series and generation only from a revision a key trusted here
(or the signing key) signed; the forged, unsigned one is refused at the owner's encrypt, before
anything is written or signed."""

from __future__ import annotations

import json
import secrets
import shutil

import pytest
from private_keys import age_keys, private_copy, reseal_private

from cubepack._util import constants
from cubepack.errors import SignatureError, VerificationFailed
from cubepack.hub import pull, push
from cubepack.ops._encrypt import encrypt, rekey
from cubepack.testing.hub import InstrumentedHub

from data import HUB_TOKEN
from helpers import make_key

REPO = "team/notes"


def drop_signature(cube) -> None:
    for name in (constants.SIGNATURE_FILENAME, constants.ATTESTATION_FILENAME):
        (cube / name).unlink(missing_ok=True)


@pytest.fixture
def scene(packed, tmp_path, monkeypatch):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice", "bob")
    owner, owner_pub = make_key(tmp_path, "owner")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "owner-cache"))
    cube = private_copy(packed, tmp_path / "owner", [keys["alice"][1], keys["bob"][1]],
                        sign_key=owner)
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        options = {"endpoint": hub.url, "token": HUB_TOKEN}
        push(cube, REPO, allow_local_paths=True, **options)
        rekey(cube, keys["alice"][0], remove=[keys["bob"][1]], sign_key=owner)
        push(cube, REPO, allow_local_paths=True, **options)
        second = tmp_path / "generation-2"  # the pusher keeps the owner's signed generation 2
        shutil.copytree(cube, second)
        yield {"hub": hub, "options": options, "keys": keys, "owner": owner,
               "owner_pub": owner_pub, "second": second, "packed": packed, "tmp": tmp_path}


def tampered_push(scene, change) -> None:
    forged = scene["tmp"] / "forged"
    shutil.copytree(scene["second"], forged)
    drop_signature(forged)
    reseal_private(forged, change)
    push(forged, REPO, allow_local_paths=True, allow_unsigned=True,  # the pusher's own choice
         **scene["options"])


def test_continue_follows_the_series_of_the_cube_it_replaces(scene, monkeypatch):
    tmp, options = scene["tmp"], scene["options"]
    tampered_push(scene, lambda lock: lock["encryption"].update(series=secrets.token_hex(16)))
    # The how-to, literally: pull the cube being replaced, encrypt the new content continuing it.
    current = tmp / "current"
    pull(f"{REPO}@main", local_dir=current, cache_dir=tmp / "owner-hf", **options)
    new = tmp / "new-content"
    shutil.copytree(scene["packed"], new)
    with pytest.raises(SignatureError, match="not signed by a key trusted here"):
        encrypt(new, [scene["keys"]["alice"][1]], continue_from=current,
                sign_key=scene["owner"])
    assert not (new / constants.LOCK_FILENAME).read_text().count('"encryption"')
    # The owner continues the revision they signed (pulled at its commit), as the fix says.
    signed = tmp / "signed-current"
    shutil.copytree(scene["second"], signed)
    encrypt(new, [scene["keys"]["alice"][1]], continue_from=signed, sign_key=scene["owner"])
    push(new, REPO, allow_local_paths=True, **options)
    # The pusher pushes back the owner's signed generation 2: the content the new cube replaced.
    push(scene["second"], REPO, allow_local_paths=True, **options)
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp / "carol-cache"))  # a fresh reader
    series = json.loads((new / constants.LOCK_FILENAME).read_text())["encryption"]["series"]
    replaced = json.loads((scene["second"] / constants.LOCK_FILENAME).read_text())
    with pytest.raises(VerificationFailed) as refused:
        pull(f"{REPO}@main", local_dir=tmp / "carol", trusted_keys=[scene["owner_pub"]],
             cache_dir=tmp / "carol-hf", **options)
        pytest.fail(f"carol loaded the replaced revision (series {replaced['encryption']['series']}"
                    f", generation 2): the owner's new cube, signed as its continuation, is of "
                    f"series {series}, which the pusher chose")
    assert [c for c in refused.value.report.failures if c.name == "replay"]


def test_a_claimed_last_generation_leaves_a_cube_its_readers_can_open(scene):
    from cubepack.format import _lock as lockfile
    from cubepack.ops._verify import verify

    tmp, options = scene["tmp"], scene["options"]
    tampered_push(scene, lambda lock: lock["encryption"].update(
        generation=lockfile.MAX_GENERATION))
    current = tmp / "current"
    pull(f"{REPO}@main", local_dir=current, cache_dir=tmp / "owner-hf", **options)
    new = tmp / "new-content"
    shutil.copytree(scene["packed"], new)
    with pytest.raises(SignatureError, match="not signed by a key trusted here"):
        encrypt(new, [scene["keys"]["alice"][1]], continue_from=current,
                sign_key=scene["owner"])
    assert verify(new).ok  # still the clear cube: nothing written, nothing signed
