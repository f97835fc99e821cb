"""Real use, as a new user meets it: through the CLI, in temporary folders, against a local
endpoint in its own process. Nothing a user had is lost; valid cubes are accepted; every exit
code and message says what the README says."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.hub import pull, push

from helpers import build_cache, copy_of, tree_bytes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def cli(hub, tmp_path):
    """Run ``cubepack ...`` in a fresh process, in ``tmp_path/work``, configured only by the
    Hub's own environment variables, as a user's shell would be."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "user-cache"),
               HF_HUB_DISABLE_PROGRESS_BARS="1")

    def run(*args, cwd=work):
        done = subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout, done.stderr
    run.work = work
    return run


def published(hub, cube, repo="ns/cube"):
    return push(cube, repo, endpoint=hub.url, allow_local_paths=True, tag="v1").commit_sha


# --- pulling never loses a file -------------------------------------------------------------

def test_pull_into_a_folder_with_other_files_is_refused_before_any_download(hub, cube, cli):
    published(hub, cube)
    target = cli.work / "Documents"
    target.mkdir()
    (target / "thesis.txt").write_text("four years of work")
    hub.stats.reset()
    code, out, err = cli("pull", "ns/cube", "--local-dir", target)
    assert code == 2 and "thesis.txt" in err and "--force" in err
    assert tree_bytes(target) == {"thesis.txt": b"four years of work"}
    assert not [key for key in hub.stats.requests if "/resolve/" in key]
    code, _, err = cli("pull", "someone/Documents")  # the default target ./Documents, too
    assert code == 2 and "thesis.txt" in err
    code, _, _ = cli("pull", "ns/cube", "--local-dir", target, "--force")
    assert code == 0 and "thesis.txt" not in tree_bytes(target)


def test_pull_replaces_absent_empty_and_unchanged_earlier_pulls_only(hub, cube, cli):
    published(hub, cube)
    assert cli("pull", "ns/cube", "--local-dir", "fresh")[0] == 0            # absent
    (cli.work / "empty").mkdir()
    assert cli("pull", "ns/cube", "--local-dir", "empty")[0] == 0            # empty
    assert cli("pull", "ns/cube@v1", "--local-dir", "fresh")[0] == 0         # earlier pull
    (cli.work / "fresh" / "my-notes.md").write_text("mine")
    code, _, err = cli("pull", "ns/cube", "--local-dir", "fresh")             # something added
    assert code == 2 and "my-notes.md" in err
    assert (cli.work / "fresh" / "my-notes.md").read_text() == "mine"


def test_force_never_replaces_the_current_folder_home_or_cache(hub, cube, cli):
    published(hub, cube)
    (cli.work / "keep.txt").write_text("x")
    for target in (".", str(cli.work), str(cli.work.parent)):
        code, _, err = cli("pull", "ns/cube", "--local-dir", target, "--force")
        assert code == 2 and "current directory" in err
    assert (cli.work / "keep.txt").read_text() == "x"


# --- valid cubes are accepted --------------------------------------------------------------

def test_a_pinned_model_the_endpoint_does_not_host_is_unverified_not_fatal(
        hub, packed_cube_factory, hub_cached, tmp_path, monkeypatch):
    from huggingface_hub import constants as hub_constants

    cube = tmp_path / "pinned"
    shutil.copytree(packed_cube_factory(), cube)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cubepack.pack(cube, model=hub_cached["repo_id"])  # pinned to tiny-org/model-a@commit
    monkeypatch.delenv("HF_HUB_OFFLINE")
    sha = push(cube, "ns/pinned", endpoint=hub.url, allow_local_paths=True).commit_sha
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    result = pull(f"ns/pinned@{sha}", endpoint=hub.url, local_dir=tmp_path / "out",
                  cache_dir=tmp_path / "c")
    [remote] = [c for c in result.report.checks if c.name == "remote model"]
    assert remote.ok is None and remote.detail.startswith("unverified:")
    with pytest.raises(cubepack.VerificationFailed, match="remote model"):
        pull(f"ns/pinned@{sha}", endpoint=hub.url, local_dir=tmp_path / "strict",
             cache_dir=tmp_path / "c", strict_models=True)


def test_an_offline_pull_by_tag_works_after_an_online_pull_by_that_tag(hub, cube, tmp_path):
    sha = published(hub, cube)
    pull("ns/cube@v1", endpoint=hub.url, local_dir=tmp_path / "online", cache_dir=tmp_path / "c")
    hub.stats.reset()
    result = pull("ns/cube@v1", endpoint=hub.url, local_dir=tmp_path / "online",
                  cache_dir=tmp_path / "c", offline=True)
    assert result.commit_sha == sha and result.report.ok
    assert sum(hub.stats.requests.values()) == 0


def test_folders_made_by_the_hf_tools_verify(hub, cube, tmp_path):
    from huggingface_hub import snapshot_download

    published(hub, cube)
    local = Path(snapshot_download("ns/cube", repo_type="dataset", endpoint=hub.url,
                                   local_dir=tmp_path / "hf-local-dir",
                                   cache_dir=tmp_path / "c"))
    assert list((local / ".cache" / "huggingface").rglob("*"))  # the tool's bookkeeping
    assert cubepack.verify(local).ok
    snapshot = Path(snapshot_download("ns/cube", repo_type="dataset", endpoint=hub.url,
                                      cache_dir=tmp_path / "c"))
    assert (snapshot / constants.LOCK_FILENAME).is_symlink() and cubepack.verify(snapshot).ok
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    os.symlink(outside, snapshot / "stray.json")
    failures = cubepack.verify(snapshot, raise_on_failure=False).failures
    assert any(f.name == "path" and f.subject == "stray.json" and "outside" in f.detail
               for f in failures)


# --- stable re-packs and diff ----------------------------------------------------------------

def test_a_repack_keeps_the_license_and_diff_explains_every_change(cube, zoo, models, cli):
    cubepack.pack(cube, license="apache-2.0", pretty_name="Tea cube")
    before = copy_of(cube, cli.work)
    cubepack.pack(cube)  # no flags: the license and name are kept
    card = (cube / "README.md").read_text()
    assert "license: apache-2.0" in card and "# Tea cube" in card
    assert cubepack.diff(before, cube)["same"] is True
    cache = build_cache(models["a"], torch.tensor([[40, 41, 42, 43, 44, 45]]))
    cubepack.save_kv_cache(cache, cube / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(cube)
    code, out, _ = cli("diff", before, cube)
    assert code == 0 and "changed: activation item-1:" in out and "  sha256: " in out
    assert "changed: file activations/item-1.kv.safetensors:" in out
    code, _, err = cli("diff", before, zoo["a"])
    assert code == 2 and "not a packed cube" in err


OTHER = os.environ.get("CUBEPACK_OTHER_PYTHON")


@pytest.mark.skipif(not OTHER, reason="CUBEPACK_OTHER_PYTHON not set (make test sets it)")
def test_repacking_under_the_other_transformers_major_keeps_the_content_digest(cube, tmp_path):
    other = copy_of(cube, tmp_path / "other")
    done = subprocess.run([OTHER, "-m", "cubepack", "pack", str(other), "--json"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=""), check=False)
    assert done.returncode == 0, done.stderr
    mine = json.loads((cube / constants.LOCK_FILENAME).read_text())
    theirs = json.loads((other / constants.LOCK_FILENAME).read_text())
    assert theirs["content_digest"] == mine["content_digest"]


# --- the CLI contract ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["verify", "missing"], ["pack", "missing"], ["inspect", "missing"], ["diff", "missing", "x"],
    ["push", "missing", "ns/x"], ["sign", "missing", "--key", "k"], ["upgrade", "missing",
                                                                     "--model", "m"],
    ["fingerprint", "./missing"], ["pull", "ns/x@a", "--revision", "b"],
    ["pull", "ns/x", "--no-verify", "--require-signature"], ["pull", "not a repo"],
])
def test_every_missing_path_or_conflicting_flag_exits_2(cli, args):
    code, _, err = cli(*args)
    assert code == 2, err
    assert "Traceback" not in err


def test_json_is_printed_on_refusal_too(hub, cube, cli):
    published(hub, cube)
    flip = cube / "activations" / "item-1.kv.safetensors"
    data = bytearray(flip.read_bytes())
    data[-1] ^= 1
    flip.write_bytes(bytes(data))
    code, out, _ = cli("verify", cube, "--json")
    refusal = json.loads(out)
    assert code == 1 and refusal["ok"] is False
    assert refusal["error"]["type"] == "VerificationFailed" and refusal["error"]["exit_code"] == 1
    report = refusal["report"]
    assert report["ok"] is False
    not_run = {c["check"]: c["detail"] for c in report["checks"] if c["ok"] is None}
    assert not_run["signature"].startswith("not run") and "model identity" in not_run
    assert {c["check"] for c in report["checks"]} >= {"lock", "path", "file set", "size",
                                                      "sha256", "content", "kv header"}
    code, out, _ = cli("pull", "ns/nothing", "--json", "--local-dir", "x")
    error = json.loads(out)
    assert code == 3 and error["ok"] is False and error["error"]["type"] == "HubError"


def test_a_port_in_use_names_the_option(cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = cli("hub", "serve", "--port", port, "--root", "hub")
    assert code == 2 and "--port" in err


def test_push_tag_is_checked_before_anything_is_committed(hub, cube, models):
    published(hub, cube)  # tag v1 -> the first commit
    cache = build_cache(models["a"], torch.tensor([[50, 51, 52, 53, 54, 55]]))
    cubepack.save_kv_cache(cache, cube / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(cube)
    head = hub.store.resolve(__import__("cubepack.localhub._store", fromlist=["x"]).repo_ref(
        "datasets", "ns", "cube"), "main")
    commits = hub.stats.commits
    with pytest.raises(cubepack.HubError, match="Nothing was pushed"):
        push(cube, "ns/cube", endpoint=hub.url, allow_local_paths=True, tag="v1")
    assert hub.stats.commits == commits
    assert hub.store.resolve(__import__("cubepack.localhub._store", fromlist=["x"]).repo_ref(
        "datasets", "ns", "cube"), "main") == head


def test_twelve_concurrent_pushes_of_different_cubes_land_whole_or_conflict(hub, cube,
                                                                            tmp_path):
    """Twelve pushes of different cubes at once: each commit names its parent; a push whose
    parent went stale because another cube landed stops with PushConflict (issue #40: the
    loser is told to pull, re-pack and push again, never silently overwrites the winner).
    At least one lands; every commit made holds exactly its pusher's cube; the branch holds the
    last one."""
    from cubepack._util.hashing import sha256_file
    from cubepack.localhub._store import repo_ref

    cubes = []
    for index in range(12):
        folder = copy_of(cube, tmp_path / f"pusher-{index}")
        (folder / "notes.txt").write_text(f"written by pusher {index}\n")
        cubepack.pack(folder)
        cubes.append(folder)
    push(cube, "ns/race", endpoint=hub.url, allow_local_paths=True)  # the repo exists
    start, outcomes = threading.Barrier(len(cubes)), {}

    def run(index):
        start.wait()
        try:
            outcomes[index] = push(cubes[index], "ns/race", endpoint=hub.url,
                                   allow_local_paths=True, timeout=900)
        except cubepack.CubepackError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(cubes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    assert not any(thread.is_alive() for thread in threads), "a push hung"
    assert len(outcomes) == 12
    failed = {i: o for i, o in outcomes.items() if isinstance(o, Exception)}
    assert all(isinstance(o, cubepack.PushConflict) for o in failed.values()), failed
    landed = {i: o for i, o in outcomes.items() if i not in failed}
    assert landed and all("pull" in str(o) for o in failed.values())
    repo = repo_ref("datasets", "ns", "race")
    history = [record["id"] for record in hub.store.history(repo, "main")]
    assert {o.commit_sha for o in landed.values()} <= set(history)
    assert len({o.commit_sha for o in landed.values()}) == len(landed)
    assert hub.stats.commits == len(landed) + 1
    assert hub.store.resolve(repo, "main") in {o.commit_sha for o in landed.values()}
    for index, outcome in landed.items():  # each commit is exactly that pusher's cube
        tree = hub.store.commit(repo, outcome.commit_sha)["tree"]
        assert tree["notes.txt"]["sha256"] == sha256_file(cubes[index] / "notes.txt")
        assert tree["cubepack.lock"]["sha256"] == sha256_file(cubes[index] / "cubepack.lock")


def test_a_push_that_keeps_losing_the_race_stops_at_its_deadline(hub, cube, monkeypatch):
    """A stale parent every time: the push backs off and retries until the deadline would
    pass, then says so (no fixed attempt count)."""
    from cubepack.hub import _push

    push(cube, "ns/race", endpoint=hub.url, allow_local_paths=True)
    (cube / "notes.txt").write_text("a change\n")
    cubepack.pack(cube)
    hub.add_fault("412", path=r"/commit/", method="POST", times=10**6)
    waits = []
    monkeypatch.setattr(_push, "_back_off", lambda client, n: waits.append(n) or n < 6)
    with pytest.raises(cubepack.HubError, match=r"kept moving while pushing: another push landed "
                                                r"first 6 times before the push's deadline"):
        push(cube, "ns/race", endpoint=hub.url, allow_local_paths=True, timeout=60)
    assert waits == [1, 2, 3, 4, 5, 6]


def test_push_create_pr_then_pull_the_pr_verified_and_review_it_with_diff(hub, cube, models,
                                                                          cli, tmp_path):
    """The review flow the README shows, through the CLI: propose, pull the proposal and
    main into two folders (both verified), diff them; main moves only on merge."""
    from cubepack.localhub._store import repo_ref

    code, out, err = cli("push", cube, "ns/cube", "--allow-local-paths")
    assert code == 0, err
    repo = repo_ref("datasets", "ns", "cube")
    main_before = hub.store.resolve(repo, "main")
    cache = build_cache(models["a"], torch.tensor([[70, 71, 72, 73, 74]]))
    cubepack.save_kv_cache(cache, cube / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(cube)
    code, out, err = cli("push", cube, "ns/cube", "--allow-local-paths", "--create-pr")
    assert code == 0, err
    assert "as pull request #1 to ns/cube@main (which did not move)" in out
    assert "pull request: #1 (refs/pr/1)" in out
    assert "review it: cubepack pull ns/cube@refs/pr/1 --local-dir pr-1" in out
    assert hub.store.resolve(repo, "main") == main_before
    code, out, err = cli("pull", "ns/cube@refs/pr/1", "--verify", "--local-dir", "pr-1")
    assert code == 0, err
    assert f"resolved ns/cube@refs/pr/1 -> {hub.store.resolve(repo, 'refs/pr/1')}" in out
    assert cli("pull", "ns/cube", "--local-dir", "main")[0] == 0
    code, out, err = cli("diff", "main", "pr-1", "--json")
    assert code == 0, err
    changes = json.loads(out)
    assert list(changes["sections"]["activations"]["changed"]) == ["item-1"]
    assert "activations/item-1.kv.safetensors" in changes["sections"]["files"]["changed"]
    # A fix for the open request: --revision refs/pr/1 adds a commit to it; main stays put.
    (cube / "notes.txt").write_text("review fix\n")
    cubepack.pack(cube)
    code, out, err = cli("push", cube, "ns/cube", "--allow-local-paths", "--revision",
                         "refs/pr/1", "--json")
    added = json.loads(out)
    assert code == 0 and (added["pr_num"], added["pr_revision"]) == (1, "refs/pr/1"), err
    assert hub.store.resolve(repo, "refs/pr/1") == added["commit_sha"]
    assert cli("pull", "ns/cube@refs/pr/1", "--local-dir", "pr-1b")[0] == 0
    assert (cli.work / "pr-1b" / "notes.txt").read_text() == "review fix\n"
    code, _, err = cli("push", cube, "ns/cube", "--allow-local-paths", "--revision", "refs/pr/9")
    assert code == 2 and "no pull request refs/pr/9" in err and "--create-pr" in err
    code, out, err = cli("push", cube, "ns/cube", "--allow-local-paths", "--create-pr", "--json")
    second = json.loads(out)  # main still differs: a second proposal
    assert code == 0 and (second["pr_num"], second["pr_revision"]) == (2, "refs/pr/2")
    assert second["pr_url"].endswith("/datasets/ns/cube/discussions/2")
    code, out, err = cli("push", cube, "ns/cube", "--allow-local-paths", "--create-pr",
                         "--tag", "v2")
    assert code == 2 and "--tag cannot be combined with --create-pr" in err


def test_push_create_pr_in_python_reports_the_request(hub, cube):
    from cubepack.localhub._store import repo_ref

    first = push(cube, "ns/cube", endpoint=hub.url, allow_local_paths=True)
    (cube / "notes.txt").write_text("proposed\n")
    cubepack.pack(cube)
    proposed = push(cube, "ns/cube", endpoint=hub.url, allow_local_paths=True, create_pr=True)
    assert (proposed.pr_num, proposed.pr_revision) == (1, "refs/pr/1") and proposed.changed
    assert proposed.pr_url == f"{hub.url}/datasets/ns/cube/discussions/1"
    assert "notes.txt" in proposed.uploaded and proposed.branch == "main"
    assert hub.store.resolve(repo_ref("datasets", "ns", "cube"), "main") == first.commit_sha
    pulled = pull("ns/cube@refs/pr/1", endpoint=hub.url, local_dir=cube.parent / "pr",
                  cache_dir=cube.parent / "hf")
    assert pulled.commit_sha == proposed.commit_sha and pulled.report.ok
    assert (cube.parent / "pr" / "notes.txt").read_text() == "proposed\n"
    landed = push(cube, "ns/cube", endpoint=hub.url, allow_local_paths=True)
    assert landed.changed and landed.pr_num is None and landed.pr_revision is None


# --- messages that are true ------------------------------------------------------------------

def test_pack_summary_names_what_was_and_was_not_pinned(cube, zoo, cli):
    config = json.loads((cube / "config.json").read_text())
    config["text_mem"] = {"backend": "general_text", "config": {
        "embedder": {"backend": "ollama", "config": {"model_name_or_path": "nomic-embed-text"}}}}
    (cube / "config.json").write_text(json.dumps(config))
    code, out, _ = cli("pack", cube, "--model", zoo["a"])
    assert code == 0
    assert f"model act_mem: {zoo['a']} (a local folder" in out
    assert "model text_mem.embedder: nomic-embed-text: not pinned" in out
    assert "weights digest" not in out.split("text_mem.embedder")[1]


def test_inspect_on_a_json_file_says_it_is_not_a_kv_file(cube, cli):
    code, _, err = cli("inspect", cube / "config.json")
    assert code == 1 and "not a safetensors (KV) file: it looks like JSON" in err


# --- the README, as a new user runs it -------------------------------------------------------

def test_the_readme_cli_walkthrough_runs_as_written(cube, tmp_path):
    """Serve a local endpoint, pack, verify, push, pull at the SHA, inspect: the commands the
    README shows, in a fresh folder, each in its own process."""
    port = free_port()
    work = tmp_path / "newcomer"
    work.mkdir()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{port}",
               HF_HUB_CACHE=str(tmp_path / "newcomer-cache"), CUBEPACK_NO_PROGRESS="1")
    server = subprocess.Popen([sys.executable, "-m", "cubepack", "hub", "serve", "--root", "hub",
                               "--port", str(port)], cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert "serving" in server.stdout.readline()

        def cubepack_cli(*args):
            done = subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        shutil.copytree(cube, work / "my_cube")
        cubepack_cli("pack", "my_cube")
        cubepack_cli("verify", "my_cube")
        pushed = json.loads(cubepack_cli("push", "my_cube", "me/my_cube", "--tag", "v1", "--json",
                                         "--allow-local-paths"))
        pulled = json.loads(cubepack_cli("pull", f"me/my_cube@{pushed['commit_sha']}",
                                         "--local-dir", "cube", "--json"))
        assert pulled["verified"] and pulled["commit_sha"] == pushed["commit_sha"]
        assert "cubepack.kv v3" in cubepack_cli("inspect", "cube/activations/item-1.kv.safetensors")
    finally:
        server.terminate()
        server.wait()
