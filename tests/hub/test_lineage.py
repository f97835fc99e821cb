"""Lineage followed through the local endpoint: two migrations with a push and a pull between
them, each parent's lock fetched at the commit its child records; a parent link that does not
lead to the lock it names is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cubepack
from cubepack._util import constants
from cubepack.hub import lineage, pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import copy_of, reseal_lock


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub-root") as server:
        yield server


def share(hub, cube, repo, tmp_path):
    """Push ``cube`` to ``repo``, pull that commit back: (the pulled folder, its commit)."""
    sha = push(cube, repo, endpoint=hub.url, allow_local_paths=True).commit_sha
    pulled = pull(f"{repo}@{sha}", endpoint=hub.url, local_dir=tmp_path / f"pulled-{repo[3:]}",
                  cache_dir=tmp_path / "hf-cache")
    return pulled.local_dir, sha


@pytest.fixture
def chain(hub, packed_cube_factory, zoo, tmp_path):
    """root (A) -> pushed, pulled, migrated to B -> pushed, pulled, migrated back to A."""
    root = copy_of(packed_cube_factory(), tmp_path)
    pulled_root, root_sha = share(hub, root, "ns/root", tmp_path)
    child = cubepack.migrate(pulled_root, model=str(zoo["b"]), out=tmp_path / "child").cube_dir
    pulled_child, child_sha = share(hub, child, "ns/child", tmp_path)
    grandchild = cubepack.migrate(pulled_child, model=str(zoo["a"]),
                                  out=tmp_path / "grandchild").cube_dir
    return {"root": root, "root_sha": root_sha, "child": child, "child_sha": child_sha,
            "grandchild": grandchild}


def lock_of(cube):
    return json.loads((cube / constants.LOCK_FILENAME).read_text())


def test_the_parent_pulled_from_a_hub_is_recorded_at_its_commit(chain):
    parent = lock_of(chain["grandchild"])["lineage"]["parent"]
    child = lock_of(chain["child"])
    assert (parent["repo_id"], parent["revision"]) == ("ns/child", chain["child_sha"])
    assert (parent["lock_digest"], parent["content_digest"]) == (child["digest"],
                                                                 child["content_digest"])


def test_lineage_is_followed_to_the_root_across_two_migrations(hub, chain, zoo):
    shown = lineage(chain["grandchild"])
    assert len(shown.chain) == 1 and not shown.followed and not shown.complete
    before = hub.stats.requests.copy()
    followed = lineage(chain["grandchild"], follow=True, endpoint=hub.url)
    assert followed.complete and followed.stopped is None
    assert [(link.get("repo_id"), link["root"]) for link in followed.chain] == [
        (None, False), ("ns/child", False), ("ns/root", True)]
    assert followed.chain[1]["lock_digest"] == lock_of(chain["child"])["digest"]
    assert followed.chain[1]["changes"]["models"]["act_mem"]["to_weights"] == \
        cubepack.fingerprint(zoo["b"]).weights_digest
    assert followed.chain[0]["changes"]["models"]["act_mem"]["to_weights"] == \
        cubepack.fingerprint(zoo["a"]).weights_digest
    assert followed.chain[2]["lock_digest"] == lock_of(chain["root"])["digest"]
    fetched = [key for key in hub.stats.requests - before if "/resolve/" in key]
    assert all(key.endswith("/cubepack.lock") for key in fetched)  # the locks, nothing else
    assert {key.split("/")[3] for key in fetched} == {"root", "child"}


def test_lineage_follow_through_the_cli_reads_hf_endpoint(hub, chain, tmp_path):
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cli-cache"),
               HF_HUB_DISABLE_PROGRESS_BARS="1")
    done = subprocess.run([sys.executable, "-m", "cubepack", "lineage", str(chain["grandchild"]),
                           "--follow", "--json"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] and data["complete"] and len(data["chain"]) == 3
    text = subprocess.run([sys.executable, "-m", "cubepack", "lineage", str(chain["grandchild"]),
                           "--follow"], env=env, capture_output=True, text=True, timeout=300,
                          check=False).stdout
    assert f"parent ns/child@{chain['child_sha']}" in text and "chain complete" in text
    assert "re-tokenised: item-1, item-2" in text


@pytest.mark.parametrize("tamper", ["digest", "commit"])
def test_a_tampered_parent_link_is_refused(hub, chain, tamper):
    """A child whose recorded parent is not the lock the named commit holds: another digest, or
    the link re-pointed at another cube's commit."""
    def change(lock):
        parent = lock["lineage"]["parent"]
        if tamper == "digest":
            parent["lock_digest"] = "0" * 64
        else:
            parent.update(repo_id="ns/root", revision=chain["root_sha"])

    reseal_lock(chain["grandchild"], change)
    assert cubepack.verify(chain["grandchild"]).ok  # resealed: the lock itself is consistent
    with pytest.raises(cubepack.IntegrityError, match="Tampered parent link") as caught:
        lineage(chain["grandchild"], follow=True, endpoint=hub.url)
    assert "ns/" in str(caught.value)


def test_a_parent_never_pulled_stops_the_chain_and_says_so(packed_cube_factory, zoo, tmp_path,
                                                           hub):
    root = copy_of(packed_cube_factory(), tmp_path)
    child = cubepack.migrate(root, model=str(zoo["b"]), out=tmp_path / "child").cube_dir
    followed = lineage(child, follow=True, endpoint=hub.url)
    assert not followed.complete and "was not pulled from a Hub" in followed.stopped
    assert sum(hub.stats.requests.values()) == 0


def test_a_pulled_cube_repacked_since_is_not_that_commit(hub, packed_cube_factory, zoo, tmp_path):
    root = copy_of(packed_cube_factory(), tmp_path)
    pulled, _ = share(hub, root, "ns/root", tmp_path)
    cubepack.pack(pulled, pretty_name="renamed")  # the lock changes: no longer the pulled commit
    parent = lock_of(cubepack.migrate(pulled, model=str(zoo["b"]),
                                      out=tmp_path / "child").cube_dir)["lineage"]["parent"]
    assert (parent["repo_id"], parent["revision"]) == (None, None)


def test_a_parent_pulled_from_a_pull_request_is_named_as_one(hub, packed_cube_factory, zoo,
                                                            tmp_path):
    """Anyone may open a pull request on a Hub repo: its commit lives under the repo's name but
    on refs/pr/N, not on a branch its owner moved. A cube pulled from one and migrated records
    `repo@commit` like any other parent; lineage --follow fetched it and said nothing of what
    that commit is. It names the ref the commit is on: the branch, else the pull request."""
    from cubepack.cli import _render_lineage

    root = copy_of(packed_cube_factory(), tmp_path)
    main_sha = push(root, "ns/root", endpoint=hub.url, allow_local_paths=True).commit_sha
    proposal = copy_of(root, tmp_path / "proposal")
    cubepack.pack(proposal, pretty_name="a proposal")
    proposed = push(proposal, "ns/root", endpoint=hub.url, allow_local_paths=True,
                    create_pr=True)
    assert proposed.pr_revision == "refs/pr/1" and proposed.commit_sha != main_sha
    for sha, name in ((proposed.commit_sha, "from-pr"), (main_sha, "from-main")):
        pulled = pull(f"ns/root@{sha}", endpoint=hub.url, local_dir=tmp_path / f"pulled-{name}",
                      cache_dir=tmp_path / "hf-cache").local_dir
        child = cubepack.migrate(pulled, model=str(zoo["b"]), out=tmp_path / name).cube_dir
        followed = lineage(child, follow=True, endpoint=hub.url)
        assert followed.complete
        ref = followed.chain[1]["ref"]
        text = _render_lineage(followed.to_dict())
        if name == "from-pr":
            assert ref == {"kind": "pull request", "name": "refs/pr/1"}
            assert f"parent ns/root@{sha} (a pull request's commit: refs/pr/1" in text
        else:
            assert ref == {"kind": "branch", "name": "main"}
            assert f"parent ns/root@{sha} (on branch main" in text


def test_the_ref_named_is_a_branch_else_a_tag_else_a_pull_request_else_none(hub):
    """Each kind of ref a parent's commit can sit on, through the real client."""
    from huggingface_hub import CommitOperationAdd

    from cubepack.hub._client import HubClient
    from cubepack.hub._lineage import _ref_of

    client = HubClient(hub.url)
    api = client.api
    api.create_repo("ns/refs", repo_type="dataset")

    def commit(branch="main", create_pr=False, data=b"x"):
        return client.create_commit("ns/refs", [CommitOperationAdd("a.txt", data)],
                                    repo_type="dataset", branch=branch, message="c",
                                    create_pr=create_pr)

    first = commit(data=b"1").oid
    head = commit(data=b"2").oid
    api.create_branch("ns/refs", branch="side", repo_type="dataset")
    side = commit("side", data=b"3").oid
    api.create_tag("ns/refs", tag="v1", revision=side, repo_type="dataset")
    api.delete_branch("ns/refs", branch="side", repo_type="dataset")
    proposed = commit(create_pr=True, data=b"4").oid
    found = {name: _ref_of(client, "ns/refs", sha, "dataset") for name, sha in (
        ("first", first), ("head", head), ("side", side), ("proposed", proposed),
        ("unknown", "f" * 40))}
    assert found == {"first": {"kind": "branch", "name": "main"},
                     "head": {"kind": "branch", "name": "main"},
                     "side": {"kind": "tag", "name": "v1"},
                     "proposed": {"kind": "pull request", "name": "refs/pr/1"},
                     "unknown": {"kind": None, "name": None}}


def _hand_made_origin(folder, repo_id, commit):
    """An origin record as a pull writes one, written by hand (or shipped in a folder)."""
    import hashlib

    from cubepack._util import canonical
    from cubepack.format._fileset import ORIGIN_FILE

    lock = (folder / constants.LOCK_FILENAME).read_bytes()
    record = folder / ORIGIN_FILE
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(canonical.dumps({
        "repo_id": repo_id, "repo_type": "dataset", "commit_sha": commit,
        "files": {constants.LOCK_FILENAME: {"sha256": hashlib.sha256(lock).hexdigest(),
                                            "size": len(lock), "stat": None}}}))


def test_an_origin_record_no_pull_wrote_never_becomes_a_parent(hub, packed_cube_factory, zoo,
                                                               tmp_path):
    """The record lives in the folder: anyone who hands over a folder (or a tarball, or a raw
    upload a plain `hf download` fetches) can write one naming any repo and commit. A parent
    is recorded only when this user's pull wrote the record."""
    root = copy_of(packed_cube_factory(), tmp_path)
    sha = push(root, "ns/root", endpoint=hub.url, allow_local_paths=True).commit_sha
    handed = copy_of(root, tmp_path / "handed")  # never pulled: the same lock as that commit
    _hand_made_origin(handed, "ns/root", sha)
    child = cubepack.migrate(handed, model=str(zoo["b"]), out=tmp_path / "child").cube_dir
    parent = lock_of(child)["lineage"]["parent"]
    assert (parent["repo_id"], parent["revision"]) == (None, None)
    assert "was not pulled from a Hub" in lineage(child, follow=True,
                                                  endpoint=hub.url).stopped


def test_a_folder_another_cache_pulled_names_no_parent(hub, packed_cube_factory, zoo, tmp_path,
                                                       monkeypatch):
    """A pulled folder moved to another user (another CUBEPACK_CACHE): their migrate did not
    pull it, so it records no parent; the puller's own migrate does."""
    root = copy_of(packed_cube_factory(), tmp_path)
    pulled, sha = share(hub, root, "ns/root", tmp_path)
    mine = cubepack.migrate(pulled, model=str(zoo["b"]), out=tmp_path / "mine").cube_dir
    assert lock_of(mine)["lineage"]["parent"]["revision"] == sha
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "someone-else"))
    theirs = cubepack.migrate(pulled, model=str(zoo["b"]), out=tmp_path / "theirs").cube_dir
    assert lock_of(theirs)["lineage"]["parent"]["revision"] is None


def test_a_cache_that_cannot_record_the_pull_costs_the_link_not_the_pull(
        hub, packed_cube_factory, zoo, tmp_path, monkeypatch, caplog):
    root = copy_of(packed_cube_factory(), tmp_path)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where CUBEPACK_CACHE should be\n")
    monkeypatch.setenv("CUBEPACK_CACHE", str(blocked))
    with caplog.at_level("WARNING", logger="cubepack"):
        pulled, sha = share(hub, root, "ns/root", tmp_path)
    assert cubepack.verify(pulled).ok
    assert f"ns/root@{sha} could not be recorded in CUBEPACK_CACHE" in caplog.text
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "cache"))
    child = cubepack.migrate(pulled, model=str(zoo["b"]), out=tmp_path / "child").cube_dir
    assert lock_of(child)["lineage"]["parent"]["revision"] is None
