"""A refusal says a memory "was produced by a different model" only when a field of its
producer's identity differs (issue #37 item 5): a cache too long or of a batch, ids outside the
vocabulary, a model holding adapter layers, a cache whose layers disagree with each other are
refused for what they are, and never blamed on another model.

The rule lives in :class:`cubepack.IdentityMismatch` (its finding follows its mismatches: only
the producer comparison's fields, :func:`cubepack.identity._identity.compare`, and a cache's
shape against its producer's, mark a difference as the producer's); each site below broke it.
"""

from __future__ import annotations

import re

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
    from cubepack.kinds.activations._reprefill import reprefill

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


# --- every sentence that blames another model, swept from the source ---------------------------

#: What a message says when it blames another model (or tells the user the model is not the
#: producer), as a pattern over cubepack's string literals (docstrings and comments aside).
BLAME = re.compile(r"another model|different models?\b|other model|not the (model|one) that "
                   r"produced|produced by|model that produced", re.IGNORECASE)
#: Each place such a sentence is said (module: function), and what keeps it true there. A new
#: one fails :func:`test_every_sentence_blaming_another_model_is_kept_true` until it is here.
BLAMES = {
    "_util/checks.py: Catalogue": "the recompute check's fix, not a finding",
    "errors.py: IdentityMismatch": "said only when every mismatch is a producer field "
                                   "(of_producer), else the refusal's own finding",
    "errors.py: __init__": "IdentityMismatch's default advice, given only when of_producer",
    "memos/_use.py: register_cache": "compare() of the record's producer with the model",
    "memos/_use.py: checked_add": "compare() of the record's producer with the memory's model",
    "memos/_use.py: merged": "compare() of two parts' producers",
    "memos/_use.py: for_use": "only when a mismatch is a producer field (of_producer)",
    "memos/_activations.py: load_unpacked": "a MemOS producer record contradicts the model",
    "kinds/activations/_memos.py: mismatch": "only when the mismatch is the producer's",
    "memos/_activations.py: _add_prompts": "the record names another served model",
    "kinds/activations/_memos.py: prompt_file_items": "the file or pin names another served "
                                                      "model",
    "memos/_load.py: _pin_models": "config.json names another model than the lock's pin",
    "kinds/activations/_pack.py: _producer_provenance": "a MemOS producer record contradicts "
                                                        "the pin",
    "kinds/activations/_pack.py: _activation_entries": "compare() of the header's producer "
                                                       "with the pin",
    "kinds/activations/_upgrade.py: upgrade_file": "format 1's producer fields differ from the "
                                                   "model",
    "testing/tiny.py: (module)": "a line of the tiny tokenizer's training text, no message",
}


def blame_sites() -> dict[str, list[str]]:
    """(module: innermost function or class) -> the blaming literals said there."""
    import ast
    from pathlib import Path

    package = Path(cubepack.__file__).parent
    found: dict[str, list[str]] = {}
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

    def visit(node, where, docstring):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, scopes):
                body = child.body
                first = body[0].value if body and isinstance(body[0], ast.Expr) else None
                visit(child, f"{module}: {child.name}", first)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) \
                    and child is not docstring and BLAME.search(child.value):
                found.setdefault(where, []).append(child.value)
            else:
                visit(child, where, docstring)

    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        first = tree.body[0].value if tree.body and isinstance(tree.body[0], ast.Expr) else None
        visit(tree, f"{module}: (module)", first)
    return found


def test_every_sentence_blaming_another_model_is_kept_true():
    assert set(blame_sites()) == set(BLAMES)
