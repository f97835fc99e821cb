"""Issue #37 item 3: "a removed reader stays removed". The owner encrypts a cube to alice and
bob, signs it and pushes it (generation 1); then removes bob (``rekey --remove --sign-key``)
and pushes again (generation 2). Bob, who kept his copy of generation 1, pushes it back: it is
validly signed by the owner, so ``pull --trusted-key owner`` placed it and reported nothing,
``verify --remote`` passed it, and ``rekey`` of it (adding carol) re-encrypted everything to
bob again and signed it with the owner's key. The real huggingface_hub client throughout,
over the loopback local endpoint."""

from __future__ import annotations

import json
import shutil

import pytest
from private_keys import age_keys, private_copy

from cubepack.errors import RefusedError, VerificationFailed
from cubepack.hub import pull, push
from cubepack.hub._remote import verify_remote
from cubepack.ops._encrypt import rekey
from cubepack.testing.hub import InstrumentedHub

from data import HUB_TOKEN
from helpers import cli_in_process, make_key

REPO = "team/notes"


@pytest.fixture
def scene(packed, tmp_path, monkeypatch):
    """The replay, on a local endpoint: ``commits`` generation 1, 2, then the replay."""
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice", "bob", "carol")
    owner, owner_pub = make_key(tmp_path, "owner")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "alice-cache"))  # the owner's machine
    cube = private_copy(packed, tmp_path / "alice", [keys["alice"][1], keys["bob"][1]],
                        sign_key=owner)
    bobs = tmp_path / "bobs-copy"
    shutil.copytree(cube, bobs)
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        options = {"endpoint": hub.url, "token": HUB_TOKEN}
        first = push(cube, REPO, allow_local_paths=True, **options).commit_sha
        rekey(cube, keys["alice"][0], remove=[keys["bob"][1]], sign_key=owner)
        second = push(cube, REPO, allow_local_paths=True, **options).commit_sha
        replay = push(bobs, REPO, allow_local_paths=True, **options).commit_sha
        assert len({first, second, replay}) == 3
        yield {"hub": hub, "options": options, "keys": keys, "owner": owner,
               "owner_pub": owner_pub, "commits": (first, second, replay), "bobs": bobs,
               "tmp": tmp_path}


def client(scene, monkeypatch, name):
    """Be ``name``: their own cubepack cache (what they have seen) and HF cache."""
    monkeypatch.setenv("CUBEPACK_CACHE", str(scene["tmp"] / f"{name}-cache"))
    return {"cache_dir": scene["tmp"] / f"{name}-hf", **scene["options"]}


def replay_failures(report):
    return [check for check in report.failures if check.name == "replay"]


def test_a_fresh_client_pull_reports_the_replay_from_the_branch_history(scene, monkeypatch):
    first, second, replay = scene["commits"]
    carol = client(scene, monkeypatch, "carol")
    with pytest.raises(VerificationFailed) as refused:
        pull(f"{REPO}@main", local_dir=scene["tmp"] / "carol", trusted_keys=[scene["owner_pub"]],
             **carol)
    [found] = replay_failures(refused.value.report)
    assert second in found.detail and "generation 2" in found.detail, found
    assert "generation 1" in str(found), found
    assert not (scene["tmp"] / "carol").exists()


def test_verify_remote_reports_the_replay_from_the_branch_history(scene, monkeypatch, tmp_path):
    carol = client(scene, monkeypatch, "carol")
    folder = tmp_path / "carol-unverified"
    pull(f"{REPO}@main", local_dir=folder, verify_cube=False, **carol)
    report = verify_remote(folder, endpoint=scene["hub"].url, token=HUB_TOKEN,
                           trusted_keys=[scene["owner_pub"]], raise_on_failure=False)
    [found] = replay_failures(report)
    assert scene["commits"][1] in found.detail
    env = {"HF_ENDPOINT": scene["hub"].url, "HF_TOKEN": HUB_TOKEN,  # carol's own cache: her
           "CUBEPACK_CACHE": str(scene["tmp"] / "carol-cache")}  # pull placed the folder
    import os

    env = {**{k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}, **env}
    done = cli_in_process(["verify", folder, "--remote", "--trusted-key", scene["owner_pub"],
                           "--json"], env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    checks = json.loads(done.stdout)["report"]["checks"]
    assert [c["ok"] for c in checks if c["check"] == "replay" and c["ok"] is False], checks


def squash(scene):
    """The writer rewrites the branch's history: only the replay is left on it."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=scene["hub"].url, token=HUB_TOKEN)
    api.delete_repo(REPO, repo_type="dataset")
    return push(scene["bobs"], REPO, allow_local_paths=True, **scene["options"]).commit_sha


def test_a_client_that_saw_the_newer_generation_reports_it_after_a_squash(scene, monkeypatch):
    second = scene["commits"][1]
    dave = client(scene, monkeypatch, "dave")  # pulls generation 2 while it is the newest
    pull(f"{REPO}@{second}", local_dir=scene["tmp"] / "dave", trusted_keys=[scene["owner_pub"]],
         **dave)
    squash(scene)
    for name in ("dave", "alice"):  # dave saw it; alice wrote it (rekey --sign-key)
        options = client(scene, monkeypatch, name)
        with pytest.raises(VerificationFailed) as refused:
            pull(f"{REPO}@main", local_dir=scene["tmp"] / f"{name}-again",
                 trusted_keys=[scene["owner_pub"]], **options)
        [found] = replay_failures(refused.value.report)
        assert "generation 2" in found.detail, (name, found)


def test_a_fresh_client_is_told_what_it_could_not_check(scene, monkeypatch):
    squash(scene)
    carol = client(scene, monkeypatch, "carol")
    result = pull(f"{REPO}@main", local_dir=scene["tmp"] / "carol",
                  trusted_keys=[scene["owner_pub"]], **carol)
    said = " ".join(c.detail for c in result.report.checks if c.name == "replay")
    assert "seen no" in said and "squash" in said, said


def test_rekey_refuses_the_replayed_revision_and_names_who_it_would_re_add(scene, monkeypatch):
    keys = scene["keys"]
    alice = client(scene, monkeypatch, "alice")
    folder = scene["tmp"] / "alice-replay"
    pull(f"{REPO}@main", local_dir=folder, verify_cube=False, **alice)
    with pytest.raises(RefusedError) as refused:
        rekey(folder, keys["alice"][0], add=[keys["carol"][1]], sign_key=scene["owner"])
    assert "generation 2" in str(refused.value), refused.value
    assert keys["bob"][1][:20] in str(refused.value), refused.value


def test_the_fixes_the_refusal_names_work(scene, monkeypatch, packed):
    """The refusal's fix, as printed: pull the newest revision it names. And an owner who
    replaces the content (a re-pack encrypted afresh) continues the series (``encrypt
    --continue``): readers take the new cube and still refuse the revisions it replaces."""
    second = scene["commits"][1]
    carol = client(scene, monkeypatch, "carol")
    with pytest.raises(VerificationFailed) as refused:
        pull(f"{REPO}@main", local_dir=scene["tmp"] / "carol", trusted_keys=[scene["owner_pub"]],
             **carol)
    [found] = replay_failures(refused.value.report)
    assert f"commit {second}" in found.detail
    pull(f"{REPO}@{second}", local_dir=scene["tmp"] / "carol", trusted_keys=[scene["owner_pub"]],
         **carol)
    # The owner, on a machine that never saw generation 2, encrypts the clear cube afresh,
    # continuing a pull of the cube (the replay's, even: --continue takes the higher).
    owner = client(scene, monkeypatch, "owner-laptop")
    old = scene["tmp"] / "old"
    pull(f"{REPO}@{second}", local_dir=old, verify_cube=False, **owner)
    fresh = private_copy(packed, scene["tmp"] / "fresh", [scene["keys"]["alice"][1]],
                         sign_key=scene["owner"], continue_from=old)
    assert fresh.name == "fresh"
    pushed = push(fresh, REPO, allow_local_paths=True, **scene["options"]).commit_sha
    client(scene, monkeypatch, "carol")
    result = pull(f"{REPO}@main", local_dir=scene["tmp"] / "carol-fresh",
                  trusted_keys=[scene["owner_pub"]], **carol)
    assert result.commit_sha == pushed
    push(scene["bobs"], REPO, allow_local_paths=True, **scene["options"])  # bob, again
    with pytest.raises(VerificationFailed) as refused:
        pull(f"{REPO}@main", local_dir=scene["tmp"] / "carol-again",
             trusted_keys=[scene["owner_pub"]], **carol)
    assert "generation 3" in str(replay_failures(refused.value.report)[0])


def test_a_replay_on_another_branch_is_compared_with_every_branch(scene, monkeypatch):
    """A branch made at generation 1 (which never saw generation 2): pulling it is compared
    with main's history too."""
    from huggingface_hub import HfApi

    first = scene["commits"][0]
    HfApi(endpoint=scene["hub"].url, token=HUB_TOKEN).create_branch(
        REPO, branch="old", revision=first, repo_type="dataset")
    carol = client(scene, monkeypatch, "carol")
    with pytest.raises(VerificationFailed) as refused:
        pull(f"{REPO}@old", local_dir=scene["tmp"] / "carol", trusted_keys=[scene["owner_pub"]],
             **carol)
    [found] = replay_failures(refused.value.report)
    assert scene["commits"][1] in found.detail and "branches main, old" in found.detail


def test_rekey_under_a_trusted_key_refuses_the_replay_the_same_way(scene, monkeypatch):
    keys = scene["keys"]
    alice = client(scene, monkeypatch, "alice")
    folder = scene["tmp"] / "alice-replay"
    pull(f"{REPO}@main", local_dir=folder, verify_cube=False, **alice)
    with pytest.raises(RefusedError, match="would re-add") as refused:
        rekey(folder, keys["alice"][0], add=[keys["carol"][1]],
              trusted_keys=[scene["owner_pub"]])
    assert keys["bob"][1][:20] in str(refused.value)
