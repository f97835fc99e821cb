"""Push and pull through the real huggingface_hub client, over HTTP, against the local endpoint."""

from __future__ import annotations

import re

import pytest
import torch

import cubepack
from cubepack import HubError, VerificationFailed
from cubepack._util import hashing
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import build_cache, copy_of, pulled_files, reseal_lock, tree_bytes
from memos_format import write_cube

TOKEN = "writer-token"
ITEMS = {"item-1": [5, 6, 7, 8, 9, 10], "item-2": [11, 12, 13, 14], "item-3": [20, 21, 22]}


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub-root", tokens=[TOKEN]) as server:
        yield server


@pytest.fixture(scope="module")
def packed_cube(packed_cube_factory):
    return packed_cube_factory(ITEMS)


@pytest.fixture
def cube(packed_cube, tmp_path):
    return copy_of(packed_cube, tmp_path)


def do_push(hub, cube, repo="ns/cube", **kwargs):
    kwargs.setdefault("allow_local_paths", True)  # test cubes name their model by a tmp path
    return push(cube, repo, endpoint=hub.url, token=TOKEN, **kwargs)


def do_pull(hub, repo, target, tmp_path, **kwargs):
    kwargs.setdefault("cache_dir", tmp_path / "hf-cache")
    return pull(repo, endpoint=hub.url, token=TOKEN, local_dir=target, **kwargs)


def locked_files(cube):
    """The cube's files as a pull reproduces them (the endpoint adds .gitattributes)."""
    return tree_bytes(cube)


@pytest.mark.parametrize("how", ["sha", "tag", "branch"])
def test_push_then_pull_by_sha_tag_and_branch(hub, cube, tmp_path, how):
    pushed = do_push(hub, cube, tag="v1")
    assert pushed.changed and len(pushed.commit_sha) == 40
    assert hub.stats.commits == 1
    spec = {"sha": f"ns/cube@{pushed.commit_sha}", "tag": "ns/cube@v1", "branch": "ns/cube@main"}[how]
    result = do_pull(hub, spec, tmp_path / "out", tmp_path)
    assert result.commit_sha == pushed.commit_sha
    pulled = pulled_files(tmp_path / "out")
    assert pulled.pop(".gitattributes")
    assert (tmp_path / "out" / ".cache/cubepack/origin.json").is_file()
    assert pulled == locked_files(cube)
    assert result.report.ok


def test_pulling_the_pinned_sha_after_the_branch_moved_returns_the_old_content(hub, cube, models,
                                                                               tmp_path):
    first = do_push(hub, cube)
    old = locked_files(cube)
    cache = build_cache(models["a"], torch.tensor([[30, 31, 32, 33]]))
    cubepack.save_kv_cache(cache, cube / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(cube)
    second = do_push(hub, cube)
    assert second.commit_sha != first.commit_sha
    result = do_pull(hub, f"ns/cube@{first.commit_sha}", tmp_path / "old", tmp_path)
    pulled = pulled_files(tmp_path / "old")
    pulled.pop(".gitattributes")
    assert result.commit_sha == first.commit_sha and pulled == old
    latest = do_pull(hub, "ns/cube", tmp_path / "new", tmp_path)
    assert latest.commit_sha == second.commit_sha


def _existing_dir(tmp_path):
    target = tmp_path / "existing"
    target.mkdir()
    (target / "keep.txt").write_text("the folder as it was")
    return target, tree_bytes(target)


def test_same_size_corrupted_blob_is_refused_naming_the_file(hub, cube, tmp_path):
    do_push(hub, cube)
    item = "activations/item-2.kv.safetensors"
    blob = hub.store.blob_path(hashing.sha256_file(cube / item))
    data = bytearray(blob.read_bytes())
    data[-10] ^= 0xFF
    blob.write_bytes(bytes(data))
    target, before = _existing_dir(tmp_path)
    with pytest.raises(VerificationFailed) as caught:
        do_pull(hub, "ns/cube", target, tmp_path, force=True)
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", item)]
    assert "ns/cube@" in str(caught.value)
    assert "HF cache" not in str(caught.value)  # downloaded into the staging folder, now gone
    assert not list((tmp_path / "hf-cache").rglob("blobs/*"))
    assert tree_bytes(target) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".existing")] == []
    blob.write_bytes(bytes(data[:-10]) + bytes([data[-10] ^ 0xFF]) + bytes(data[-9:]))
    assert do_pull(hub, "ns/cube", target, tmp_path, force=True).report.ok  # honest bytes


def test_a_ref_named_like_a_commit_cannot_shadow_it(hub, cube, models, tmp_path):
    good = do_push(hub, cube).commit_sha
    cache = build_cache(models["a"], torch.tensor([[30, 31, 32, 33, 34, 35]]))
    cubepack.save_kv_cache(cache, cube / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(cube)
    other = do_push(hub, cube, revision="evil").commit_sha
    from cubepack._util import canonical
    from cubepack.localhub._store import repo_ref

    # The endpoint itself refuses a branch named like a commit: forge it, as a hostile one would.
    repo = repo_ref("datasets", "ns", "cube")
    refs = hub.store.refs(repo)
    refs["branches"][good] = other
    (hub.store._dir(repo) / "refs.json").write_text(canonical.dumps(refs))
    with pytest.raises(HubError) as caught:
        do_pull(hub, f"ns/cube@{good}", tmp_path / "x", tmp_path)
    assert good in str(caught.value) and other in str(caught.value)
    assert "shadows it" in str(caught.value) and not (tmp_path / "x").exists()
    with pytest.raises(cubepack.UsageError, match="lower case"):
        do_pull(hub, f"ns/cube@{good.upper()}", tmp_path / "x", tmp_path)


def test_a_hostile_tree_listing_is_refused_before_any_download(hub, cube, tmp_path):
    from cubepack.localhub._store import repo_ref

    do_push(hub, cube)
    repo = repo_ref("datasets", "ns", "cube")
    head = hub.store.resolve(repo, "main")
    tree = dict(hub.store.commit(repo, head)["tree"])
    tree["a////x"] = tree["cubepack.lock"]  # the store itself refuses such paths: forge it
    forged = hub.store._write_commit(repo, parents=[head], tree=tree, title="forged", message="")
    hub.stats.reset()
    with pytest.raises(cubepack.UnsafeInputError, match=r"'a////x'"):
        do_pull(hub, f"ns/cube@{forged}", tmp_path / "x", tmp_path)
    assert not [key for key in hub.stats.requests if "/resolve/" in key]
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*x"))


@pytest.mark.parametrize("name, rule", [("aux.txt", "a device name Windows reserves"),
                                        ("notes./a.txt", "ending in a dot or a space"),
                                        ("a?.txt", "which Windows forbids"),
                                        ("CUBEPACK.LOCK", "collide")])
def test_a_listing_with_a_name_some_system_cannot_hold_is_refused_before_download(
        hub, cube, tmp_path, name, rule):
    from cubepack.localhub._store import repo_ref

    do_push(hub, cube)
    repo = repo_ref("datasets", "ns", "cube")
    head = hub.store.resolve(repo, "main")
    tree = dict(hub.store.commit(repo, head)["tree"])
    tree[name] = tree["README.md"]  # the store refuses such paths itself: forge the commit
    forged = hub.store._write_commit(repo, parents=[head], tree=tree, title="forged", message="")
    hub.stats.reset()
    with pytest.raises(cubepack.UnsafeInputError, match=re.escape(repr(name)) + ".*" + rule):
        do_pull(hub, f"ns/cube@{forged}", tmp_path / "x", tmp_path)
    assert not [key for key in hub.stats.requests if "/resolve/" in key]


def test_the_endpoint_stores_names_the_hub_takes_and_pull_refuses_them_in_a_cube(
        hub, cube, tmp_path):
    """The endpoint is a Hub stand-in: it takes 'a?.txt' as the Hub does (huggingface_hub's
    own tests upload such names); the portability rule is cubepack's, for cubes, at pull."""
    do_push(hub, cube)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "a?.txt").write_text("awful but allowed\n")
    upload_folder(hub.url, "ns/cube", extra, repo_type="dataset", token=TOKEN)
    with pytest.raises(cubepack.UnsafeInputError, match="which Windows forbids"):
        do_pull(hub, "ns/cube", tmp_path / "x", tmp_path)


def test_files_the_lock_does_not_list_are_refused_before_download(hub, cube, tmp_path):
    from cubepack.testing.blobs import write_safetensors_blob

    do_push(hub, cube)
    extra = write_safetensors_blob(tmp_path / "extra" / "big.safetensors", 2_000_000)
    upload_folder(hub.url, "ns/cube", extra.parent, repo_type="dataset", token=TOKEN)
    hub.stats.reset()
    with pytest.raises(VerificationFailed, match="big.safetensors: not listed in the lock; "
                                                 "refused before download"):
        do_pull(hub, "ns/cube", tmp_path / "x", tmp_path)
    assert not [key for key in hub.stats.requests if "big.safetensors" in key and "GET" in key]


def test_an_offline_revision_never_leaves_refs_nor_echoes_a_file(hub, cube, tmp_path):
    secret = tmp_path / "hf-cache" / "secret-token"
    secret.parent.mkdir(parents=True)
    secret.write_text("hf_SECRET_TOKEN_VALUE")
    for revision in ("../../secret-token", "../../../x", "/etc/passwd", "main/../../x"):
        with pytest.raises(cubepack.UsageError) as caught:
            do_pull(hub, f"ns/cube@{revision}", tmp_path / "x", tmp_path, offline=True)
        assert "hf_SECRET" not in str(caught.value)
        assert "not a valid branch or tag name" in str(caught.value)


def test_a_pull_request_ref_is_a_revision_online_and_then_offline(hub, cube, tmp_path):
    """refs/pr/N passes the ref-name rule: pulled by it online, then offline from the ref the
    online pull recorded, both at the proposal's commit."""
    from cubepack._util.revision import check_ref_name

    assert check_ref_name("refs/pr/12") == "refs/pr/12"
    do_push(hub, cube)
    (cube / "notes.txt").write_text("proposed\n")
    cubepack.pack(cube)
    proposed = do_push(hub, cube, create_pr=True)
    online = do_pull(hub, "ns/cube@refs/pr/1", tmp_path / "pr", tmp_path)
    offline = do_pull(hub, "ns/cube@refs/pr/1", tmp_path / "pr", tmp_path, offline=True)
    assert online.commit_sha == offline.commit_sha == proposed.commit_sha
    assert online.report.ok and offline.report.ok


@pytest.fixture
def retries_without_waits(monkeypatch):
    """huggingface_hub retries a failed download as before (as many times), without its
    backoff waits (1 + 2 + 4 + 8 + 8 s in 0.36): the outcome under test is the same."""
    import types

    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    for module in (_http, file_download):
        clock = {name: getattr(module.time, name) for name in dir(module.time)
                 if not name.startswith("_")}
        monkeypatch.setattr(module, "time", types.SimpleNamespace(
            **{**clock, "sleep": lambda seconds: None}))


@pytest.mark.parametrize("kind", ["500", "drop", "truncate"])
def test_server_failing_mid_download_leaves_the_folder_untouched(hub, cube, tmp_path, kind,
                                                                  retries_without_waits):
    do_push(hub, cube)
    fault = hub.add_fault(kind, path=r"/resolve/.*item-3", method="GET", times=1000)
    target, before = _existing_dir(tmp_path)
    with pytest.raises((HubError, VerificationFailed)) as caught:
        do_pull(hub, "ns/cube", target, tmp_path, force=True)
    assert "\n" not in str(caught.value).strip() or isinstance(caught.value, VerificationFailed)
    assert tree_bytes(target) == before
    fault.times = 0  # the server recovers: a later pull succeeds and replaces the folder
    result = do_pull(hub, "ns/cube", target, tmp_path, force=True)
    assert result.report.ok and "keep.txt" not in tree_bytes(target)


def test_unknown_repo_revision_and_private_repo_are_one_clear_sentence(hub, cube, tmp_path):
    with pytest.raises(HubError) as unknown_repo:
        do_pull(hub, "ns/nothing-here", tmp_path / "x", tmp_path)
    assert "was not found" in str(unknown_repo.value)
    do_push(hub, cube)
    with pytest.raises(HubError) as unknown_revision:
        do_pull(hub, "ns/cube@no-such-tag", tmp_path / "x", tmp_path)
    assert "has no branch, tag or commit named 'no-such-tag'" in str(unknown_revision.value)
    do_push(hub, cube, repo="ns/secret", private=True)
    with pytest.raises(HubError) as private:
        pull("ns/secret", endpoint=hub.url, token=False, local_dir=tmp_path / "x",
             cache_dir=tmp_path / "c")
    assert "private and no valid token" in str(private.value)
    for error in (unknown_repo.value, unknown_revision.value, private.value):
        assert str(error).count("\n") == 0 and str(error).endswith(".")
    assert not (tmp_path / "x").exists()


def test_push_without_a_token_is_refused_clearly(hub, cube):
    with pytest.raises(HubError) as caught:
        push(cube, "ns/cube", endpoint=hub.url, token=False, allow_local_paths=True)
    assert "token" in str(caught.value)


def test_repush_unchanged_makes_no_commit_and_a_changed_item_uploads_only_its_bytes(hub, cube,
                                                                                    models):
    first = do_push(hub, cube)
    again = do_push(hub, cube)
    assert (again.changed, again.commit_sha, hub.stats.commits) == (False, first.commit_sha, 1)

    item = cube / "activations" / "item-2.kv.safetensors"
    cache = build_cache(models["a"], torch.tensor([[40, 41, 42, 43, 44]]))
    cubepack.save_kv_cache(cache, item, producer=models["a"], metadata={"id": "item-2"})
    cubepack.pack(cube)
    hub.stats.reset()
    changed = do_push(hub, cube)
    assert changed.changed and hub.stats.commits == 1
    assert changed.uploaded == ["README.md", "activations/item-2.kv.safetensors", "cubepack.lock"]
    lfs = {key: count for key, count in hub.stats.uploaded_bytes.items() if key.startswith("lfs:")}
    assert lfs == {f"lfs:{hashing.sha256_file(item)}": item.stat().st_size}
    regular = {key for key in hub.stats.uploaded_bytes if key.startswith("file:")}
    assert regular == {"file:README.md", "file:cubepack.lock"}


def test_push_refuses_an_unverified_cube_before_any_request(hub, cube):
    (cube / "config.json").write_text("{}")
    with pytest.raises(VerificationFailed):
        do_push(hub, cube)
    assert sum(hub.stats.requests.values()) == 0


def test_push_deletes_files_the_cube_no_longer_has(hub, cube, tmp_path):
    do_push(hub, cube)
    (cube / "activations" / "item-3.kv.safetensors").unlink()
    cubepack.pack(cube)
    result = do_push(hub, cube)
    assert result.deleted == ["activations/item-3.kv.safetensors"]
    do_pull(hub, "ns/cube", tmp_path / "out", tmp_path)
    assert not (tmp_path / "out" / "activations" / "item-3.kv.safetensors").exists()


@pytest.fixture
def hub_pinned_cube(hub, zoo, models, tmp_path):
    """Model A pushed to the endpoint as a model repo; a cube packed against that snapshot."""
    from huggingface_hub import snapshot_download

    upload_folder(hub.url, "tiny-org/model-a", zoo["a"], token=TOKEN)
    snapshot = snapshot_download("tiny-org/model-a", endpoint=hub.url, cache_dir=tmp_path / "models")
    caches = {"item-1": build_cache(models["a"], torch.tensor([[5, 6, 7]]))}
    cube = write_cube(tmp_path / "pinned", snapshot, caches)
    result = cubepack.pack(cube, legacy_pickle=True)
    assert result.models["act_mem"]["repo_id"] == "tiny-org/model-a"
    return cube


def test_verify_remote_checks_pins_against_hub_metadata(hub, hub_pinned_cube):
    report = cubepack.hub.verify_remote(hub_pinned_cube, endpoint=hub.url, token=TOKEN)
    assert [c.ok for c in report.checks if c.name == "remote model"] == [True]


def test_verify_remote_refuses_an_altered_weights_digest_without_downloading_weights(
        hub, hub_pinned_cube):
    def alter(lock):
        identity = lock["models"]["act_mem"]["identity"]
        identity["weights_digest"] = "sha256:" + "0" * 64
    reseal_lock(hub_pinned_cube, alter)
    hub.stats.reset()
    report = cubepack.hub.verify_remote(hub_pinned_cube, endpoint=hub.url, token=TOKEN,
                             raise_on_failure=False)
    failures = [c for c in report.failures if c.name == "remote model"]
    assert failures and "weights_digest" in failures[0].subject
    downloads = [key for key in hub.stats.requests if "/resolve/" in key and "safetensors" in key]
    assert downloads == []


def test_a_pinned_revision_that_no_longer_exists_is_a_clear_error(hub, hub_pinned_cube):
    reseal_lock(hub_pinned_cube,
                lambda lock: lock["models"]["act_mem"].update(revision="f" * 40))
    report = cubepack.hub.verify_remote(hub_pinned_cube, endpoint=hub.url, token=TOKEN,
                             raise_on_failure=False)
    [failure] = [c for c in report.failures if c.name == "remote model"]
    assert "no longer exists" in failure.detail


def test_offline_pull_by_sha_from_its_folder_and_unseen_tag(hub, cube, tmp_path):
    pushed = do_push(hub, cube, tag="v1")
    do_pull(hub, f"ns/cube@{pushed.commit_sha}", tmp_path / "online", tmp_path)
    hub.stats.reset()
    result = do_pull(hub, f"ns/cube@{pushed.commit_sha}", tmp_path / "online", tmp_path,
                     offline=True)
    assert result.commit_sha == pushed.commit_sha and result.report.ok
    assert sum(hub.stats.requests.values()) == 0
    with pytest.raises(HubError) as caught:
        do_pull(hub, "ns/cube@v1", tmp_path / "never", tmp_path, offline=True)
    assert "never pulled by that name" in str(caught.value)
    with pytest.raises(HubError, match="neither at .* nor in the HF cache"):
        do_pull(hub, f"ns/cube@{'e' * 40}", tmp_path / "never", tmp_path, offline=True)


def test_cli_push_and_pull_report_the_sha(hub, cube, tmp_path):
    """The CLI in a fresh process, configured only by the Hub's own environment variables."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN,
               HF_HUB_CACHE=str(tmp_path / "cli-cache"), HF_HUB_DISABLE_PROGRESS_BARS="1")

    def cubepack_cli(*args):
        done = subprocess.run([sys.executable, "-m", "cubepack", *args], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout, done.stderr

    code, out, err = cubepack_cli("push", str(cube), "ns/cli", "--tag", "v1", "--json",
                                  "--allow-local-paths")
    assert code == 0, err
    pushed = json.loads(out)
    code, out, err = cubepack_cli("pull", "ns/cli@v1", "--local-dir", str(tmp_path / "out"), "--json")
    assert code == 0, err
    pulled = json.loads(out)
    assert pulled["commit_sha"] == pushed["commit_sha"] and pulled["verified"]
    code, out, _ = cubepack_cli("push", str(cube), "ns/cli", "--allow-local-paths")
    assert code == 0 and "no changes" in out
    code, _, err = cubepack_cli("pull", "ns/cli@nope", "--local-dir", str(tmp_path / "x"))
    assert code == 3 and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("spec", ["owner/cube\n", "\u00f3wner/cube", "owner/../x", "owner",
                                  "owner/cube/extra", "-owner/cube", "owner/cube.git"])
def test_a_repo_id_is_exactly_owner_name_in_the_hubs_ascii_characters(spec):
    """huggingface_hub 0.36's validator lets a trailing newline and non-ASCII through."""
    from cubepack.hub import parse_repo_spec

    with pytest.raises(cubepack.UsageError, match="not a repo id of the form owner/name"):
        parse_repo_spec(spec + "@main")
    assert parse_repo_spec("Owner_1/cube-2.v3@main") == ("Owner_1/cube-2.v3", "main")


@pytest.mark.parametrize("hostile", [[], {"hidden_size": "x", "num_attention_heads": 4},
                                     {"num_hidden_layers": 3_000_000_000}])
def test_a_hostile_config_on_the_endpoint_is_a_failed_check_not_a_crash(
        hub, hub_pinned_cube, tmp_path, hostile):
    """The endpoint's files are read as strictly as a cube's: a config.json that is a list, a
    string where a size goes, or a layer count that would build a 3e9-entry list is a failed
    'remote model' check, never an AttributeError, TypeError or MemoryError."""
    import json as json_module

    evil = tmp_path / "evil-config"
    evil.mkdir()
    (evil / "config.json").write_text(json_module.dumps(hostile))
    upload_folder(hub.url, "tiny-org/model-a", evil, token=TOKEN)  # main moves; pin is a commit

    def repoint(lock):  # the pin now names the commit holding the hostile config
        from huggingface_hub import HfApi

        head = HfApi(endpoint=hub.url, token=TOKEN).model_info("tiny-org/model-a").sha
        lock["models"]["act_mem"]["revision"] = head
    reseal_lock(hub_pinned_cube, repoint)
    report = cubepack.hub.verify_remote(hub_pinned_cube, endpoint=hub.url, token=TOKEN,
                                        raise_on_failure=False)
    remote = [c for c in report.checks if c.name == "remote model"]
    assert remote and all(c.ok is False for c in remote)
