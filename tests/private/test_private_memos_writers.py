"""Private by construction (issue #37 item 1): a private cube's memories are written private, to
trusted recipients, or not at all, by every path that writes them: MemOS's dumps (found by
sweeping MemOS's source, not listed by hand), after any load path, and cubepack's own writers.

Real MemoryOS 2.0.x, tiny model A, age X25519 keys. Each test reproduces a break of the last
attack round (the privacy was checked where a cube was opened, not where its memories were
written), or a rule the issue adds (trusted recipients, persistent stores, mixed dumps)."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import SignatureError, UsageError
from cubepack.ops._encrypt import encrypt

from helpers import make_key
from memos_live import cube_config, llm

SECRET = "zqxj-private-marker: the user's locker code is 7319"
OTHER = "She keeps bees on the roof."  # not another test's text: caches are known by content

# --- the sweep: every MemOS function that writes a file ------------------------------------------

#: What marks a MemOS function as one that writes a file (or calls a memory's dump).
WRITES = re.compile(r"""open\([^)]*['"][wax]b?\+?['"]|json\.dump\(|pickle\.dump\(|torch\.save\(|"""
                    r"""to_json_file\(|to_yaml_file\(|save_pretrained\(|\.write_text\(|"""
                    r"""\.write_bytes\(|shutil\.copy|np\.save\(|_mem\.dump\(|self\.dump\(|"""
                    r"""\]\.dump\(""")
#: Every writer the sweep finds, and how it is covered: ``hooked`` (patched by install: a
#: private memory is written private or refused, tested below), ``reaches`` (writes memories
#: only through a hooked writer, tested below), ``no memory`` (writes a config, a placeholder,
#: MemOS's own tooling), ``out of reach`` (said in SECURITY.md: what a program or a server
#: feature writes of what it was told).
WRITERS = {
    "memories/activation/kv.py KVCacheMemory.dump": "hooked",
    "memories/activation/vllmkv.py VLLMKVCacheMemory.dump": "hooked",
    "memories/textual/naive.py NaiveTextMemory.dump": "hooked",
    "memories/textual/general.py GeneralTextMemory.dump": "hooked",
    "memories/textual/tree.py TreeTextMemory.dump": "hooked",
    "memories/textual/preference.py PreferenceTextMemory.dump": "hooked",
    "mem_cube/general.py GeneralMemCube.dump": "hooked",
    "mem_cube/navie.py NaiveMemCube.dump": "hooked",
    "mem_scheduler/memory_manage_modules/activation_memory_manager.py "
    "ActivationMemoryManager.update_activation_memory": "hooked",
    "mem_os/core.py MOSCore.dump": "reaches",
    "memories/textual/tree.py TreeTextMemory.drop": "reaches",
    "memories/parametric/lora.py LoRAMemory.dump": "no memory",  # writes b"Placeholder"
    "configs/base.py BaseConfig.to_json_file": "no memory",
    "configs/base.py BaseConfig.to_yaml_file": "no memory",
    "cli.py download_examples": "no memory",
    "cli.py export_openapi": "no memory",
    "mem_scheduler/utils/config_utils.py convert_config_to_env": "no memory",
    "mem_scheduler/analyzer/eval_analyzer.py main": "no memory",
    "mem_chat/simple.py SimpleMemChat._export_chat_history": "out of reach",
    "mem_reader/read_skill_memory/process_skill_memory.py _upload_skills": "out of reach",
    "mem_reader/read_skill_memory/process_skill_memory.py _write_skills_to_file": "out of reach",
    "mem_reader/read_skill_memory/upload_skill_memory.py _download_zip": "out of reach",
}


def swept() -> set[str]:
    root = pathlib.Path(memos.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if not WRITES.search(source):
            continue
        tree = ast.parse(source)
        scopes = [(None, tree.body)] + [(node.name, node.body) for node in ast.walk(tree)
                                         if isinstance(node, ast.ClassDef)]
        for owner, body in scopes:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        WRITES.search(ast.get_source_segment(source, node) or ""):
                    name = f"{owner}.{node.name}" if owner else node.name
                    found.add(f"{path.relative_to(root).as_posix()} {name}")
    return found


def test_the_sweep_finds_exactly_the_writers_this_module_covers(installed):
    import importlib

    assert swept() == set(WRITERS)
    for where, how in WRITERS.items():
        if how != "hooked":
            continue
        path, qualified = where.split(" ")
        owner_name, _, method = qualified.partition(".")
        module = importlib.import_module("memos." + path[:-3].replace("/", "."))
        patched = getattr(module, owner_name).__dict__[method]
        patched = getattr(patched, "__func__", patched)
        assert getattr(patched, "__module__", "").startswith("cubepack"), where


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture
def installed():
    """The hook installed (no pin required) for one test, and removed after it."""
    hook.uninstall()
    yield hook.install(require_pin=False)
    hook.uninstall()


@pytest.fixture(scope="module")
def clear_cube(zoo, tmp_path_factory):
    """A packed cube of model A holding two activations (one of them the secret) and a naive
    text memory holding the secret too, made without the hook."""
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}}
    cube = GeneralMemCube(cube_config(zoo["a"], cube_id="u1/private_cube", text_mem=text_mem))
    cube.act_mem.add([cube.act_mem.extract(text) for text in (SECRET, OTHER)])
    cube.text_mem.add([{"memory": text, "metadata": {}} for text in (SECRET, OTHER)])
    return hook.pack_cube(cube, tmp_path_factory.mktemp("clear") / "cube")


@pytest.fixture
def private(clear_cube, tmp_path, agekeys, monkeypatch):
    """(the cube encrypted to alice, unsigned; its folder) with CUBEPACK_IDENTITY alice."""
    folder = tmp_path / "private"
    shutil.copytree(clear_cube, folder)
    encrypt(folder, [agekeys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(agekeys["alice"][0]))
    return folder


def holds_no_clear_memory(folder: pathlib.Path) -> bool:
    """No file under ``folder`` holds the secret's text (KV headers, text memories carry it)."""
    needle = SECRET.encode()
    return not any(needle in path.read_bytes() for path in folder.rglob("*") if path.is_file())


def opens_to(folder: pathlib.Path, key: pathlib.Path) -> bool:
    return cubepack.verify(folder, decrypt_with=key).ok


def recipients_of(folder: pathlib.Path, key: pathlib.Path) -> list[str]:
    from cubepack.ops._private import open_private

    with open_private(folder, key) as opened:
        return sorted(opened.manifest["recipients"])


# --- the breaks: MemOS's dump paths after every load path ------------------------------------

def test_kvcachememory_dump_of_a_loaded_private_cube_is_refused_without_trusted_readers(
        installed, private, tmp_path):
    """The break: init_from_dir of a private cube, then act_mem.dump (the scheduler's call)
    wrote its KV files in clear: source text, token ids, tensors. An unsigned cube's manifest
    cannot choose the readers of the dump: refused, nothing written."""
    cube = hook.init_from_dir(private)
    target = tmp_path / "act-dump"
    with pytest.raises(SignatureError, match="no trusted key signed that manifest"):
        cube.act_mem.dump(str(target))
    assert not target.exists()
    with pytest.raises(SignatureError, match=r"recipients=\[\.\.\.\]"):
        cube.dump(str(tmp_path / "cube-dump"))
    assert not (tmp_path / "cube-dump").exists()


def test_named_recipients_make_every_dump_of_a_private_cube_private(private, tmp_path,
                                                                     agekeys):
    hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["bob"][1]])
    try:
        cube = hook.init_from_dir(private)
        cube.act_mem.dump(str(tmp_path / "act"))
        cube.text_mem.dump(str(tmp_path / "text"))
        cube.dump(str(tmp_path / "cube"))
        for name in ("act", "text", "cube"):
            folder = tmp_path / name
            assert holds_no_clear_memory(folder), name
            assert opens_to(folder, agekeys["bob"][0]), name
            assert recipients_of(folder, agekeys["bob"][0]) == [agekeys["bob"][1]], name
            with pytest.raises(cubepack.RefusedError, match="not encrypted to the identity"):
                cubepack.verify(folder, decrypt_with=agekeys["alice"][0])
        # The dumps load back through the hook, with bob's key, and are sealed again.
        os.environ["CUBEPACK_IDENTITY"] = str(agekeys["bob"][0])
        again = hook.init_from_dir(tmp_path / "cube")
        assert sorted(item.memory for item in again.text_mem.get_all()) == sorted(
            [SECRET, OTHER])
        assert len(again.act_mem.get_all()) == 2
        again.act_mem.dump(str(tmp_path / "act"))  # replaces its own earlier private dump
        assert opens_to(tmp_path / "act", agekeys["bob"][0])
    finally:
        hook.uninstall()


def test_generalmemcube_dump_after_kvcachememory_load_of_a_private_cube_is_private(
        private, zoo, tmp_path, agekeys):
    """The break: a fresh cube's act_mem.load(private folder) (KVCacheMemory.load, as
    GeneralMemCube.load and MOSCore.load call it), then GeneralMemCube.dump: clear on disk."""
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        cube = GeneralMemCube(cube_config(zoo["a"]))
        cube.act_mem.load(str(private))
        assert len(cube.act_mem.get_all()) == 2
        with pytest.raises(SignatureError):
            cube.dump(str(tmp_path / "dump"))
        assert not (tmp_path / "dump").exists()
    finally:
        hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
    try:
        cube = GeneralMemCube(cube_config(zoo["a"]))
        cube.load(str(private), ["act_mem"])  # GeneralMemCube.load -> KVCacheMemory.load
        cube.dump(str(tmp_path / "dump"))
        assert holds_no_clear_memory(tmp_path / "dump")
        assert opens_to(tmp_path / "dump", agekeys["alice"][0])
    finally:
        hook.uninstall()


def test_text_memory_load_of_a_private_cube_opens_it_and_seals_the_memory(private, zoo,
                                                                           tmp_path, agekeys):
    """MemOS's own NaiveTextMemory.load of a private folder read nothing (its file is a
    ciphertext) and returned an empty memory; under the hook it opens in memory, and the
    memory's dump is private."""
    from memos.mem_cube.general import GeneralMemCube

    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}}
    hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
    try:
        cube = GeneralMemCube(cube_config(zoo["a"], text_mem=text_mem))
        cube.text_mem.load(str(private))
        assert sorted(m.memory for m in cube.text_mem.get_all()) == sorted([SECRET, OTHER])
        cube.text_mem.dump(str(tmp_path / "text"))
        assert holds_no_clear_memory(tmp_path / "text")
        fresh = GeneralMemCube(cube_config(zoo["a"], text_mem=text_mem))
        fresh.text_mem.load(str(tmp_path / "text"))
        assert sorted(m.memory for m in fresh.text_mem.get_all()) == sorted([SECRET, OTHER])
    finally:
        hook.uninstall()


def test_the_schedulers_activation_update_of_a_private_cube_dumps_private(private, zoo,
                                                                          tmp_path, agekeys):
    """The scheduler composes the cube's text memories into a new cache and dumps the
    activation memory to its act_mem_dump_path (MemOS 2.0.33's ActivationMemoryManager): the
    cache carries the private text, so the dump is private (or, unnamed, nothing is written:
    the scheduler logs the refusal)."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )

    path = tmp_path / "scheduler.kv_cache"
    manager = ActivationMemoryManager(str(path), monitor=None, log_func_callback=None,
                                      log_activation_memory_update_func=lambda **_: None)
    hook.uninstall()
    hook.install(require_pin=False)
    try:
        cube = hook.init_from_dir(private)
        manager.update_activation_memory([SECRET], "label", "u1", "c1", cube)
        assert not path.exists()  # refused (logged by MemOS): no trusted readers
    finally:
        hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
    try:
        cube = hook.init_from_dir(private)
        manager.update_activation_memory([SECRET], "label", "u1", "c1", cube)
        manager.update_activation_memory([OTHER], "label", "u1", "c1", cube)
        assert holds_no_clear_memory(path)
        reloaded = GeneralMemCube(cube_config(zoo["a"]))
        reloaded.act_mem.load(str(path))  # KVCacheMemory.load opens the private dump
        [item] = reloaded.act_mem.get_all()  # the second update's, the first one deleted
        assert item.records.text_memories == [OTHER]
    finally:
        hook.uninstall()


def test_a_signed_private_cube_under_a_trusted_key_dumps_to_its_own_readers(
        clear_cube, tmp_path, agekeys, monkeypatch):
    """A manifest a trusted key signed names who may read the cube's dumps."""
    private_key, public_key = make_key(tmp_path, "signer")
    folder = tmp_path / "signed"
    shutil.copytree(clear_cube, folder)
    encrypt(folder, [agekeys["alice"][1], agekeys["bob"][1]], sign_key=private_key)
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(agekeys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False, trusted_keys=[public_key])
    try:
        with pytest.raises(SignatureError):  # without the key, the manifest is a claim
            hook.init_from_dir(folder).dump(str(tmp_path / "dump"))
        cube = hook.init_from_dir(folder, trusted_keys=[public_key])
        cube.dump(str(tmp_path / "dump"))
        assert holds_no_clear_memory(tmp_path / "dump")
        assert recipients_of(tmp_path / "dump", agekeys["bob"][0]) == sorted(
            [agekeys["alice"][1], agekeys["bob"][1]])
    finally:
        hook.uninstall()


def test_a_dump_mixing_cubes_with_different_readers_is_refused_unless_named(
        clear_cube, zoo, tmp_path, agekeys, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    private_key, public_key = make_key(tmp_path, "signer")
    for name, readers in (("for-alice", ["alice"]), ("for-both", ["alice", "bob"])):
        shutil.copytree(clear_cube, tmp_path / name)
        encrypt(tmp_path / name, [agekeys[r][1] for r in readers], sign_key=private_key)
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(agekeys["alice"][0]))
    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}}
    hook.uninstall()
    hook.install(require_pin=False, trusted_keys=[public_key])
    try:
        cube = GeneralMemCube(cube_config(zoo["a"], text_mem=text_mem))
        cube.act_mem.load(str(tmp_path / "for-alice"))
        cube.text_mem.load(str(tmp_path / "for-both"))
        with pytest.raises(UsageError, match="different recipients"):
            cube.dump(str(tmp_path / "dump"))
        assert not (tmp_path / "dump").exists()
    finally:
        hook.uninstall()


def test_a_clear_memory_never_writes_into_a_private_cubes_folder(installed, private, zoo):
    from memos.mem_cube.general import GeneralMemCube

    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([cube.act_mem.extract(OTHER)])
    before = sorted(p.name for p in private.rglob("*"))
    with pytest.raises(UsageError, match="holds a private cube"):
        cube.act_mem.dump(str(private))
    assert sorted(p.name for p in private.rglob("*")) == before


def test_pack_cube_of_a_cube_holding_private_memories_is_private(private, tmp_path, agekeys):
    hook.uninstall()
    hook.install(require_pin=False)
    try:
        cube = hook.init_from_dir(private)
        with pytest.raises(SignatureError):
            hook.pack_cube(cube, tmp_path / "packed")
        assert not (tmp_path / "packed").exists()
    finally:
        hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
    try:
        cube = hook.init_from_dir(private)
        hook.pack_cube(cube, tmp_path / "packed")
        assert holds_no_clear_memory(tmp_path / "packed")
        assert opens_to(tmp_path / "packed", agekeys["alice"][0])
    finally:
        hook.uninstall()


# --- stores: a private cube's text memories never persist in clear unnamed ----------------------

def _general_text(zoo, server, path: str) -> dict:
    return {"backend": "general_text", "config": {
        "extractor_llm": llm(zoo["a"]),
        "embedder": {"backend": "universal_api", "config": {
            "provider": "openai", "api_key": "x", "base_url": server.url,
            "model_name_or_path": server.model_name}},
        "vector_db": {"backend": "qdrant", "config": {
            "collection_name": "private_texts", "vector_dimension": 32, "distance_metric": "cosine",
            "path": path}}}}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from cubepack.testing.embeddings import EmbeddingServer, build_encoder

    with EmbeddingServer(build_encoder(tmp_path_factory.mktemp("encoder"), seed=0)) as server:
        yield server


def test_a_private_text_memory_goes_into_a_persistent_store_only_when_named(
        zoo, tmp_path, agekeys, embedder, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.textual.item import TextualMemoryItem

    monkeypatch.setenv("CUBEPACK_IDENTITY", str(agekeys["alice"][0]))
    store = tmp_path / "qdrant"
    hook.uninstall()
    cube = GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(zoo, embedder,
                                                                       ":memory:")))
    cube.text_mem.add([TextualMemoryItem(memory=text) for text in (SECRET, OTHER)])
    clear = hook.pack_cube(cube, tmp_path / "clear")
    encrypt(clear, [agekeys["alice"][1]])
    named = f"qdrant:{store.absolute()}"
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
    try:
        persistent = GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(
            zoo, embedder, str(store))))
        with pytest.raises(UsageError, match=re.escape(f"stores=['{named}']")):
            persistent.text_mem.load(str(clear))
        assert persistent.text_mem.get_all() == []
        persistent.text_mem.vector_db.client.close()  # Qdrant's local mode locks its folder
        with pytest.raises(UsageError, match="persists them"):  # before MemOS builds it
            hook.init_from_dir(clear, default_config=_default(zoo, embedder, store))
        in_memory = GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(
            zoo, embedder, ":memory:")))
        in_memory.text_mem.load(str(clear))
        assert sorted(m.memory for m in in_memory.text_mem.get_all()) == sorted([SECRET, OTHER])
        in_memory.text_mem.dump(str(tmp_path / "in-memory-dump"))
        assert holds_no_clear_memory(tmp_path / "in-memory-dump")
    finally:
        hook.uninstall()
    hook.install(require_pin=False, recipients=[agekeys["alice"][1]], stores=[named])
    try:
        persistent = GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(
            zoo, embedder, str(store))))
        persistent.text_mem.load(str(clear))
        assert len(persistent.text_mem.get_all()) == 2
        # The store is sealed: another memory reading the same database dumps private too.
        persistent.text_mem.vector_db.client.close()
        other = GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(
            zoo, embedder, str(store))))
        other.text_mem.dump(str(tmp_path / "store-dump"))
        assert holds_no_clear_memory(tmp_path / "store-dump")
        assert opens_to(tmp_path / "store-dump", agekeys["alice"][0])
    finally:
        hook.uninstall()


def _default(zoo, embedder, store):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    data = cube_config(zoo["a"], text_mem=_general_text(zoo, embedder, str(store))).model_dump(
        mode="json")
    return GeneralMemCubeConfig.model_validate(data)


# --- item 5: a hooked dump is what the memory holds ----------------------------------------------

def test_a_hooked_dump_replaces_the_pickle_and_the_deleted_items(installed, zoo, tmp_path):
    """The scheduler's round trip (two updates, then a reload) returned the first update's
    deleted memory (its KV file stayed beside the second's); an older MemOS pickle in the
    folder hid a newer hooked dump (the reload read the pickle)."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )

    path = tmp_path / "scheduler.kv_cache"
    manager = ActivationMemoryManager(str(path), monitor=None, log_func_callback=None,
                                      log_activation_memory_update_func=lambda **_: None)
    cube = GeneralMemCube(cube_config(zoo["a"]))
    manager.update_activation_memory(["A first update."], "label", "u1", "c1", cube)
    manager.update_activation_memory([OTHER], "label", "u1", "c1", cube)
    fresh = GeneralMemCube(cube_config(zoo["a"]))
    fresh.act_mem.load(str(path))
    [item] = fresh.act_mem.get_all()
    assert item.records.text_memories == [OTHER]
    # An older pickle beside (MemOS's own dump, made without the hook) is replaced by the dump.
    hook.uninstall()
    old = GeneralMemCube(cube_config(zoo["a"]))
    old.act_mem.add([old.act_mem.extract("An older memory, dumped by MemOS itself.")])
    old.act_mem.dump(str(tmp_path / "folder"))
    assert (tmp_path / "folder" / "activation_memory.pickle").is_file()
    hook.install(require_pin=False)
    cube.act_mem.dump(str(tmp_path / "folder"))
    assert not (tmp_path / "folder" / "activation_memory.pickle").exists()
    fresh = GeneralMemCube(cube_config(zoo["a"]))
    fresh.act_mem.load(str(tmp_path / "folder"))
    assert [i.id for i in fresh.act_mem.get_all()] == [i.id for i in cube.act_mem.get_all()]


def test_a_private_cache_copied_into_another_memory_keeps_its_seal(installed, private, zoo,
                                                                     tmp_path):
    """Privacy travels with the cache as its producer does: KVCacheMemory.add of a private
    cube's caches into a fresh memory (MemOS's own add, or a merge) seals that memory, so its
    dump is not written in clear."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.item import KVCacheItem

    cube = hook.init_from_dir(private)
    other = GeneralMemCube(cube_config(zoo["a"]))
    other.act_mem.add(cube.act_mem.get_all())
    with pytest.raises(SignatureError):
        other.act_mem.dump(str(tmp_path / "copy"))
    merged = cube.act_mem.get_cache([item.id for item in cube.act_mem.get_all()])
    third = GeneralMemCube(cube_config(zoo["a"]))
    third.act_mem.add([KVCacheItem(memory=merged, metadata={})])
    with pytest.raises(SignatureError):
        third.dump(str(tmp_path / "merged"))
    assert not (tmp_path / "copy").exists() and not (tmp_path / "merged").exists()
