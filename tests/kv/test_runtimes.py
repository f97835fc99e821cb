"""Every runtime implements the declared runtime interface (cubepack/kv/_runtime.py): the
proof's one contract with transformers, MLX and llama.cpp, checked on the classes themselves
(no model needed), member by member and parameter by parameter."""

from __future__ import annotations

import inspect

import pytest

from cubepack.kv._runtime import Incremental, ProvingRuntime, Runtime
from cubepack.kv._recompute import TorchRuntime
from cubepack.llamacpp._runtime import LlamaCppRuntime
from cubepack.mlx._runtime import MLXRuntime

#: runtime class -> the protocols it declares it implements
IMPLEMENTS = {
    TorchRuntime: (Runtime, ProvingRuntime, Incremental),
    MLXRuntime: (Runtime, ProvingRuntime),
    LlamaCppRuntime: (Runtime,),
}


def _members(protocol: type) -> dict[str, object]:
    """A protocol's own members (its methods, properties and annotated attributes)."""
    found: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or klass.__module__ == "typing":
            continue
        found.update({name: value for name, value in vars(klass).items()
                      if not name.startswith("_")})
        found.update({name: None for name in getattr(klass, "__annotations__", {})})
    return found


def _parameters(function: object) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()][1:]


@pytest.mark.parametrize("runtime", list(IMPLEMENTS), ids=lambda cls: cls.__name__)
def test_each_runtime_has_every_member_of_the_protocols_it_implements(runtime):
    for protocol in IMPLEMENTS[runtime]:
        for name, declared in _members(protocol).items():
            assert hasattr(runtime, name), f"{runtime.__name__} lacks {protocol.__name__}.{name}"
            own = inspect.getattr_static(runtime, name)
            if isinstance(declared, property):
                assert isinstance(own, property), f"{runtime.__name__}.{name} is no property"
            elif callable(declared):
                # the protocol's parameters, in order (a runtime may add defaults after them)
                assert _parameters(own)[:len(_parameters(declared))] == _parameters(declared), \
                    f"{runtime.__name__}.{name}{inspect.signature(own)}"


def test_the_protocols_name_what_the_proof_calls():
    """The members the shared proof calls on a runtime are declared (a proof that called an
    undeclared one would hold a runtime to a contract no page states)."""
    assert set(_members(Runtime)) == {"name", "vocab_size", "prefill_layers", "probe_logits"}
    assert set(_members(ProvingRuntime)) - set(_members(Runtime)) == {"prefill", "reference"}
    assert set(_members(Incremental)) == {"greedy"}
