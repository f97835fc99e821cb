"""The MemOS hook attacked where MemOS uses and moves caches: copies and merges keep their
producer, caches changed since cubepack checked them are refused, legacy pickles cannot inflate
memory, unpacked folders cannot escape or block, loads are all-or-nothing, a dump and a load
give back exactly what MemOS held, and uninstall gives MemOS back its own methods.
Real MemoryOS, tiny models (memos environment)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import FormatError, IdentityMismatch, UnsafeInputError

from helpers import rewrite_kv_metadata
from memos_live import cube_config, vllm_memory

MESSAGES = [{"role": "user", "content": "What does the user drink?"}]
TEXTS = ["The user likes green tea.", "He walks every morning."]


def _cube(model):
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(model))


@pytest.fixture
def memories(installed, zoo):
    """(memory of model A holding two extracted items, memory of model B): B has A's shape,
    other weights, so only the producer identity tells them apart."""
    a, b = _cube(zoo["a"]).act_mem, _cube(zoo["b"]).act_mem
    a.add([a.extract(text) for text in TEXTS])
    return a, b


def _first(memory):
    return memory.get_all()[0]


# --- copies and merges keep their producer -----------------------------------------------------

COPIES = {
    "deepcopy": lambda item: copy.deepcopy(item.memory),
    "model_copy": lambda item: item.model_copy(deep=True).memory,
    "pickle round trip": lambda item: pickle.loads(pickle.dumps(item.memory)),
    "legacy tuple": lambda item: tuple((layer.keys, layer.values) for layer in item.memory.layers),
}


@pytest.mark.parametrize("how", COPIES)
def test_a_copy_of_a_cache_is_still_its_producers(memories, how):
    a, b = memories
    cache = COPIES[how](_first(a))
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        b.llm.generate(MESSAGES, past_key_values=cache, max_tokens=2)
    assert isinstance(a.llm.generate(MESSAGES, past_key_values=COPIES[how](_first(a)),
                                     max_tokens=2), str)


def test_from_textual_memory_registers_its_producer(installed, zoo):
    from memos.memories.textual.item import TextualMemoryItem

    a, b = _cube(zoo["a"]).act_mem, _cube(zoo["b"]).act_mem
    item = a.from_textual_memory(TextualMemoryItem(memory=TEXTS[0]))
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        b.llm.generate(MESSAGES, past_key_values=item.memory, max_tokens=2)


def test_get_cache_merges_hold_their_parts_and_carry_their_producer(memories):
    """MemOS's _concat_caches assigns tensors to fresh layers, which transformers >= 4.56 treats
    as empty (plain MemOS answers without the merged memories); under the hook the merge holds
    both parts, and only their producer may use it."""
    a, b = memories
    first, second = a.get_all()
    merged = a.get_cache([first.id, second.id])
    assert merged.get_seq_length() == (first.memory.get_seq_length()
                                       + second.memory.get_seq_length())
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        b.llm.generate(MESSAGES, past_key_values=merged, max_tokens=2)
    assert isinstance(a.llm.generate(MESSAGES, past_key_values=merged, max_tokens=2), str)


def test_a_merge_of_two_producers_caches_is_refused(memories):
    a, b = memories
    other = b.extract(TEXTS[1])
    with pytest.raises(IdentityMismatch, match="merged activations"):
        a._concat_caches([_first(a).memory, other.memory])


# --- a cache changed since it was checked is no longer the memory ------------------------------

def test_a_cache_grown_in_place_is_refused(memories):
    import torch

    a, _ = memories
    item = _first(a)
    before = item.memory.get_seq_length()
    with torch.no_grad():  # what MemOS's own _generate_with_cache does to the stored cache
        a.llm.model(torch.tensor([[5, 6, 7]]), past_key_values=item.memory, use_cache=True)
    assert item.memory.get_seq_length() == before + 3
    with pytest.raises(IdentityMismatch, match="content"):
        a.llm.generate(MESSAGES, past_key_values=item.memory, max_tokens=2)


def test_a_cache_whose_tensors_were_swapped_is_refused(memories):
    a, b = memories
    item, foreign = _first(a), b.extract(TEXTS[0])
    mine, theirs = item.memory.layers[0], foreign.memory.layers[0]
    mine.keys, mine.values = theirs.keys, theirs.values  # one layer: no cache's content now
    with pytest.raises(IdentityMismatch, match="content"):
        a.llm.generate(MESSAGES, past_key_values=item.memory, max_tokens=2)
    for mine, theirs in zip(item.memory.layers, foreign.memory.layers):
        mine.keys, mine.values = theirs.keys, theirs.values  # all: B's cache, B's producer
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        a.llm.generate(MESSAGES, past_key_values=item.memory, max_tokens=2)


def test_an_unknown_cache_of_two_sequences_is_refused_not_a_runtime_error(memories):
    import torch
    from transformers import DynamicCache

    a, _ = memories
    source = _first(a).memory
    cache = DynamicCache()
    for index, layer in enumerate(source.layers):
        cache.update(torch.cat([layer.keys] * 2), torch.cat([layer.values] * 2), index)
    with pytest.raises(IdentityMismatch, match="of unknown origin, so it is not used"):
        a.llm.generate(MESSAGES, past_key_values=cache, max_tokens=2)
    from cubepack import memos

    memos.register(cache, a.llm.model)  # its producer told: then its shape is the refusal
    with pytest.raises(IdentityMismatch, match="batch: expected 1, found 2"):
        a.llm.generate(MESSAGES, past_key_values=cache, max_tokens=2)


def test_a_stream_is_checked_before_its_first_token(memories):
    a, b = memories
    stream = b.llm.generate_stream(MESSAGES, past_key_values=_first(a).memory, max_tokens=2)
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        next(iter(stream))


# --- legacy pickles cannot inflate memory ------------------------------------------------------

def test_a_pickled_tensor_that_reuses_its_bytes_is_refused(zoo, tmp_path):
    """A 22 KB pickle whose tensors have stride 0 along the sequence would be 256 MB of
    positions the moment a model uses it."""
    hook.uninstall()
    cube = _cube(zoo["a"])
    item = cube.act_mem.extract(TEXTS[0])
    for layer in item.memory.layers:
        layer.keys = layer.keys[:, :, :1, :].expand(1, 2, 500_000, 16)
        layer.values = layer.values[:, :, :1, :].expand(1, 2, 500_000, 16)
    cube.act_mem.add([item])
    cube.dump(str(tmp_path / "bomb"))
    assert (tmp_path / "bomb" / "activation_memory.pickle").stat().st_size < 100_000
    hook.install(require_pin=False)
    try:
        memory = _cube(zoo["a"]).act_mem
        with pytest.raises(UnsafeInputError, match="overlapping strides"):
            memory.load(str(tmp_path / "bomb"))
        assert memory.get_all() == []
    finally:
        hook.uninstall()
    with pytest.raises(UnsafeInputError, match="overlapping strides"):
        cubepack.pack(tmp_path / "bomb", legacy_pickle=True)


# --- unpacked folders: nothing escapes, nothing blocks, duplicates named -----------------------

@pytest.fixture
def lockless(memories, tmp_path):
    """A hooked dump of model A's memory with its lock removed: KV files only."""
    a, _ = memories
    folder = hook.pack_cube(_wrap(a), tmp_path / "lockless")
    (folder / "cubepack.lock").unlink()
    return folder


def _wrap(act_mem):
    cube = _cube(act_mem.llm.config.model_name_or_path)
    cube.act_mem.kv_cache_memories = dict(act_mem.kv_cache_memories)
    return cube


def _kv_files(folder):
    return sorted((folder / "activations").glob("*.kv.safetensors"))


def test_a_config_naming_a_memory_file_outside_the_folder_is_refused(memories, lockless,
                                                                      tmp_path):
    a, _ = memories
    target = tmp_path / "victim"
    target.mkdir()
    a.config.memory_filename = f"../{target.name}/activation_memory.pickle"
    (target / "activation_memory.pickle").write_bytes(pickle.dumps({"kv_cache_memories": {}}))
    with pytest.raises(UnsafeInputError, match="not a path inside the cube"):
        a.load(str(lockless))


def test_a_symlinked_activations_folder_is_refused(memories, lockless, tmp_path):
    a, _ = memories
    shutil.move(lockless / "activations", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", lockless / "activations")
    with pytest.raises(UnsafeInputError, match="symlink or not a folder"):
        a.load(str(lockless))


def test_a_fifo_among_the_kv_files_is_refused_without_blocking(memories, lockless):
    a, _ = memories
    os.mkfifo(lockless / "activations" / "x.kv.safetensors")
    with pytest.raises(UnsafeInputError, match="not a regular file"):
        a.load(str(lockless))


def test_two_kv_files_claiming_one_id_are_refused(memories, lockless):
    a, _ = memories
    first = _kv_files(lockless)[0]
    shutil.copy(first, lockless / "activations" / "copy.kv.safetensors")
    with pytest.raises(FormatError, match="carry the id"):
        a.load(str(lockless))


def test_recompute_catches_a_forged_header_in_an_unpacked_folder(memories, lockless, zoo):
    """Without a lock a KV header's producer is a claim: B's tensors under A's header load
    (unverified, warned); with recompute the live model disproves them."""
    a, _b = memories
    foreign = _cube(zoo["b"])
    foreign.act_mem.add([foreign.act_mem.extract(TEXTS[0])])
    forged_source = _kv_files(hook.pack_cube(foreign, lockless.parent / "b-cube"))[0]
    honest = _kv_files(lockless)[0]
    honest_meta = cubepack.read_kv_header(honest)

    def claim_a(meta):
        meta["producer"] = json.loads(json.dumps(honest_meta.producer.to_dict()))

    for path in _kv_files(lockless):
        path.unlink()
    rewrite_kv_metadata(forged_source, honest, claim_a)
    a.load(str(lockless))  # a claim nobody checked: loaded, as the warning says
    hook.uninstall()
    hook.install(require_pin=False, recompute=True)
    fresh = _cube(zoo["a"]).act_mem
    with pytest.raises(cubepack.RefusedError, match="recompute"):
        fresh.load(str(lockless))
    assert fresh.get_all() == []


# --- loads are all or nothing ------------------------------------------------------------------

def test_a_refused_load_leaves_the_memory_as_it_was(memories, zoo, tmp_path):
    from memos.memories.activation.item import KVCacheItem

    a, _ = memories
    deep = _cube(zoo["deep"]).act_mem
    recorded = _first(a).model_copy(update={"metadata": {  # A's, recorded (MemOS #2305)
        **(_first(a).metadata or {}), "producer": {"model_name_or_path": str(zoo["a"])}}})
    mixed = {"a_item": recorded, "z_deep": KVCacheItem(id="z_deep",
                                                        memory=deep.extract(TEXTS[0]).memory)}
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "activation_memory.pickle").write_bytes(pickle.dumps({"kv_cache_memories": mixed}))
    target = _cube(zoo["a"]).act_mem
    target.add([target.extract("Previous memory.")])
    before = [item.id for item in target.get_all()]
    with pytest.raises(IdentityMismatch, match="z_deep"):
        target.load(str(folder))
    assert [item.id for item in target.get_all()] == before


# --- a dump and a load give back what MemOS held -----------------------------------------------

def test_dump_then_load_keeps_metadata_and_records_exactly(memories, tmp_path):
    a, _ = memories
    item = _first(a)
    item.metadata = {**(item.metadata or {}), "tags": ["x", 1], "id": "not-the-item-id"}
    item.records.text_memories = ["The user likes green tea."]
    a.dump(str(tmp_path / "dump"))
    again = _cube(a.llm.config.model_name_or_path).act_mem
    again.load(str(tmp_path / "dump"))
    loaded = again.get(item.id)
    assert loaded.metadata == item.metadata
    assert loaded.records.text_memories == item.records.text_memories


def test_vllm_prompts_round_trip_and_their_records_are_enforced(installed, tmp_path):
    from memos.memories.activation.item import VLLMKVCacheItem

    served = "Qwen/Qwen3-8B"
    memory = vllm_memory(served)
    memory.kv_cache_memories = {"p1": VLLMKVCacheItem(id="p1", memory="<prompt>", metadata={})}
    memory.dump(str(tmp_path / "dump"))
    again = vllm_memory(served)
    again.load(str(tmp_path / "dump"))
    assert [item.memory for item in again.get_all()] == ["<prompt>"]
    with pytest.raises(IdentityMismatch, match=served):
        vllm_memory("meta-llama/Llama-3-8B").load(str(tmp_path / "dump"))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "activation_memory.pickle").write_bytes(pickle.dumps({
        "kv_cache_memories": memory.kv_cache_memories,
        "model_identity": {"model_name_or_path": served}}))  # MemOS PR #2302's record
    with pytest.raises(IdentityMismatch, match="record.model_name_or_path"):
        vllm_memory("meta-llama/Llama-3-8B").load(str(plain))


# --- uninstall gives MemOS back its own methods ------------------------------------------------

def test_each_wrapper_unwraps_to_its_own_class_and_later_patches_survive_uninstall():
    import inspect

    from memos.memories.activation.kv import KVCacheMemory
    from memos.memories.activation.vllmkv import VLLMKVCacheMemory

    hook.uninstall()
    own_kv, own_vllm = KVCacheMemory.load, VLLMKVCacheMemory.load
    own_dump = KVCacheMemory.__dict__["dump"]
    hook.install(require_pin=False)
    try:
        assert inspect.unwrap(KVCacheMemory.load) is own_kv
        assert inspect.unwrap(VLLMKVCacheMemory.load) is own_vllm

        def theirs(self, *args, **kwargs):
            return "third party"

        KVCacheMemory.dump = theirs
    finally:
        hook.uninstall()
    try:
        assert KVCacheMemory.load is own_kv and VLLMKVCacheMemory.load is own_vllm
        assert KVCacheMemory.dump is theirs
    finally:
        KVCacheMemory.dump = own_dump
