"""The MemOS hook with the real MemoryOS package, tiny models and the local endpoint."""

from __future__ import annotations

import copy
import logging
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack import IdentityMismatch, VerificationFailed  # noqa: E402
from cubepack.hub import push  # noqa: E402
from cubepack.testing.hub import upload_folder  # noqa: E402
from cubepack.testing.hub import InstrumentedHub  # noqa: E402

from helpers import all_equal, continue_greedy  # noqa: E402

TEXTS = ["The user is a Chinese man.", "He likes green tea and long walks."]
QUESTION = [{"role": "user", "content": "What does the user drink?"}]


def memos_config(model_path, *, cube_id="u1/tiny_cube"):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_path),
                                                 "max_tokens": 6}}
    return GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": cube_id, "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})


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

    tampered = tmp_path / "tampered"
    shutil.copytree(published["packed"], tampered)
    item = next((tampered / "activations").glob("*.kv.safetensors"))
    data = bytearray(item.read_bytes())
    data[-5] ^= 0x01
    item.write_bytes(bytes(data))
    store_blob = hub.store.blob_path(cubepack._hashing.sha256_file(published["packed"] /
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
