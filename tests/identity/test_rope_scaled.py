"""A RoPE-scaled model (YaRN, dynamic NTK, LongRoPE) attends past ``max_position_embeddings``:
its own long caches are used, loaded and rebuilt, never refused as longer than that field, and
a cache refused for its length is never said to be another model's (issue #37 item 5).

Tiny Llamas with ``max_position_embeddings`` 32 and RoPE factor 4 (declared context 128), in
both environments (transformers 4.57 spells it ``rope_scaling``, 5.x ``rope_parameters``);
the MemOS paths run in the memos environment.
"""

from __future__ import annotations

import types

import pytest
import torch

import cubepack
from cubepack import IdentityMismatch, RecomputationFailed
from cubepack.kv._torch import prefill
from cubepack.testing import tiny

LONG = list(range(2, 62))  # 60 positions: past max_position_embeddings (32), inside 4 x 32
TOO_LONG = list(range(2, 142))  # 140: past what the config declares (128)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """kind -> (folder, loaded model), one per RoPE scaling."""
    root = tmp_path_factory.mktemp("rope")
    tokenizer = tiny.build_tokenizer()
    built = {}
    for kind in tiny.ROPE_SCALINGS:
        folder = tiny.build_model(root / kind, tiny.rope_scaled_config(kind), seed=0,
                                  tokenizer=tokenizer)
        built[kind] = (folder, tiny.load(folder))
    return built


def guarded(model):
    """The hook's use guard (``HFLLM._generate_with_cache`` under install()), driven with a
    real model, MemOS or not."""
    from cubepack.memos._use import guarded_use
    from cubepack.trust import TrustPolicy

    use = guarded_use(lambda self, query, kv, **kw: "used",
                      lambda self, query, **kw: "without a cache",
                      lambda: TrustPolicy(on_mismatch="error"))
    llm = types.SimpleNamespace(model=model, tokenizer=None)
    return lambda kv: use(llm, "What does the user drink?", kv)


def own_cache(model, ids):
    from cubepack.memos._use import register

    cache = prefill(model, torch.tensor([ids]))
    return register(cache, "own", cubepack.fingerprint(model), {}, ids)


@pytest.mark.parametrize("kind", tiny.ROPE_SCALINGS)
def test_a_rope_scaled_models_own_long_cache_is_used(scaled, kind):
    """The break: the guard refused the model's own 60-position cache as longer than
    ``max_position_embeddings`` (32), saying it "was produced by a different model"."""
    _, model = scaled[kind]
    assert guarded(model)(own_cache(model, LONG)) == "used"


@pytest.mark.parametrize("kind", tiny.ROPE_SCALINGS)
def test_past_the_declared_context_the_refusal_names_it_and_no_other_model(scaled, kind):
    _, model = scaled[kind]
    with pytest.raises(IdentityMismatch) as refused:
        guarded(model)(own_cache(model, TOO_LONG))
    message = str(refused.value)
    assert "produced by" not in message and "not the model that produced" not in message
    assert "seq_length: expected <= 128" in message and kind in message


@pytest.mark.parametrize("kind", tiny.ROPE_SCALINGS)
def test_a_rope_scaled_model_rebuilds_a_long_activation(scaled, kind):
    """Re-prefill (migrate, the hook's rebuild) refused 60 ids as more than the model attends
    over (``max_position_embeddings`` 32)."""
    from cubepack.kinds.activations._reprefill import reprefill

    _, model = scaled[kind]
    identity = cubepack.fingerprint(model)
    done = reprefill(model, "item", token_ids=LONG, metadata={}, producer=identity,
                     identity=identity, tokenizer=lambda: None)
    assert done.cache.get_seq_length() == len(LONG)
    with pytest.raises(RecomputationFailed, match=f"128.*{kind}"):
        reprefill(model, "item", token_ids=TOO_LONG, metadata={}, producer=identity,
                  identity=identity, tokenizer=lambda: None)


# --- through MemOS -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", tiny.ROPE_SCALINGS)
def test_through_memos_a_long_memory_of_a_rope_scaled_model_loads_and_answers(
        scaled, kind, tmp_path):
    """MemOS's own calls under the hook: a long memory extracted by the model, dumped, loaded
    back (the load's use check) and used in a chat."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from memos.mem_cube.general import GeneralMemCube

    import cubepack.memos as hook

    from memos_live import cube_config

    folder, _ = scaled[kind]
    text = " ".join(["The user likes green tea and long walks."] * 6)
    hook.uninstall()
    hook.install(require_pin=False)
    try:
        cube = GeneralMemCube(cube_config(folder))
        item = cube.act_mem.extract(text)
        assert item.memory.get_seq_length() > 32  # longer than max_position_embeddings
        cube.act_mem.add([item])
        merged = cube.act_mem.get_cache([item.id])
        assert isinstance(cube.act_mem.llm.generate(
            [{"role": "user", "content": "What does the user drink?"}],
            past_key_values=merged), str)
        cube.dump(str(tmp_path / "dumped"))
        loaded = GeneralMemCube.init_from_dir(str(tmp_path / "dumped"))
        [back] = loaded.act_mem.get_all()
        assert back.memory.get_seq_length() == item.memory.get_seq_length()
    finally:
        hook.uninstall()
