"""A claim never gains strength on its way through: a composition sweep.

A pusher's cube enters with two claims a trusted key never proved: its lock re-sealed to label
every activation ``recomputed`` (the caches are the pusher's), and a lineage naming a trusted
root (with that root's real envelope). Every operation that takes a cube folder and gives one
(a pull at its commit, ``hf download --local-dir``, an honest maintainer's ``sign`` or
``pack --sign-key``, a pull request merged then pulled), alone and in every ordered pair, is
applied; after each, verifying with the maintainer's key must still see both as claims:
``--require-provenance recomputed`` and ``--require-lineage`` refuse, and no report states
either with a signed or proved basis. ``diff`` of the result against the entering cube marks
each pin claimed.
"""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import canonical, constants
from cubepack._util.hashing import sha256_file
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from envs import chain_once
from helpers import copy_of, make_key, reseal_lock

pytestmark = chain_once

ATT, ANC, LOCK = (constants.ATTESTATION_FILENAME, constants.ANCESTORS_FILENAME,
                  constants.LOCK_FILENAME)


@pytest.fixture(scope="module")
def world(tmp_path_factory, packed_cube_factory):
    """The maintainer's key, a trusted root, the poisoned cube, and an endpoint."""
    root_dir = tmp_path_factory.mktemp("world")
    key, public = make_key(root_dir, "maintainer")
    root = copy_of(packed_cube_factory(), root_dir / "root")
    cubepack.pack(root, sign_key=key)
    poisoned = copy_of(packed_cube_factory({"item-9": [40, 41, 42]}), root_dir / "poisoned")
    (poisoned / "lineage").mkdir()
    (poisoned / ANC).write_text(canonical.dumps(
        {"envelopes": [json.loads((root / ATT).read_text())]}))
    root_lock = json.loads((root / LOCK).read_text())

    def poison(lock):
        lock["files"][ANC] = {"sha256": sha256_file(poisoned / ANC),
                              "size": (poisoned / ANC).stat().st_size}
        lock["lineage"] = {
            "parent": {"lock_digest": root_lock["digest"],
                       "content_digest": root_lock["content_digest"],
                       "cube_id": root_lock["cube_id"], "repo_id": None, "revision": None},
            "changes": {"models": {}, "retokenized": [], "reembedded": 5000,
                        "adapters_dropped": []},
            "tool": "cubepack migrate", "cubepack_version": cubepack.__version__}
        for entry in lock["activations"].values():
            entry["provenance"] = {"kind": "recomputed", "detail": "trust me"}
    reseal_lock(poisoned, poison)
    with InstrumentedHub(root_dir / "hub") as hub:
        yield {"key": key, "public": public, "poisoned": poisoned, "root": root, "hub": hub,
               "names": itertools.count()}


def _fresh(world, tmp_path, label):
    return tmp_path / f"{label}-{next(world['names'])}"


def op_pull(world, folder, tmp_path):
    repo = f"ns/c{next(world['names'])}"
    sha = push(folder, repo, endpoint=world["hub"].url, allow_local_paths=True).commit_sha
    out = _fresh(world, tmp_path, "pulled")
    pull(f"{repo}@{sha}", endpoint=world["hub"].url, local_dir=out, cache_dir=tmp_path / "c")
    return out


def op_hf_download(world, folder, tmp_path):
    from huggingface_hub import snapshot_download

    repo = f"ns/c{next(world['names'])}"
    sha = push(folder, repo, endpoint=world["hub"].url, allow_local_paths=True).commit_sha
    out = _fresh(world, tmp_path, "hf")
    snapshot_download(repo, repo_type="dataset", revision=sha, endpoint=world["hub"].url,
                      local_dir=out, cache_dir=tmp_path / "hf")
    return out


def op_sign(world, folder, tmp_path):
    out = copy_of(folder, _fresh(world, tmp_path, "signed"))
    cubepack.sign(out, world["key"])  # the maintainer verifies, then signs what was proved
    return out


def op_pack_sign(world, folder, tmp_path):
    out = copy_of(folder, _fresh(world, tmp_path, "repacked"))
    cubepack.pack(out, sign_key=world["key"])
    return out


def op_pr_merge(world, folder, tmp_path):
    """The pusher proposes the cube as a pull request to a maintained repo; it is merged; the
    maintainer pulls main."""
    from huggingface_hub import HfApi

    repo = f"ns/c{next(world['names'])}"
    base = copy_of(world["root"], _fresh(world, tmp_path, "base"))
    push(base, repo, endpoint=world["hub"].url, allow_local_paths=True)
    proposed = push(folder, repo, endpoint=world["hub"].url, allow_local_paths=True,
                    create_pr=True, allow_unsigned=True)  # a pusher publishes it unsigned
    # on purpose (the base is signed: without the flag, the push is refused)
    HfApi(endpoint=world["hub"].url).merge_pull_request(repo, proposed.pr_num,
                                                        repo_type="dataset")
    out = _fresh(world, tmp_path, "merged")
    pull(repo, endpoint=world["hub"].url, local_dir=out, cache_dir=tmp_path / "c")
    return out


OPERATIONS = {"pull": op_pull, "hf download": op_hf_download, "sign": op_sign,
              "pack --sign-key": op_pack_sign, "merged pull request": op_pr_merge}
SEQUENCES = [(first,) for first in OPERATIONS] + list(itertools.product(OPERATIONS, repeat=2))


@pytest.mark.parametrize("sequence", SEQUENCES, ids=" then ".join)
def test_no_claim_leaves_stronger_than_it_entered(world, sequence, tmp_path):
    folder = world["poisoned"]
    for name in sequence:
        folder = OPERATIONS[name](world, folder, tmp_path)
    trusted = [world["public"]]
    report = cubepack.verify(folder, trusted_keys=trusted, raise_on_failure=False)
    lock = report.lock.to_dict()
    assert lock is not None
    for item, backing in report.provenance.items():
        if backing["kind"] == "recomputed":  # the pusher's label, wherever it went
            assert backing["basis"] == "claimed", (sequence, item, backing)
    refused = cubepack.verify(folder, trusted_keys=trusted, require_provenance="recomputed",
                              raise_on_failure=False)
    assert not refused.ok  # nothing proved the pusher's label on the way
    if "lineage" in lock:  # the pusher's lineage: carried, never derived by the maintainer
        chain = cubepack.verify(folder, trusted_keys=trusted, require_lineage=True,
                                raise_on_failure=False)
        assert [c for c in chain.failures if c.name in ("lineage", "attestation")]
        assert not any(c.ok and c.name == "lineage" and c.subject != "this cube"
                       for c in chain.checks)
    changes = cubepack.diff(world["poisoned"], folder)
    pins = changes["sections"].get("models", {})
    assert set(pins.get("basis", {}).values()) <= {"claimed"}
