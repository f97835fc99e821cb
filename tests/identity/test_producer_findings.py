"""A refusal says a memory "was produced by a different model" only when a field of its
producer's identity differs (issue #37 item 5): a cache too long or of a batch, ids outside the
vocabulary, a model holding adapter layers, a cache whose layers disagree with each other are
refused for what they are, and never blamed on another model.

The rule lives in :class:`cubepack.IdentityMismatch` (its finding follows its mismatches: only
the producer comparison's fields, :func:`cubepack.identity._identity.compare`, and a cache's
shape against its producer's, mark a difference as the producer's); each site below broke it.
"""

from __future__ import annotations

import pytest
import torch

import cubepack
from cubepack import IdentityMismatch
from cubepack.errors import Mismatch
from cubepack.identity._identity import compare
from cubepack.kv._format import structure_problems
from cubepack.kv._torch import cache_layers, live_layers, prefill

ANOTHER = "produced by a different model"


def test_the_finding_follows_the_mismatches(models):
    producer = compare(cubepack.fingerprint(models["a"]), cubepack.fingerprint(models["b"]))
    assert producer and ANOTHER in str(IdentityMismatch("This cache", producer))
    length = [Mismatch("seq_length", "<= 512", 600)]
    assert ANOTHER not in str(IdentityMismatch("This cache", length))
    assert ANOTHER not in str(IdentityMismatch("This cache", producer + length))
    assert ANOTHER not in str(IdentityMismatch("This cache", []))
    assert "found other" in str(IdentityMismatch("x", [], finding="found other"))


def test_a_cache_shape_against_its_producers_geometry_is_the_producers(models):
    """Another layer count or head count than the producer's: its producer did not make it.
    Layers that disagree with each other (lengths, batch) are malformed, not another model's."""
    deep = cubepack.fingerprint(models["deep"])
    layers = cache_layers(prefill(models["a"], torch.tensor([[5, 6, 7]])))
    assert ANOTHER in str(IdentityMismatch("x", structure_problems(live_layers(layers), deep)))
    kind, _, keys, values = layers[1]
    uneven = [layers[0], (kind, 2, keys[..., :2, :], values[..., :2, :])]
    own = cubepack.fingerprint(models["a"])
    problems = structure_problems(live_layers(uneven), own)
    assert problems and ANOTHER not in str(IdentityMismatch("x", problems))


def test_ids_outside_the_vocabulary_are_not_another_models(models):
    """The break: re-prefilling ids past the vocabulary said the activation "was produced by a
    different model" although its producer is the model (same tokenizer)."""
    from cubepack.memory._reprefill import reprefill

    identity = cubepack.fingerprint(models["a"])
    with pytest.raises(IdentityMismatch) as refused:
        reprefill(models["a"], "item", token_ids=[5, 6, 5000], metadata={}, producer=identity,
                  identity=identity, tokenizer=lambda: None)
    assert "token_ids: expected < 1000" in str(refused.value)
    assert ANOTHER not in str(refused.value)


def test_a_model_holding_adapter_layers_is_not_another_model(zoo, tmp_path):
    """The break: "Adapter 'lora' applies to its bare base model; the model given holds PEFT
    layers, so it was produced by a different model (...)"."""
    pytest.importorskip("peft", reason="adapters need peft")
    from peft import LoraConfig, inject_adapter_in_model

    from cubepack.testing import tiny

    from helpers import make_adapter

    cube = tmp_path / "cube"
    make_adapter(zoo["a"], cube / "parametric" / "lora", target_modules=["q_proj"])
    cubepack.pack(cube, cube_id="me/adapters")
    model = inject_adapter_in_model(LoraConfig(r=4, target_modules=["v_proj"]),
                                    tiny.load(zoo["a"]))
    with pytest.raises(IdentityMismatch, match="holds PEFT layers") as refused:
        cubepack.load_adapter(model, cube, "lora")
    assert ANOTHER not in str(refused.value)


def test_memos_a_pickled_cache_whose_layers_disagree_is_not_blamed_on_the_model(zoo, tmp_path):
    """The break: an unpacked MemOS folder whose cache has layers of different lengths was
    refused with "was produced by a different model (layers[1].cumulative_length ...). The
    model MemOS loaded is not the one that produced it"."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from memos.mem_cube.general import GeneralMemCube
    from transformers import DynamicCache

    import cubepack.memos as hook
    from cubepack.testing import tiny

    from memos_format import write_cube
    from memos_live import cube_config

    model = tiny.load(zoo["a"])
    short, long = (prefill(model, torch.tensor([ids])) for ids in ([5, 6, 7], [5, 6, 7, 8]))
    uneven = DynamicCache(config=model.config)
    for index, source in enumerate((short.layers[0], long.layers[1])):
        uneven.update(source.keys, source.values, index)
    folder = write_cube(tmp_path / "unpacked", str(zoo["a"]), {"item": uneven})
    hook.uninstall()
    hook.install(require_pin=False)
    try:
        memory = GeneralMemCube(cube_config(zoo["a"])).act_mem
        with pytest.raises(IdentityMismatch, match="cumulative_length") as refused:
            memory.load(str(folder))
    finally:
        hook.uninstall()
    message = str(refused.value)
    assert ANOTHER not in message and "not the one that produced it" not in message
