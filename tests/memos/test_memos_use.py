"""MemOS as its users run it: MOS and MOSCore chat with a cube's activations, MemOS's own
semantics (load replaces, caches do not grow), portable dumps, every pickle layout MemOS reads,
vLLM and text-only cubes, and the rough edges (act-only registration, memory_types, managed
folders, messages naming the user's call). Real MemoryOS, tiny models, the local endpoint."""

from __future__ import annotations

import json
import pickle

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import IdentityMismatch
from cubepack.hub import push
from cubepack.testing.hub import InstrumentedHub

from memos_live import cube_config, llm, mos_for, vllm_memory

TEXTS = ["The user is a Chinese man.", "He likes green tea and long walks."]


@pytest.fixture(scope="module")
def packed(zoo, tmp_path_factory):
    """A cube whose two caches model A built from TEXTS, packed by pack_cube."""
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(text) for text in TEXTS])
    return hook.pack_cube(cube, tmp_path_factory.mktemp("packed") / "cube")


def stored_lengths(cube):
    return sorted(item.memory.get_seq_length() for item in cube.act_mem.get_all())


# --- the model that uses a cache is checked where MemOS uses it --------------------------------

@pytest.mark.parametrize("kind", ["MOS", "MOSCore"])
def test_chat_refuses_another_chat_model_naming_the_item(installed, packed, zoo, kind):
    mos = mos_for(zoo["b"], zoo["a"], kind=kind)
    mos.register_mem_cube(str(packed), mem_cube_id="c1")
    with pytest.raises(IdentityMismatch, match=r"Activation '.*', used by .*weights_digest"):
        mos.chat("What does the user drink?")


def test_another_layer_count_is_this_refusal_never_an_index_error(installed, packed, zoo):
    mos = mos_for(zoo["deep"], zoo["a"])
    mos.register_mem_cube(str(packed), mem_cube_id="c1")
    with pytest.raises(IdentityMismatch, match="geometry.num_layers: expected 2, found 3"):
        mos.chat("What does the user drink?")


@pytest.mark.parametrize("policy", ["drop", "rebuild"])
def test_use_time_policies_drop_or_rebuild_as_on_load(packed, zoo, policy, caplog):
    hook.uninstall()
    hook.install(require_pin=False, on_mismatch=policy)
    try:
        mos = mos_for(zoo["b"], zoo["a"])
        mos.register_mem_cube(str(packed), mem_cube_id="c1")
        with caplog.at_level("WARNING", logger="cubepack.memos"):
            answer = mos.chat("What does the user drink?")
        assert isinstance(answer, str)
        expected = "answering without it" if policy == "drop" else "rebuilt with the consuming"
        assert expected in caplog.text
    finally:
        hook.uninstall()


def test_the_pinned_chat_model_uses_the_cache_and_the_stored_cache_never_grows(
        installed, packed, zoo, tmp_path):
    mos = mos_for(zoo["a"], zoo["a"])
    mos.register_mem_cube(str(packed), mem_cube_id="c1")
    cube = mos.mem_cubes["c1"]
    before = stored_lengths(cube)
    for question in ("What does the user drink?", "And where is he from?"):
        assert isinstance(mos.chat(question), str)
    assert stored_lengths(cube) == before  # MemOS #2301: each chat used to append to it
    out = hook.pack_cube(cube, tmp_path / "repacked")
    lock = json.loads((out / "cubepack.lock").read_text())
    assert sorted(a["token_count"] for a in lock["activations"].values()) == before
    for entry in lock["activations"].values():
        assert cubepack.read_kv_header(out / entry["file"]).token_ids  # every cache: its ids


def test_pack_cube_refuses_a_cache_that_grew_in_place(packed, zoo, tmp_path):
    """Without the hook, MemOS's chat appends to the stored cache; packing it then is refused,
    naming MemOS #2301 and the fix, instead of shipping a cache its prompt does not produce."""
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(TEXTS[0])])
    item = cube.act_mem.get_all()[0]
    cube.act_mem.llm.generate([{"role": "user", "content": "Hi"}], past_key_values=item.memory)
    assert item.memory.get_seq_length() > 0
    with pytest.raises(cubepack.UsageError, match="#2301"):
        hook.pack_cube(cube, tmp_path / "grown")
    assert not (tmp_path / "grown").exists()


# --- MemOS's semantics kept --------------------------------------------------------------------

def test_a_hooked_load_replaces_what_the_memory_held(installed, packed, zoo):
    from memos.mem_cube.general import GeneralMemCube

    cube = GeneralMemCube(cube_config(zoo["a"]))
    stale = cube.act_mem.extract("Stale memory.")
    cube.act_mem.add([stale])
    cube.act_mem.load(str(packed))
    ids = [item.id for item in cube.act_mem.get_all()]
    assert stale.id not in ids and len(ids) == 2


def test_dumps_are_portable_kv_files_named_by_hub_id(installed, zoo, tmp_path):
    """A cube loaded by the hook from a Hub snapshot dumps with its Hub id in config.json, KV
    files instead of a pickle, packed: it verifies and loads again."""
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    from cubepack.testing.hub import upload_folder

    with InstrumentedHub(tmp_path / "hub") as hub:
        commit = upload_folder(hub.url, "tiny-org/model-a", zoo["a"])
        snapshot = snapshot_download("tiny-org/model-a", revision=commit, endpoint=hub.url)
        cube = GeneralMemCube(cube_config(snapshot))
        cube.act_mem.add([cube.act_mem.extract(TEXTS[0])])
        cube.dump(str(tmp_path / "dump"))
        dump = tmp_path / "dump"
        config = json.loads((dump / "config.json").read_text())
        assert config["act_mem"]["config"]["extractor_llm"]["config"][
            "model_name_or_path"] == "tiny-org/model-a"
        assert not list(dump.rglob("*.pickle")) and list(dump.rglob("*.kv.safetensors"))
        assert cubepack.verify(dump).ok
        again = GeneralMemCube.init_from_dir(str(dump))
        assert len(again.act_mem.get_all()) == 1


# --- every format MemOS reads, read safely ------------------------------------------------------

def _memos_pickle(cube_dir, layout, items):
    """Rewrite a MemOS dump's activation pickle in one of the layouts MemOS's load accepts."""
    if layout == "bare list":
        data = list(items.values())
    elif layout == "kv_cache_memories list":
        data = {"kv_cache_memories": list(items.values())}
    else:
        data = {"kv_cache_memories": items}
    (cube_dir / "activation_memory.pickle").write_bytes(pickle.dumps(data))


@pytest.mark.parametrize("layout", ["dict", "kv_cache_memories list", "bare list"])
def test_list_format_pickles_load_and_pack_as_plain_memos_reads_them(zoo, tmp_path, layout):
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(text) for text in TEXTS])
    folder = tmp_path / "cube"
    type(cube).dump(cube, str(folder))
    _memos_pickle(folder, layout, cube.act_mem.kv_cache_memories)
    plain = GeneralMemCube.init_from_dir(str(folder))
    assert len(plain.act_mem.get_all()) == 2
    # No producer record in the pickle: unknown origin (issue #30), so the hook rebuilds the
    # items from their source text rather than taking them as the loading model's.
    hook.install(require_pin=False, on_mismatch="rebuild")
    try:
        hooked = GeneralMemCube.init_from_dir(str(folder))
        assert sorted(i.id for i in hooked.act_mem.get_all()) == \
            sorted(i.id for i in plain.act_mem.get_all())
    finally:
        hook.uninstall()
    cubepack.pack(folder, legacy_pickle=True)
    assert len(json.loads((folder / "cubepack.lock").read_text())["activations"]) == 2


@pytest.mark.parametrize("record", ["#2302", "#2305"])
def test_producer_records_are_enforced_on_unpacked_loads(zoo, tmp_path, record):
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(TEXTS[0])])
    folder = tmp_path / "cube"
    type(cube).dump(cube, str(folder))
    items = cube.act_mem.kv_cache_memories
    other = {"model_name_or_path": str(zoo["b"]), "num_hidden_layers": 2}
    if record == "#2302":
        data = {"kv_cache_memories": items, "model_identity": other}
    else:
        for item in items.values():
            item.metadata["producer"] = other
        data = {"kv_cache_memories": items}
    (folder / "activation_memory.pickle").write_bytes(pickle.dumps(data))
    hook.install(require_pin=False)
    try:
        with pytest.raises(IdentityMismatch, match="record.model_name_or_path"):
            GeneralMemCube.init_from_dir(str(folder))
    finally:
        hook.uninstall()


# --- vLLM cubes ---------------------------------------------------------------------------------

def test_vllm_cubes_pack_with_their_prompts_and_load_only_into_the_pinned_model(
        zoo, hub_cached, packed, tmp_path, monkeypatch):
    from memos.memories.activation.item import VLLMKVCacheItem

    from memos_format import memos_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "vllm"
    folder.mkdir()
    config = memos_config(hub_cached["repo_id"])
    config["act_mem"]["backend"] = "vllm_kv_cache"
    config["act_mem"]["config"]["extractor_llm"] = {"backend": "vllm", "config": {
        "model_name_or_path": hub_cached["repo_id"], "api_base": "http://127.0.0.1:9/v1"}}
    (folder / "config.json").write_text(json.dumps(config))
    items = {str(i): VLLMKVCacheItem(id=str(i), memory=f"<prompt {i}>", metadata={})
             for i in range(2)}
    (folder / "activation_memory.pickle").write_bytes(pickle.dumps({"kv_cache_memories": items}))
    cubepack.pack(folder, legacy_pickle=True)
    assert (folder / "activations" / "prompts.json").is_file()
    assert not (folder / "activation_memory.pickle").exists()
    report = cubepack.verify(folder)
    assert [(c.ok, c.basis) for c in report.checks if c.name == "model identity"] == [
        (True, "proved"), (True, "claimed")]  # the cached revision's bytes; its dtype: a claim
    hook.install(require_pin=False)
    try:
        memory = vllm_memory(hub_cached["repo_id"])
        memory.load(str(folder))
        assert sorted(i.memory for i in memory.get_all()) == ["<prompt 0>", "<prompt 1>"]
        with pytest.raises(IdentityMismatch, match="another model"):
            vllm_memory("other-org/other-model").load(str(folder))
        # a memory of the other kind is refused, never left empty
        from memos.mem_cube.general import GeneralMemCube

        local = GeneralMemCube(cube_config(hub_cached["snapshot"])).act_mem
        with pytest.raises(cubepack.UnsupportedError, match="holds vLLM prompts"):
            local.load(str(folder))
        with pytest.raises(cubepack.UnsupportedError, match="holds KV caches"):
            vllm_memory(hub_cached["repo_id"]).load(str(packed))
    finally:
        hook.uninstall()


# --- text-only cubes ----------------------------------------------------------------------------

def test_mem_cube_tree_packs_with_a_cube_id_verifies_pushes_and_pulls(tmp_path):
    import shutil

    from data import EXAMPLES

    if not (EXAMPLES / "mem_cube_tree").is_dir():
        pytest.skip("no MemOS example cubes")
    folder = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "mem_cube_tree", folder)
    with pytest.raises(cubepack.UsageError, match="--cube-id"):
        cubepack.pack(folder)
    cubepack.pack(folder, cube_id="examples/mem_cube_tree")
    lock = json.loads((folder / "cubepack.lock").read_text())
    assert lock["cube_id"] == "examples/mem_cube_tree"
    vectors = lock["models"]["text_mem.embedder"]["vectors"]
    assert (vectors["count"], vectors["dimension"]) == (4, 1024)
    assert cubepack.verify(folder).ok
    with InstrumentedHub(tmp_path / "hub") as hub:
        pushed = push(folder, "examples/mem_cube_tree", endpoint=hub.url)
        pulled = cubepack.pull(f"examples/mem_cube_tree@{pushed.commit_sha}", endpoint=hub.url,
                               local_dir=tmp_path / "pulled")
    assert pulled.report.ok


def test_a_naive_text_cube_without_activations_round_trips(zoo, tmp_path):
    """NaiveMemCube-style: text memory, no activation memory; packs, verifies, pushes, pulls
    and loads through the hook with MemOS's own naive_text memory."""
    from memos.mem_cube.general import GeneralMemCube

    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}}
    config = cube_config(zoo["a"], text_mem=text_mem)
    data = config.model_dump(mode="json")
    data["act_mem"] = {"backend": "uninitialized"}
    hook.uninstall()
    cube = GeneralMemCube(type(config).model_validate(data))
    cube.text_mem.add([{"memory": text, "metadata": {}} for text in TEXTS])
    hook.pack_cube(cube, tmp_path / "text")
    assert cubepack.verify(tmp_path / "text").ok
    with InstrumentedHub(tmp_path / "hub") as hub:
        sha = push(tmp_path / "text", "u1/text_cube", endpoint=hub.url,
                   allow_local_paths=True).commit_sha
        loaded = hook.init_from_remote_repo(f"u1/text_cube@{sha}", endpoint=hub.url)
    assert sorted(m.memory for m in loaded.text_mem.get_all()) == sorted(TEXTS)


# --- the rough edges ----------------------------------------------------------------------------

def test_act_only_cubes_register_in_moscore(installed, packed, zoo):
    mos = mos_for(zoo["a"], zoo["a"], kind="MOSCore")
    mos.register_mem_cube(str(packed), mem_cube_id="c1")  # MemOS 2.0.33 alone: AttributeError
    assert len(mos.mem_cubes["c1"].act_mem.get_all()) == 2
    assert mos.mem_cubes["c1"].text_mem is None


def test_memory_types_are_honoured_so_unneeded_memories_are_not_built(installed, zoo, tmp_path):
    """A cube whose text memory could not even be constructed here (a vector store this
    machine lacks) loads its activations when only act_mem is asked for."""
    from memos.mem_cube.general import GeneralMemCube

    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(TEXTS[0])])
    folder = hook.pack_cube(cube, tmp_path / "cube")
    config = json.loads((folder / "config.json").read_text())
    config["text_mem"] = {"backend": "general_text", "config": {
        "extractor_llm": llm(zoo["a"]), "embedder": {"backend": "ollama", "config": {
            "model_name_or_path": "x"}},
        "vector_db": {"backend": "qdrant", "config": {"collection_name": "a/b",
                                                       "vector_dimension": 8}}}}
    (folder / "config.json").write_text(json.dumps(config))
    cubepack.pack(folder)
    loaded = hook.init_from_dir(folder, memory_types=["act_mem"])
    assert loaded.text_mem is None and len(loaded.act_mem.get_all()) == 1


def test_pulled_cubes_live_in_a_managed_folder_not_tmp(installed, packed, tmp_path,
                                                        monkeypatch):
    import tempfile

    from cubepack._util import constants

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with InstrumentedHub(tmp_path / "hub") as hub:
        sha = push(packed, "ns/managed", endpoint=hub.url, allow_local_paths=True).commit_sha
        first = hook.init_from_remote_repo(f"ns/managed@{sha}", endpoint=hub.url)
        again = hook.init_from_remote_repo(f"ns/managed@{sha}", endpoint=hub.url)
    assert first.cubepack.cube_dir == again.cubepack.cube_dir
    assert constants.cubes_dir() in first.cubepack.cube_dir.parents
    assert first.cubepack.cube_dir.name == sha
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_refusal_names_the_call_the_user_made(installed, zoo):
    hook.uninstall()
    hook.install()  # require_pin
    try:
        mos = mos_for(zoo["a"], zoo["a"], kind="MOSCore")
        with pytest.raises(cubepack.UsageError, match=r"MOSCore\.register_mem_cube\('owner/cube@"):
            mos.register_mem_cube("owner/cube", mem_cube_id="c1")
    finally:
        hook.uninstall()


def test_what_memos_own_tests_found_behaves_as_plain_memos(installed, packed, zoo, tmp_path):
    """Found by running MemOS's own tests with the hook: an empty cache generates as without
    the hook; an activation memory with its own dump keeps it; register_mem_cube records the
    path it was given, as MemOS does."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.kv import KVCacheMemory
    from transformers import DynamicCache

    cube = GeneralMemCube(cube_config(zoo["a"]))
    answer = cube.act_mem.llm.generate([{"role": "user", "content": "Hi"}],
                                       past_key_values=DynamicCache())
    assert isinstance(answer, str)

    class OwnDump(KVCacheMemory):
        def dump(self, dir):
            (tmp_path / "own-dump-called").write_text(dir)

    cube.act_mem.__class__ = OwnDump
    cube.dump(str(tmp_path / "dump"))
    assert (tmp_path / "own-dump-called").read_text() == str(tmp_path / "dump")
    mos = mos_for(zoo["a"], zoo["a"], kind="MOSCore")
    cube_id = f"own-{tmp_path.name}"  # MemOS's user database outlives one test
    try:
        mos.register_mem_cube(str(packed), mem_cube_id=cube_id)
        assert mos.user_manager.get_cube(cube_id).cube_path == str(packed)
    finally:  # a later MOS of user u1 would chat over this cube's entry and fail (KeyError)
        mos.user_manager.delete_cube(cube_id)
