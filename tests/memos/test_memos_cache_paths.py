"""Every MemOS path that makes, stores, merges or uses a cache carries its producer, and a cache
of unknown origin is never used silently (issue #30 items 1, 2). Real MemoryOS 2.0.x, tiny
models A and B (same shapes, other weights: only the producer identity tells them apart).

The paths are found by sweeping MemOS's own source (every function that builds, stores,
merges, returns or consumes a cache), not listed by hand: a MemOS release that adds one fails
:func:`test_the_sweep_finds_exactly_the_paths_this_module_covers` until it is covered here.
"""

from __future__ import annotations

import ast
import copy
import pathlib

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack.memos as hook
from cubepack import IdentityMismatch, UnsupportedError

from memos_live import cube_config

MESSAGES = [{"role": "user", "content": "Where does the user live?"}]
TEXT = "The user lives in Berlin."
#: What marks a MemOS function as making, storing, merging or using a cache.
MARKERS = ("build_kv_cache", "build_vllm_kv_cache", "past_key_values", "DynamicCache",
           "_concat_caches", "kv_cache_memories[", "_prefill(", "KVCacheItem(")
#: Every function the sweep finds, and how the hook covers it: ``hooked`` (patched by
#: install), ``reaches`` (its cache goes through a hooked function, tested below), ``data``
#: (reads no model), ``out of reach`` (stated in SECURITY.md, tested as a limit).
COVERED = {
    "llms/hf.py HFLLM.build_kv_cache": "hooked",
    "llms/hf.py HFLLM._generate_with_cache": "hooked",
    "llms/hf.py HFLLM._generate_with_cache_stream": "hooked",
    "llms/hf.py HFLLM.generate": "reaches",
    "llms/hf.py HFLLM.generate_stream": "reaches",
    "llms/hf.py HFLLM._prefill": "out of reach",
    "memories/activation/kv.py KVCacheMemory.extract": "hooked",
    "memories/activation/kv.py KVCacheMemory.from_textual_memory": "hooked",
    "memories/activation/kv.py KVCacheMemory.add": "hooked",
    "memories/activation/kv.py KVCacheMemory.load": "hooked",
    "memories/activation/kv.py KVCacheMemory._concat_caches": "hooked",
    "memories/activation/kv.py KVCacheMemory.get_cache": "reaches",
    "memories/activation/kv.py move_dynamic_cache_htod": "reaches",
    "mem_chat/simple.py SimpleMemChat.run": "reaches",
    "mem_os/core.py MOSCore.chat": "reaches",
    "mem_os/main.py MOS._generate_enhanced_response_with_context": "reaches",
    "mem_scheduler/analyzer/mos_for_test_scheduler.py MOSForTestScheduler.chat": "reaches",
    "mem_os/utils/default_config.py get_default_cube_config": "data",
    "mem_os/utils/format_utils.py convert_activation_memory_to_serializable": "data",
    "llms/vllm.py VLLMLLM.build_vllm_kv_cache": "out of reach",
    "memories/activation/vllmkv.py VLLMKVCacheMemory.extract": "out of reach",
    "memories/activation/vllmkv.py VLLMKVCacheMemory.add": "out of reach",
    "memories/activation/vllmkv.py VLLMKVCacheMemory.from_textual_memory": "out of reach",
    "memories/activation/vllmkv.py VLLMKVCacheMemory.preload_kv_cache": "out of reach",
}


def swept() -> set[str]:
    root = pathlib.Path(memos.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if not any(marker in source for marker in MARKERS):
            continue
        tree = ast.parse(source)
        scopes = [(None, tree.body)] + [(node.name, node.body) for node in ast.walk(tree)
                                         if isinstance(node, ast.ClassDef)]
        for owner, body in scopes:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        marker in (ast.get_source_segment(source, node) or "")
                        for marker in MARKERS):
                    name = f"{owner}.{node.name}" if owner else node.name
                    found.add(f"{path.relative_to(root).as_posix()} {name}")
    return found


def test_the_sweep_finds_exactly_the_paths_this_module_covers(installed):
    assert swept() == set(COVERED)
    from memos.llms.hf import HFLLM
    from memos.memories.activation.kv import KVCacheMemory

    owners = {"HFLLM": HFLLM, "KVCacheMemory": KVCacheMemory}
    for where, how in COVERED.items():
        if how != "hooked":
            continue
        owner, _, method = where.split(" ")[1].partition(".")
        patched = owners[owner].__dict__[method]
        patched = getattr(patched, "__func__", patched)
        assert getattr(patched, "__module__", "").startswith("cubepack"), where


# --- the paths -------------------------------------------------------------------------------

@pytest.fixture
def llms(installed, zoo):
    """(act memory of model A, act memory of model B), through MemOS's own factories."""
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube(cube_config(zoo["a"])).act_mem, \
        GeneralMemCube(cube_config(zoo["b"])).act_mem


def answer(llm, cache=None):
    return llm.generate(MESSAGES, past_key_values=cache, max_tokens=3)


def test_build_kv_cache_of_b_handed_to_a_is_refused(llms):
    """The break: llm_B.build_kv_cache(text) handed to the hooked llm_A.generate answered from
    B's cache with A, no error."""
    a, b = llms
    cache = b.llm.build_kv_cache(TEXT)
    with pytest.raises(IdentityMismatch, match="different model.*weights_digest"):
        answer(a.llm, cache)
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        list(a.llm.generate_stream(MESSAGES, past_key_values=cache, max_tokens=3))
    assert isinstance(answer(b.llm, cache), str)  # its producer uses it


def test_a_direct_generate_with_cache_call_is_guarded_too(llms):
    a, b = llms
    cache = b.llm.build_kv_cache(TEXT)
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        a.llm._generate_with_cache("What?", cache, max_tokens=2)


def test_add_of_another_models_cache_is_refused_and_the_memory_unchanged(llms):
    """The break: KVCacheMemory(A).add([item with B's cache]) then get_cache used it."""
    from memos.memories.activation.item import KVCacheItem

    a, b = llms
    a.add([a.extract(TEXT)])
    before = dict(a.kv_cache_memories)
    foreign = KVCacheItem(memory=b.llm.build_kv_cache(TEXT), metadata={"source_text": TEXT})
    with pytest.raises(IdentityMismatch, match=f"{foreign.id}.*KVCacheMemory.add.*another model"):
        a.add([foreign])
    assert a.kv_cache_memories == before


def raw_cache(model, text_ids):
    """A cache made by a plain forward pass: cubepack never saw it made."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([text_ids]), use_cache=True).past_key_values


def test_a_cache_of_unknown_origin_follows_the_policy_everywhere(llms, monkeypatch):
    from memos.memories.activation.item import KVCacheItem

    a, _ = llms
    unknown = raw_cache(a.llm.model, [5, 6, 7, 8])
    item = KVCacheItem(memory=unknown, metadata={})
    for call in (lambda: a.add([item]), lambda: answer(a.llm, unknown)):
        with pytest.raises(IdentityMismatch) as refused:
            call()
        assert "of unknown origin" in str(refused.value)
        assert "cubepack.memos.register(cache, model)" in str(refused.value)
    # the merge: A's registered cache with an unregistered one is refused, not labelled A's
    a.add([a.extract(TEXT)])
    known = next(iter(a.kv_cache_memories))
    a.kv_cache_memories[item.id] = item  # stored behind the hook's back
    with pytest.raises(IdentityMismatch, match="Part 2 of a KVCacheMemory.get_cache merge"):
        a.get_cache([known, item.id])
    # once its producer is registered, it is that model's cache
    hook.register(unknown, a.llm.model)
    assert isinstance(answer(a.llm, unknown), str)


def test_drop_and_rebuild(zoo):
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.item import KVCacheItem

    hook.uninstall()
    hook.install(require_pin=False, on_mismatch="drop")
    try:
        a = GeneralMemCube(cube_config(zoo["a"])).act_mem
        b = GeneralMemCube(cube_config(zoo["b"])).act_mem
        foreign = b.llm.build_kv_cache(TEXT)
        assert answer(a.llm, foreign) == answer(a.llm)  # answered without it
        a.add([KVCacheItem(memory=foreign, metadata={})])
        assert a.kv_cache_memories == {}  # left out
    finally:
        hook.uninstall()
    hook.install(require_pin=False, on_mismatch="rebuild")
    try:
        a = GeneralMemCube(cube_config(zoo["a"])).act_mem
        b = GeneralMemCube(cube_config(zoo["b"])).act_mem
        item = KVCacheItem(memory=b.llm.build_kv_cache(TEXT), metadata={"source_text": TEXT})
        a.add([item])
        [stored] = a.kv_cache_memories.values()
        mine = a.llm.build_kv_cache(TEXT)
        assert all((x.keys == y.keys).all() for x, y in zip(stored.memory.layers, mine.layers))
        bare = KVCacheItem(memory=raw_cache(b.llm.model, [5, 6, 7]), metadata={})
        with pytest.raises(IdentityMismatch, match="no source text to rebuild"):
            a.add([bare])
    finally:
        hook.uninstall()


def test_a_device_move_keeps_the_producer(llms):
    from memos.memories.activation.kv import move_dynamic_cache_htod

    a, b = llms
    cache = move_dynamic_cache_htod(b.llm.build_kv_cache(TEXT), "cpu")
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        answer(a.llm, cache)
    moved = copy.deepcopy(a.llm.build_kv_cache(TEXT))
    assert isinstance(answer(a.llm, moved), str)


def test_chat_paths_reach_the_guard(llms):
    """MOSCore.chat, MOS, SimpleMemChat and the scheduler's test MOS all hand get_cache's
    merge to HFLLM.generate: the guarded use. Driven here through get_cache + generate, as
    they call them."""
    a, b = llms
    a.add([a.extract(TEXT)])
    merged = a.get_cache(list(a.kv_cache_memories))
    assert isinstance(answer(a.llm, merged), str)
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        answer(b.llm, merged)


def test_a_model_that_cannot_be_fingerprinted_is_a_typed_error_naming_the_call(llms):
    """MemOS's own test_kv::test_from_textual_memory builds with a MagicMock model: the hook
    says so in one sentence (it used to leak a raw HFValidationError)."""
    from unittest.mock import MagicMock

    a, _ = llms
    llm = copy.copy(a.llm)
    llm.model = MagicMock()
    with pytest.raises(UnsupportedError, match="HFLLM.build_kv_cache: cubepack cannot "
                                               "fingerprint the model"):
        from cubepack.memos._use import record_build

        record_build(llm, TEXT, a.llm.build_kv_cache(TEXT))


# --- the limits, each stated in SECURITY.md --------------------------------------------------

def test_limit_a_registered_cache_written_in_place_is_not_seen(llms):
    """The registry follows tensor objects, not their bytes: values written in place into a
    registered cache's tensors keep its record (verify --recompute, or reloading the cube,
    is what proves values)."""
    a, _ = llms
    cache = a.llm.build_kv_cache(TEXT)
    cache.layers[0].keys.mul_(2.0)  # same object, other values
    assert isinstance(answer(a.llm, cache), str)  # not refused: out of reach, and said


def test_limit_weights_overwritten_in_memory_keep_the_files_fingerprint(llms):
    """A loaded model's fingerprint is that of the files it was loaded from: overwriting its
    weights in memory afterwards is not seen."""
    import torch

    from cubepack import fingerprint

    a, _ = llms
    before = fingerprint(a.llm.model)
    with torch.no_grad():
        next(a.llm.model.parameters()).add_(1.0)
    assert fingerprint(a.llm.model).weights_digest == before.weights_digest


def test_limit_a_direct_prefill_call_is_not_guarded(llms):
    """HFLLM._prefill is MemOS's one-step forward inside the guarded generation (it receives
    the fresh view the guard made): a direct call with any cache is not checked."""
    import torch

    a, b = llms
    foreign = b.llm.build_kv_cache(TEXT)
    logits, _ = a.llm._prefill(torch.tensor([[5]]), foreign)
    assert logits.shape[-1] > 0
