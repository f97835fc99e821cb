"""The MemOS hook with the real MemoryOS package, tiny models and the local endpoint."""

from __future__ import annotations

import copy
import json
import logging
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import IdentityMismatch, VerificationFailed
from cubepack._util import hashing
from cubepack.hub import push
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import all_equal, continue_greedy, memos_kv_config

TEXTS = ["The user is a Chinese man.", "He likes green tea and long walks."]
QUESTION = [{"role": "user", "content": "What does the user drink?"}]


memos_config = memos_kv_config  # one owner: tests/support/helpers.py


def publish_model(hub, folder, repo_id="tiny-org/model-a"):
    return upload_folder(hub.url, repo_id, folder)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("hub-root")) as server:
        yield server


@pytest.fixture(scope="module")
def published(hub, zoo, tmp_path_factory):
    """Model A on the endpoint; a MemOS cube built from its snapshot, packed and pushed."""
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    model_commit = publish_model(hub, zoo["a"])
    snapshot = snapshot_download("tiny-org/model-a", revision=model_commit, endpoint=hub.url)
    cube = GeneralMemCube(memos_config(snapshot))
    items = [cube.act_mem.extract(text) for text in TEXTS]
    cube.act_mem.add(items)
    packed = hook.pack_cube(cube, tmp_path_factory.mktemp("packed") / "cube")
    pushed = push(packed, "ns/cube", endpoint=hub.url)
    return {"cube": cube, "items": items, "packed": packed, "sha": pushed.commit_sha,
            "model_commit": model_commit}


def test_pack_cube_writes_kv_files_no_pickle_and_the_hub_id(published):
    import json

    packed = published["packed"]
    assert not list(packed.rglob("*.pickle"))
    assert len(list((packed / "activations").glob("*.kv.safetensors"))) == 2
    config = json.loads((packed / "config.json").read_text())
    assert config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] == \
        "tiny-org/model-a"
    lock = json.loads((packed / "cubepack.lock").read_text())
    assert lock["models"]["act_mem"]["revision"] == published["model_commit"]


def test_round_trip_generates_with_the_loaded_cache_and_identical_logits(hub, published):
    loaded = hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url)
    assert loaded.cubepack.commit_sha == published["sha"]
    assert sorted(loaded.cubepack.loaded) == sorted(item.id for item in published["items"])
    original_model = published["cube"].act_mem.llm.model
    model = loaded.act_mem.llm.model
    for item in published["items"]:
        mine = loaded.act_mem.get(item.id).memory
        assert all_equal(continue_greedy(original_model, item.memory, 40, 4),
                         continue_greedy(model, mine, 40, 4))
        answer = loaded.act_mem.llm.generate(QUESTION, past_key_values=copy.deepcopy(mine))
        expected = published["cube"].act_mem.llm.generate(QUESTION,
                                                          past_key_values=copy.deepcopy(item.memory))
        assert isinstance(answer, str) and answer == expected


def test_the_hook_loads_the_pinned_commit_after_main_moved(hub, published, zoo):
    moved = publish_model(hub, zoo["b"])  # model A's repo, main now holds B's weights
    assert moved != published["model_commit"]
    loaded = hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url)
    live = cubepack.fingerprint(loaded.act_mem.llm.model)
    assert live.revision == published["model_commit"]
    assert live.weights_digest == cubepack.fingerprint(zoo["a"]).weights_digest
    assert len(loaded.cubepack.loaded) == 2


def test_a_pinned_producer_the_endpoint_cannot_serve_is_refused_by_name(published, tmp_path,
                                                                        monkeypatch):
    from huggingface_hub import constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with InstrumentedHub(tmp_path / "cube-only") as elsewhere:  # the cube, not its model
        sha = push(published["packed"], "ns/cube", endpoint=elsewhere.url).commit_sha
        with pytest.raises(cubepack.CubepackError) as caught:
            hook.init_from_remote_repo(f"ns/cube@{sha}", endpoint=elsewhere.url)
    message = str(caught.value)
    assert f"tiny-org/model-a@{published['model_commit']}" in message
    assert "cannot be downloaded" in message and "act_mem" in message and "HF cache" in message


def test_default_config_with_another_model_is_handled_by_the_policy(hub, published, zoo, caplog):
    spec = f"ns/cube@{published['sha']}"
    other = memos_config(zoo["b"])
    with pytest.raises(IdentityMismatch) as caught:
        hook.init_from_remote_repo(spec, endpoint=hub.url, default_config=other)
    assert caught.value.fields == ["weights_digest"]

    with caplog.at_level(logging.WARNING, logger="cubepack.memos"):
        dropped = hook.init_from_remote_repo(spec, endpoint=hub.url, default_config=other,
                                             on_mismatch="drop")
    assert dropped.act_mem.get_all() == [] and len(dropped.cubepack.dropped) == 2
    lines = [r.getMessage() for r in caplog.records if "dropped activation" in r.getMessage()]
    assert len(lines) == 2 and all("weights_digest" in line for line in lines)

    rebuilt = hook.init_from_remote_repo(spec, endpoint=hub.url, default_config=other,
                                         on_mismatch="rebuild")
    assert sorted(rebuilt.cubepack.rebuilt) == sorted(item.id for item in published["items"])
    model_b = rebuilt.act_mem.llm.model
    assert cubepack.fingerprint(model_b).weights_digest == cubepack.fingerprint(zoo["b"]).weights_digest
    for item in published["items"]:
        cache = rebuilt.act_mem.get(item.id).memory
        fresh = rebuilt.act_mem.extract(item.metadata["source_text"]).memory
        assert all_equal(continue_greedy(model_b, cache, 40, 3), continue_greedy(model_b, fresh, 40, 3))


@pytest.fixture
def installed():
    hook.install()
    hook.install()  # idempotent
    yield
    hook.uninstall()


def test_install_routes_general_mem_cube_through_cubepack(hub, published, installed, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.kv import KVCacheMemory

    pickle_loads = []
    real_load = KVCacheMemory.load
    monkeypatch.setattr(KVCacheMemory, "load",
                        lambda self, d: pickle_loads.append(d) or real_load(self, d))
    cube = GeneralMemCube.init_from_remote_repo(f"ns/cube@{published['sha']}",
                                                base_url=f"{hub.url}/datasets")
    assert len(cube.act_mem.get_all()) == 2 and cube.cubepack.commit_sha == published["sha"]
    with pytest.raises(cubepack.CubepackError, match="Refusing unpinned cube id 'ns/cube'"):
        GeneralMemCube.init_from_remote_repo("ns/cube", base_url=f"{hub.url}/datasets")
    with pytest.raises(cubepack.CubepackError, match="Refusing unpinned"):
        GeneralMemCube.init_from_remote_repo("ns/cube@main", base_url=f"{hub.url}/datasets")
    local = GeneralMemCube.init_from_dir(str(published["packed"]))
    assert len(local.act_mem.get_all()) == 2
    assert pickle_loads == []


def test_install_covers_mos_register_mem_cube(hub, published, installed, tmp_path):
    from memos.mem_cube.general import GeneralMemCube

    assert GeneralMemCube.init_from_dir.__name__ == "_hooked_dir"
    hook.uninstall()
    assert GeneralMemCube.init_from_dir.__name__ == "init_from_dir"
    hook.install()


def test_plugin_entry_point_installs_the_hook():
    pytest.importorskip("memos.plugins", reason="MemoryOS < 2.0.14 has no plugin system")
    from importlib.metadata import entry_points

    [entry] = [ep for ep in entry_points(group="memos.plugins") if ep.name == "cubepack"]
    plugin = entry.load()()
    try:
        plugin.on_load()
        assert hook.installed()
    finally:
        hook.uninstall()


def test_a_tampered_cube_is_refused_before_memos_builds_anything(hub, published, tmp_path,
                                                                 monkeypatch):
    from huggingface_hub import constants as hub_constants
    from memos.mem_cube import general

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "fresh-cache"))
    # A fresh managed folder too: an earlier load's folder of this commit would be reused (its
    # files hashed, not downloaded), and the tampered bytes never fetched.
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "fresh-cubepack-cache"))

    tampered = tmp_path / "tampered"
    shutil.copytree(published["packed"], tampered)
    item = next((tampered / "activations").glob("*.kv.safetensors"))
    data = bytearray(item.read_bytes())
    data[-5] ^= 0x01
    item.write_bytes(bytes(data))
    store_blob = hub.store.blob_path(hashing.sha256_file(published["packed"] /
                                                                   item.relative_to(tampered)))
    original = store_blob.read_bytes()
    store_blob.write_bytes(bytes(data))  # same size, other bytes, on the server
    built = []
    monkeypatch.setattr(general.GeneralMemCube, "__init__",
                        lambda self, *a, **k: built.append(a) or pytest.fail("MemOS built a cube"))
    try:
        with pytest.raises(VerificationFailed) as caught:
            hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url)
        assert caught.value.failures[0].name == "sha256"
        assert built == []
    finally:
        store_blob.write_bytes(original)


def test_hook_with_trusted_keys_refuses_an_unsigned_cube(hub, published, tmp_path):
    pytest.importorskip("model_signing")
    from helpers import make_key

    _, public = make_key(tmp_path, "ops")
    with pytest.raises(VerificationFailed, match="unsigned"):
        hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url,
                                   trusted_keys=[public])


def test_hook_require_lineage_refuses_an_unattested_cube_and_loads_an_attested_one(
        published, tmp_path):
    pytest.importorskip("model_signing")
    from helpers import make_key

    key, public = make_key(tmp_path, "ops")
    cube = tmp_path / "cube"
    shutil.copytree(published["packed"], cube)
    with pytest.raises(VerificationFailed) as caught:
        hook.init_from_dir(cube, trusted_keys=[public], require_lineage=True)
    assert {f.name for f in caught.value.failures} == {"signature", "attestation", "lineage"}
    cubepack.sign(cube, key)  # a root cube: its own attestation is the whole chain
    loaded = hook.init_from_dir(cube, trusted_keys=[public], require_lineage=True)
    assert sorted(loaded.cubepack.loaded) == sorted(item.id for item in published["items"])


# --- the leaves: every MemOS load path --------------------------------------------------------

@pytest.fixture
def no_pickle_load(monkeypatch):
    """Fail the test if anything calls pickle.load (MemOS's activation loader does)."""
    import pickle

    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load was called"))


def _act_memory(model_path):
    from memos.memories.activation.kv import KVCacheMemory

    return KVCacheMemory(memos_config(model_path).act_mem.config)


def test_memory_load_on_a_packed_cube_verifies_and_loads_its_kv_files(published, installed,
                                                                      no_pickle_load, zoo):
    from memos.mem_cube.general import GeneralMemCube

    cube = GeneralMemCube(memos_config(zoo["a"]))
    cube.load(str(published["packed"]))  # GeneralMemCube.load -> KVCacheMemory.load (hooked)
    assert sorted(item.id for item in cube.act_mem.get_all()) == \
        sorted(item.id for item in published["items"])
    assert cube.act_mem.cubepack.verified is True


def test_memory_load_on_an_unpacked_folder_uses_the_allowlist_reader(installed, no_pickle_load,
                                                                     zoo, tmp_path, caplog):
    from memos.mem_cube.general import GeneralMemCube

    source = GeneralMemCube(memos_config(zoo["a"]))
    source.act_mem.add([source.act_mem.extract(TEXTS[0])])
    hook.uninstall()  # MemOS's own dump: a pickle
    source.dump(str(tmp_path / "unpacked"))
    hook.install(require_pin=False)
    # Read safely (no pickle.load), but nothing records its producer: unknown origin, refused
    # by default (issue #30), never taken as the loading model's because its shape fits.
    with pytest.raises(IdentityMismatch, match="unknown origin"):
        GeneralMemCube.init_from_dir(str(tmp_path / "unpacked"))
    hook.uninstall()
    hook.install(require_pin=False, on_mismatch="rebuild")  # re-extracted from its source text
    with caplog.at_level(logging.WARNING, logger="cubepack.memos"):
        loaded = GeneralMemCube.init_from_dir(str(tmp_path / "unpacked"))
    assert list(loaded.act_mem.cubepack.rebuilt) == [item.id for item in
                                                     source.act_mem.get_all()]
    [item] = loaded.act_mem.get_all()
    [original] = source.act_mem.get_all()
    model = loaded.act_mem.llm.model
    assert all_equal(continue_greedy(model, original.memory, 40, 3),
                     continue_greedy(model, item.memory, 40, 3))
    assert loaded.act_mem.cubepack.verified is False
    assert any("unverified" in r.getMessage() for r in caplog.records)


def test_an_unpacked_folder_is_refused_when_signatures_are_required(zoo, tmp_path):
    pytest.importorskip("model_signing")
    from memos.mem_cube.general import GeneralMemCube

    from helpers import make_key

    GeneralMemCube(memos_config(zoo["a"])).dump(str(tmp_path / "unpacked"))
    _, public = make_key(tmp_path, "ops")
    hook.install(require_signature=True, trusted_keys=[public])
    try:
        with pytest.raises(cubepack.SignatureError, match="holds no cubepack.lock"):
            GeneralMemCube.init_from_dir(str(tmp_path / "unpacked"))
        with pytest.raises(cubepack.SignatureError):
            _act_memory(zoo["a"]).load(str(tmp_path / "unpacked"))
    finally:
        hook.uninstall()


def test_an_unpacked_folder_with_a_sampled_recompute_cannot_meet_recomputed(zoo, tmp_path):
    """As for a packed cube, a sampled recompute proves `recorded`, never `recomputed`: an
    unpacked folder under require_provenance="recomputed" with recompute_tokens is refused
    (it was loaded, the requirement never applied); with every position it loads."""
    from memos.mem_cube.general import GeneralMemCube

    GeneralMemCube(memos_config(zoo["a"])).dump(str(tmp_path / "unpacked"))
    hook.install(recompute=True, recompute_tokens=2, require_provenance="recomputed")
    try:
        with pytest.raises(cubepack.RefusedError, match="require_provenance"):
            GeneralMemCube.init_from_dir(str(tmp_path / "unpacked"))
    finally:
        hook.uninstall()


def test_a_lock_that_is_not_a_regular_file_is_refused(installed, published, zoo, tmp_path):
    import shutil as shell

    cube = tmp_path / "cube"
    shell.copytree(published["packed"], cube)
    (cube / "cubepack.lock").unlink()
    (cube / "cubepack.lock").mkdir()
    with pytest.raises(cubepack.UnsafeInputError, match="not a regular file"):
        _act_memory(zoo["a"]).load(str(cube))


def test_plugin_discovery_never_loosens_explicit_settings(tmp_path, monkeypatch):
    from cubepack.memos._plugin import CubepackPlugin

    key = tmp_path / "pub.pem"
    key.write_text("x")
    hook.install(require_pin=False, trusted_keys=[key], require_signature=True,
                 on_mismatch="drop")
    try:
        CubepackPlugin().on_load()  # what MemOS's plugin discovery does, possibly many times
        hook.install(on_mismatch="rebuild", require_signature=False)  # looser: ignored
        current = hook.settings()
        assert (current.require_pin, current.trusted_keys, current.require_signature,
                current.on_mismatch) == (False, (str(key),), True, "drop")
        assert hook.install(on_mismatch="error").on_mismatch == "error"  # stricter: taken
    finally:
        hook.uninstall()
    monkeypatch.setenv("CUBEPACK_MEMOS_ON_MISMATCH", "rebuild")
    try:
        assert CubepackPlugin().on_load() is None and hook.settings().on_mismatch == "rebuild"
    finally:
        hook.uninstall()


def test_rebuild_works_for_activations_extracted_from_chat_messages(hub, zoo, tmp_path):
    """MemOS's own example extracts from chat messages: source_text is a list of messages."""
    from memos.mem_cube.general import GeneralMemCube

    messages = [{"role": "user", "content": "I like green tea."},
                {"role": "assistant", "content": "Noted: green tea."}]
    source = GeneralMemCube(memos_config(zoo["a"]))
    item = source.act_mem.extract(messages)
    source.act_mem.add([item])
    packed = hook.pack_cube(source, tmp_path / "packed")
    loaded = hook.init_from_dir(packed, default_config=memos_config(zoo["b"]),
                                on_mismatch="rebuild")
    assert list(loaded.cubepack.rebuilt) == [item.id]
    model_b = loaded.act_mem.llm.model
    fresh = loaded.act_mem.extract(messages).memory
    assert all_equal(continue_greedy(model_b, loaded.act_mem.get(item.id).memory, 40, 3),
                     continue_greedy(model_b, fresh, 40, 3))


def git_remote(folder, source=None):
    """A git repository at ``folder`` holding ``source``'s files (links kept as links), one
    commit; returns its commit id."""
    import os
    import subprocess

    if source is not None:
        shutil.copytree(source, folder, symlinks=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ["PATH"]}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "cube"]):
        subprocess.run(["git", "-C", str(folder), *args], check=True, env=env)
    return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_git_remotes_keep_working_at_the_commit_given(published, installed, tmp_path,
                                                      no_pickle_load):
    from memos.mem_cube.general import GeneralMemCube

    sha = git_remote(tmp_path / "remotes" / "owner" / "cube", published["packed"])
    base_url = f"file://{tmp_path / 'remotes'}"
    cube = GeneralMemCube.init_from_remote_repo(f"owner/cube@{sha}", base_url=base_url)
    assert len(cube.act_mem.get_all()) == 2 and cube.cubepack.verified
    with pytest.raises(cubepack.CubepackError, match="Pin it to a git commit"):
        GeneralMemCube.init_from_remote_repo("owner/cube", base_url=base_url)
    from cubepack.memos._hook import _remote_kind

    assert _remote_kind("https://huggingface.co") == ("git", "https://huggingface.co", "")
    assert _remote_kind("https://hf.example/models") == ("hub", "https://hf.example",
                                                               "model")


@pytest.mark.parametrize("cube_id", ["owner/../../outside", "../outside", "owner/cube/extra",
                                     "owner", "owner/cube\n", "-u/cube", "own er/cube",
                                     "\u00f3wner/cube"])
def test_a_remote_id_must_be_exactly_owner_name_before_anything_runs(published, installed,
                                                                     tmp_path, cube_id):
    """Joined to the base URL, "owner/../../outside" would clone a repository outside it."""
    from memos.mem_cube.general import GeneralMemCube

    sha = git_remote(tmp_path / "outside", published["packed"])
    base_url = f"file://{tmp_path / 'remotes' / 'base'}"
    for kind in (base_url, "https://hf.example/datasets"):
        with pytest.raises(cubepack.UsageError, match="not a repo id of the form owner/name"):
            GeneralMemCube.init_from_remote_repo(f"{cube_id}@{sha}", base_url=kind)


def test_an_unpinned_git_revision_is_a_ref_name_never_an_option(published, installed, tmp_path):
    from memos.mem_cube.general import GeneralMemCube

    git_remote(tmp_path / "remotes" / "owner" / "cube", published["packed"])
    hook.uninstall()
    hook.install(require_pin=False)
    with pytest.raises(cubepack.UsageError, match="not a valid branch or tag name"):
        GeneralMemCube.init_from_remote_repo("owner/cube@--orphan=x",
                                             base_url=f"file://{tmp_path / 'remotes'}")


@pytest.mark.parametrize("entry, refusal", [
    ("activation_memory.pickle", "activation_memory.pickle is a symlink"),
    ("folder", "folder is a symlink"), ("aux.txt", "a device name Windows reserves")])
def test_a_clone_holding_a_symlink_is_refused_before_memos_or_cubepack_reads_it(
        installed, no_pickle_load, zoo, tmp_path, monkeypatch, entry, refusal):
    """git checks symlinks out as symlinks, to anywhere: an unpacked cube's pickle linked to
    a file outside the clone would be read as the cube's."""
    import os
    import tempfile

    from memos.mem_cube.general import GeneralMemCube

    from memos_format import write_cube

    elsewhere = write_cube(tmp_path / "elsewhere", str(zoo["a"]), {})
    remote = tmp_path / "remotes" / "owner" / "cube"
    remote.mkdir(parents=True)
    shutil.copy(elsewhere / "config.json", remote / "config.json")
    if entry == "folder":
        os.symlink(elsewhere, remote / "folder")
    elif entry == "aux.txt":
        shutil.copy(elsewhere / "activation_memory.pickle", remote / "activation_memory.pickle")
        (remote / entry).write_text("a device on Windows\n")
    else:
        os.symlink(elsewhere / "activation_memory.pickle", remote / entry)
    sha = git_remote(remote)
    clones = tmp_path / "clones"
    clones.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(clones))  # where the clone goes
    with pytest.raises(cubepack.UnsafeInputError,
                       match=f"The clone of file://.* is refused: .*{refusal}"):
        GeneralMemCube.init_from_remote_repo(f"owner/cube@{sha}",
                                             base_url=f"file://{tmp_path / 'remotes'}")
    assert list(clones.iterdir()) == []  # removed before anything read it


def test_a_cast_to_the_pinned_dtype_never_changes_a_shared_model(zoo, models, tmp_path):
    """MemOS shares one LLM per config; the hook casts a private copy, never the shared one."""
    import torch
    from memos.mem_cube.general import GeneralMemCube

    from helpers import build_cache

    cube_dir = tmp_path / "bf16-cube"
    cubepack.save_kv_cache(build_cache(models["a_as_bf16"], torch.tensor([[5, 6, 7]])),
                           cube_dir / "activations" / "x.kv.safetensors",
                           producer=models["a_as_bf16"], metadata={"id": "x"})
    (cube_dir / "config.json").write_text(memos_config(zoo["a"]).model_dump_json())
    cubepack.pack(cube_dir, model=models["a_as_bf16"])
    bystander = GeneralMemCube(memos_config(zoo["a"]))  # same config: the same LLM instance
    loaded = hook.init_from_dir(cube_dir)
    assert loaded.act_mem.llm.model.dtype == torch.bfloat16 and len(loaded.act_mem.get_all()) == 1
    assert bystander.act_mem.llm.model.dtype == torch.float32


def test_a_vllm_cube_holding_kv_tensors_is_refused_precisely(zoo, models, tmp_path):
    """A vLLM memory holds prompt strings (packable: see test_memos_use); KV tensors under the
    vllm_kv_cache backend are refused with that explanation, never an AttributeError."""
    import json as json_module

    import torch

    from helpers import build_cache
    from memos_format import write_cube

    caches = {"item-1": build_cache(models["a"], torch.tensor([[5, 6, 7]]))}
    cube = write_cube(tmp_path / "vllm", str(zoo["a"]), caches)
    config = json_module.loads((cube / "config.json").read_text())
    config["act_mem"]["backend"] = "vllm_kv_cache"
    (cube / "config.json").write_text(json_module.dumps(config))
    with pytest.raises(cubepack.UnsupportedError, match="a vLLM cube holds prompt strings only"):
        cubepack.pack(cube, legacy_pickle=True)


def test_the_hook_proves_caches_with_the_model_memos_loaded(hub, published):
    spec = f"ns/cube@{published['sha']}"
    with pytest.raises(cubepack.RecomputationFailed, match="recomputed is required"):
        hook.init_from_remote_repo(spec, endpoint=hub.url, require_provenance="recomputed")
    proven = hook.init_from_remote_repo(spec, endpoint=hub.url, recompute=True,
                                        require_provenance="recomputed")
    assert sorted(proven.cubepack.recomputed) == sorted(item.id for item in published["items"])


def test_the_lock_cannot_choose_another_model_than_config_json_names(hub, published, zoo,
                                                                      tmp_path):
    """The lock is a claim: it may pin the model config.json names to a commit, never name
    another model for MemOS to run. Here the attacker packs B's caches pinned to B, then edits
    config.json to name A: every file agrees with the lock, but MemOS would run B."""
    import json as json_module

    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    from helpers import reseal_lock

    other = publish_model(hub, zoo["b"], "evil/model")
    snapshot = snapshot_download("evil/model", revision=other, endpoint=hub.url)
    built = GeneralMemCube(memos_config(snapshot))
    built.act_mem.add([built.act_mem.extract(TEXTS[0])])
    cube = hook.pack_cube(built, tmp_path / "cube")
    config_path = cube / "config.json"
    config = json_module.loads(config_path.read_text())
    config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] = \
        "tiny-org/model-a"
    config_path.write_text(json_module.dumps(config))

    def relist(lock):
        lock["files"]["config.json"] = {"sha256": hashing.sha256_file(config_path),
                                        "size": config_path.stat().st_size}
    reseal_lock(cube, relist)
    sha = push(cube, "ns/swapped", endpoint=hub.url).commit_sha
    with pytest.raises(cubepack.IntegrityError, match="config.json names tiny-org/model-a"):
        hook.init_from_remote_repo(f"ns/swapped@{sha}", endpoint=hub.url)


def test_rebuild_is_the_re_prefill_migrate_runs(zoo, tmp_path):
    """The hook's rebuild and ``cubepack migrate`` share one re-prefill: the cache the hook
    rebuilds on B from a cube of A holds the tensors migrate writes for B, both from the stored
    token ids (A and B share a tokenizer)."""
    import torch
    from memos.mem_cube.general import GeneralMemCube

    source = GeneralMemCube(memos_config(zoo["a"]))
    items = [source.act_mem.extract(text) for text in TEXTS]
    source.act_mem.add(items)
    packed = hook.pack_cube(source, tmp_path / "packed")
    loaded = hook.init_from_dir(packed, default_config=memos_config(zoo["b"]),
                                on_mismatch="rebuild")
    migrated = cubepack.migrate(packed, model=str(zoo["b"]), out=tmp_path / "migrated")
    assert migrated.retokenized == []  # the stored ids, in both
    model_b = loaded.act_mem.llm.model
    for item in items:
        rebuilt = loaded.act_mem.get(item.id).memory
        lock = json.loads((migrated.cube_dir / "cubepack.lock").read_text())
        written = cubepack.load_kv_cache(migrated.cube_dir / lock["activations"][item.id]["file"],
                                         model_b)
        for mine, theirs in zip(rebuilt.layers, written.layers):
            assert torch.allclose(mine.keys, theirs.keys, atol=1e-5)
            assert torch.allclose(mine.values, theirs.values, atol=1e-5)
        assert loaded.act_mem.get(item.id).metadata["rebuilt_by_cubepack"] is True


def test_rebuild_re_tokenises_an_item_without_ids_from_its_source_text(zoo, tmp_path):
    """A MemOS pickle records no token ids: rebuild goes through the chat template, as
    MemOS's own extract would on the loaded model."""
    import torch
    from memos.mem_cube.general import GeneralMemCube

    from memos_format import write_cube

    source = GeneralMemCube(memos_config(zoo["a"]))
    cache = source.act_mem.extract(TEXTS[0]).memory
    folder = write_cube(tmp_path / "plain", str(zoo["a"]), {"tea": cache},
                        texts={"tea": TEXTS[0]})
    cubepack.pack(folder, legacy_pickle=True)
    loaded = hook.init_from_dir(folder, default_config=memos_config(zoo["b"]),
                                on_mismatch="rebuild")
    rebuilt = loaded.act_mem.get("tea").memory
    fresh = loaded.act_mem.extract(TEXTS[0]).memory
    for mine, theirs in zip(rebuilt.layers, fresh.layers):
        assert torch.equal(mine.keys, theirs.keys)
