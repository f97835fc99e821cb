"""The policy is applied whole, by one rule: every consumer either applies each field a
TrustPolicy sets or refuses the request with a UsageError before any work (never drops it).
Swept over every consumer and every field."""

from __future__ import annotations

from dataclasses import fields

import pytest

import cubepack
from cubepack.trust import _policy
from cubepack.trust._policy import HONOURED, TrustPolicy

from helpers import make_key

#: A non-default, valid value for each field (keys are made per test).
VALUES = {"model": "some/model", "require_signature": True, "require_lineage": True,
          "recompute": True, "recompute_tokens": 3, "seed": 7, "require_provenance": "recorded",
          "embedder": "some-embedder", "embedder_sample": 0, "strict_models": True,
          "on_mismatch": "drop", "require_pin": True}


def policy_setting(field, key):
    value = (key,) if field == "trusted_keys" else VALUES[field]
    extra = {"trusted_keys": (key,)} if field == "require_lineage" else {}
    return TrustPolicy(**{field: value}, **extra)


def test_every_field_has_a_value_and_every_consumer_an_entry():
    assert set(VALUES) | {"trusted_keys"} == {f.name for f in fields(TrustPolicy)}
    assert set(HONOURED) == {"verify", "pull", "migrate", "load_adapter", "load_kv_cache",
                             "the MLX load", "the MemOS hook", "encrypt", "rekey"}


@pytest.mark.parametrize("consumer", sorted(HONOURED))
@pytest.mark.parametrize("field", sorted(f.name for f in fields(TrustPolicy)))
def test_a_field_a_consumer_cannot_apply_is_refused_naming_it(consumer, field, tmp_path):
    _, public = make_key(tmp_path, "k")
    policy = policy_setting(field, str(public))
    honoured, _ = HONOURED[consumer]
    if field == "embedder_sample" and "embedder" in honoured:  # a sample of no embedder
        with pytest.raises(cubepack.UsageError, match="give --embedder too"):
            policy.require_honoured(consumer)
    elif field in honoured:
        policy.require_honoured(consumer)  # applied: no refusal
    else:
        with pytest.raises(cubepack.UsageError, match=f"{consumer} cannot honour .*{field}"):
            policy.require_honoured(consumer)


#: The checks each field asks for when set (the others ask for none: they say how, or where).
ASKS = {"trusted_keys": {"signature"}, "require_signature": {"signature"},
        "require_lineage": {"signature", "lineage"}, "strict_models": {"model identity"},
        "recompute": {"recompute"}, "recompute_tokens": {"recompute"},
        "require_provenance": {"provenance"}, "embedder": {"embedder"}}


@pytest.mark.parametrize("field", sorted(f.name for f in fields(TrustPolicy)))
def test_each_field_asks_for_its_checks_and_without_them_for_none(field, tmp_path):
    """``asks`` is the one mapping from fields to checks (verify listed it twice, the hook a
    third time): swept over every field; ``without`` those checks, a policy asks none."""
    from cubepack._util.checks import Catalogue

    _, public = make_key(tmp_path, "k")
    policy = policy_setting(field, str(public))
    asked = policy.asked_checks()
    assert {entry.value for entry in asked} == ASKS.get(field, set())
    assert asked == [entry for entry in Catalogue if policy.asks(entry)]
    assert policy.without(*asked).asked_checks() == []
    assert TrustPolicy().asked_checks() == []
    for spelled in ("signature", *ASKS.get(field, ())):  # never by a name spelled again
        with pytest.raises(TypeError, match="Catalogue"):
            policy.asks(spelled)
        with pytest.raises(TypeError, match="Catalogue"):
            policy.without(spelled)


# --- the consumers themselves call the rule, before any work ----------------------------------

def test_load_kv_cache_refuses_what_a_lone_kv_file_cannot_prove(models, prompt_ids, tmp_path):
    path = tmp_path / "a.kv.safetensors"
    cubepack.save_kv_cache(cubepack.prefill(models["a"], prompt_ids), path,
                           producer=models["a"], token_ids=prompt_ids)
    _, public = make_key(tmp_path, "k")
    with pytest.raises(cubepack.UsageError, match="verify the cube it belongs to"):
        cubepack.load_kv_cache(path, models["a"], trusted_keys=[public])
    with pytest.raises(cubepack.UsageError, match="require_provenance"):
        cubepack.load_kv_cache(path, models["a"], require_provenance="recomputed")
    # recompute: applied, by this model's own prefill
    cache = cubepack.load_kv_cache(path, models["a"], recompute=True)
    assert cache.get_seq_length() == prompt_ids.shape[1]


def test_load_kv_cache_recompute_refuses_a_cache_the_model_does_not_reproduce(
        models, prompt_ids, tmp_path):
    """Same producer identity in the header, but values changed: the producer check passes,
    and only the proof asked for catches it."""
    from helpers import rewrite_kv_metadata  # noqa: F401 - the header stays as written

    path = tmp_path / "a.kv.safetensors"
    cache = cubepack.prefill(models["a"], prompt_ids)
    layer = cache.layers[0]
    layer.keys = layer.keys + 0.5
    cubepack.save_kv_cache(cache, path, producer=models["a"], token_ids=prompt_ids)
    assert cubepack.load_kv_cache(path, models["a"]).get_seq_length() == prompt_ids.shape[1]
    with pytest.raises(cubepack.RecomputationFailed, match="does not reproduce"):
        cubepack.load_kv_cache(path, models["a"], recompute=True)


def test_load_adapter_applies_require_lineage_as_verify_does(tmp_path, zoo, models):
    """The break: load_adapter(require_lineage=True) took the policy and honoured part of it."""
    from helpers import make_adapter

    cube = tmp_path / "cube"
    make_adapter(zoo["a"], cube / "parametric" / "lora")
    cubepack.pack(cube, cube_id="alice/cube")
    private, public = make_key(tmp_path, "k")
    cubepack.sign(cube, private)  # signed, but no lineage a signer derived... a root: fine
    assert cubepack.verify(cube, trusted_keys=[public], require_lineage=True).ok
    (cube / "cubepack.intoto.json").unlink()  # now verify --require-lineage refuses it
    with pytest.raises(cubepack.VerificationFailed):
        cubepack.verify(cube, trusted_keys=[public], require_lineage=True)
    with pytest.raises(cubepack.VerificationFailed, match="attestation"):
        cubepack.load_adapter(models["a"], cube, trusted_keys=[public], require_lineage=True)
    with pytest.raises(cubepack.UsageError, match="on_mismatch"):
        cubepack.load_adapter(models["a"], cube, on_mismatch="drop")


def test_verify_pull_and_migrate_refuse_before_any_work(packed_cube_factory, tmp_path):
    cube = packed_cube_factory()
    with pytest.raises(cubepack.UsageError, match="verify cannot honour on_mismatch"):
        cubepack.verify(cube, on_mismatch="drop")
    with pytest.raises(cubepack.UsageError, match="pull cannot honour on_mismatch"):
        cubepack.pull("ns/cube@" + "0" * 40, on_mismatch="drop", local_dir=tmp_path / "out",
                      endpoint="http://127.0.0.1:9")  # refused before any request
    assert not (tmp_path / "out").exists()
    with pytest.raises(cubepack.UsageError, match="migrate cannot honour require_pin"):
        cubepack.migrate(cube, out=tmp_path / "new", model="x", require_pin=True)
    assert not (tmp_path / "new").exists()


def test_pull_applies_require_pin(tmp_path):
    with pytest.raises(cubepack.UsageError, match="a branch or tag can move"):
        cubepack.pull("ns/cube@main", require_pin=True, local_dir=tmp_path / "out",
                      endpoint="http://127.0.0.1:9")


def test_tightened_never_loosens_a_field():
    strict = TrustPolicy(require_signature=True, on_mismatch="error", recompute=True,
                         require_provenance="recomputed", require_pin=True, strict_models=True)
    loose = TrustPolicy(on_mismatch="rebuild", recompute_tokens=4, require_provenance="recorded")
    everything = [f.name for f in fields(TrustPolicy)]  # strict says each field, defaults too
    for combined in (strict.tightened(loose), loose.tightened(strict, everything)):
        assert combined.require_signature and combined.recompute and combined.require_pin
        assert combined.recompute_tokens is None  # a full recomputation beats a sample
        assert (combined.on_mismatch, combined.require_provenance) == ("error", "recomputed")
        assert combined.strict_models


#: The policy's own modules: what a field means is decided there.
POLICY_PART = "trust"
#: Methods that return a TrustPolicy, wherever they are defined (others are found by their
#: ``-> TrustPolicy`` annotation).
POLICY_METHODS = {"build", "for_folder", "tightened", "without", "honoured_by", "TrustPolicy"}


def policy_field_reads(tree, returning: set[str]) -> list[tuple[int, str]]:
    """Where ``tree`` reads a TrustPolicy field (``policy.recompute``, ``getattr(policy,
    name)``, ``policy.to_dict()["seed"]``) on a policy: a name or attribute called
    ``*policy*`` or ``*settings*``, a name annotated ``TrustPolicy`` or assigned from a call
    that returns one (in its function, or an enclosing one), or such a call itself."""
    import ast

    wanted = {f.name for f in fields(TrustPolicy)}
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

    def called(node):
        func = node.func
        return func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else ""

    def own(scope):
        """The nodes of ``scope`` outside the functions it defines."""
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            yield node
            if not isinstance(node, scopes):
                todo.extend(ast.iter_child_nodes(node))

    def reads(scope, typed: set[str]) -> list[tuple[int, str]]:
        def is_policy(node) -> bool:
            if isinstance(node, ast.Name):
                return node.id in typed or "policy" in node.id.lower()
            if isinstance(node, ast.Attribute):
                return "policy" in node.attr.lower() or "settings" in node.attr.lower()
            return isinstance(node, ast.Call) and called(node) in returning | POLICY_METHODS

        nodes = list(own(scope))
        args = scope.args.args + scope.args.kwonlyargs if isinstance(scope, scopes) else []
        typed = typed | {arg.arg for arg in args if arg.annotation is not None
                         and "TrustPolicy" in ast.unparse(arg.annotation)}
        typed |= {node.target.id for node in nodes if isinstance(node, ast.AnnAssign)
                  and isinstance(node.target, ast.Name)
                  and "TrustPolicy" in ast.unparse(node.annotation)}
        typed |= {target.id for node in nodes if isinstance(node, ast.Assign)
                  and is_policy(node.value) for target in node.targets
                  if isinstance(target, ast.Name)}  # current = _hook_settings()
        found = [(node.lineno, node.attr) for node in nodes
                 if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                 and node.attr in wanted and is_policy(node.value)]
        # getattr(policy, name) reads a field whatever the name; policy.to_dict()["seed"] too.
        found += [(node.lineno, ast.unparse(node.args[1])) for node in nodes
                  if isinstance(node, ast.Call) and called(node) == "getattr"
                  and len(node.args) > 1 and is_policy(node.args[0])
                  and not (isinstance(node.args[1], ast.Constant)
                           and node.args[1].value not in wanted)]
        found += [(node.lineno, node.slice.value) for node in nodes
                  if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
                  and called(node.value) == "to_dict"
                  and isinstance(node.value.func, ast.Attribute)
                  and is_policy(node.value.func.value) and isinstance(node.slice, ast.Constant)
                  and node.slice.value in wanted]
        for node in nodes:
            if isinstance(node, scopes):
                found += reads(node, typed)
        return found

    return sorted(reads(tree, set()))


def test_no_consumer_reads_a_policy_field_outside_the_policy_module():
    """No module outside ``trust/`` reads a TrustPolicy field: a consumer asks the policy
    (``asks(check)``, ``recomputation()``, ``mismatch_action()``...) or lets it apply itself
    (``require_pinned``, ``without``), so what a field means is decided once (verify, pull,
    ``verify --remote``, encrypt, the loads, MLX and the MemOS hook read 79 in 13 modules).
    The hook's settings are the policy itself, never a second settings object."""
    import ast
    from pathlib import Path

    import cubepack.memos as memos_face

    assert "HookSettings" not in dir(memos_face)
    assert _policy.POLICIES == ("error", "drop", "rebuild")
    package = Path(cubepack.__file__).parent
    trees = {path.relative_to(package).as_posix(): ast.parse(path.read_text())
             for path in sorted(package.rglob("*.py"))}
    returning = {node.name for tree in trees.values() for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.returns is not None and "TrustPolicy" in ast.unparse(node.returns)}
    found = {name: reads for name, tree in trees.items()
             if name.split("/")[0] != POLICY_PART
             and (reads := policy_field_reads(tree, returning))}
    assert found == {}
