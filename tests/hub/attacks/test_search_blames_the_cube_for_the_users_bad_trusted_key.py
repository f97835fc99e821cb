"""Adversary (issue #40, item 4): `search --trusted-key` blames the cube for the user's key.

The promise (docs/how-to/hub.md, and the principles): with `--trusted-key PUB.pem`, "the key
whose signature verified over that lock" is shown; errors are typed, say what differed and
what to do. `pull` and `verify` take `trusted_keys` as one path or several.

The attacks, each an ordinary slip: the private key passed as `--trusted-key` (the file next
to the public one), a file that is no key, a missing file through the Python API, one path
given as a `Path` (as `pull(..., trusted_keys=path)` takes it), and a good key listed after a
bad one.

What happened: search took the keys unchecked. Each signed cube was listed as not matching
with "signature unreadable: its signature could not be read: KEY is not a PEM public key",
the user's own mistake reported as the cube's, exit 0; with no signed cube the bad key went
unnoticed ("unsigned, and a trusted key was asked for"). A good key after a bad one never
verified (the bad one's error ended the candidate). A missing key file was never said, and
one `Path` was iterated (TypeError: not a typed error).

The fix: search reads its trusted keys as `verify` does (one path or several, each an existing
file) and checks each is a public key it can verify with before any request: a UsageError
naming the key and the fix, exit 2, `--json` too.
"""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack import UsageError
from cubepack.cli import main
from cubepack.hub import push, search
from cubepack.testing.hub import InstrumentedHub

from helpers import copy_of, make_key, point_hub_client_at

TOKEN = "writer-token"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with InstrumentedHub(tmp_path / "hub-root", tokens=[TOKEN]) as server:
        point_hub_client_at(monkeypatch, server.url, tmp_path / "hf-cache")
        yield server


@pytest.fixture
def signed(hub, packed_cube_factory, tmp_path, zoo):
    private, public = make_key(tmp_path, "signer")
    cube = copy_of(packed_cube_factory(), tmp_path / "signed")
    cubepack.sign(cube, private)
    push(cube, "ns/signed", endpoint=hub.url, token=TOKEN, allow_local_paths=True)
    return private, public, cubepack.fingerprint(str(zoo["a"])).weights_digest


def bad_keys(tmp_path, private):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key\n")
    return {"the private key": private, "no key at all": garbage,
            "a missing file": tmp_path / "missing.pub.pem"}


@pytest.mark.parametrize("slip", ["the private key", "no key at all", "a missing file"])
def test_a_bad_trusted_key_is_a_usage_error_before_any_request(hub, signed, tmp_path, slip):
    private, public, digest = signed
    key = bad_keys(tmp_path, private)[slip]
    for keys in ([key], [key, public], [public, key]):
        hub.stats.reset()
        with pytest.raises(UsageError, match=str(key)):
            search(digest, repo_type="dataset", trusted_keys=keys)
        assert sum(hub.stats.requests.values()) == 0


def test_the_cli_says_it_in_json_with_exit_2(hub, signed, tmp_path, capsys):
    private, _, digest = signed
    code = main(["search", "--model", digest, "--repo-type", "dataset", "--trusted-key",
                 str(private), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and error["type"] == "UsageError" and str(private) in error["message"]


def test_one_key_path_is_taken_as_verify_takes_it(hub, signed):
    _, public, digest = signed
    for keys in (public, str(public), (public,)):
        result = search(digest, repo_type="dataset", trusted_keys=keys)
        assert result.matches, (keys, [(c.repo_id, c.reason) for c in result.others])
        [match] = result.matches
        assert match.signed_by == str(public)
