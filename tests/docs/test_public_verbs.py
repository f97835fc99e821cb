"""Every public verb's docstring says what it returns and shows a short example, and each
example calls cubepack as its signature allows (the call is bound to the signature: a renamed
or keyword-only parameter, a missing argument, fails here, not in a reader's session)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re

import pytest

import cubepack

VERBS = sorted(name for name in cubepack.__all__ if inspect.isfunction(getattr(cubepack, name)))


def _example(name: str) -> str:
    doc = inspect.getdoc(getattr(cubepack, name)) or ""
    found = re.search(r"^Example:\n\s*```python\n(.*?)\n\s*```", doc, re.S | re.M)
    assert found, f"cubepack.{name}'s docstring shows no example (an 'Example:' section)"
    return inspect.cleandoc("\n" + found.group(1))


@pytest.mark.parametrize("name", VERBS)
def test_each_public_verb_says_what_it_returns_and_shows_an_example(name):
    doc = inspect.getdoc(getattr(cubepack, name)) or ""
    assert re.search(r"^Returns:\n\s+\S", doc, re.M), f"cubepack.{name} says not what it returns"
    calls = [node for node in ast.walk(ast.parse(_example(name)))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "cubepack"]
    assert name in {call.func.attr for call in calls}, f"cubepack.{name}'s example calls it not"
    fields = {field.name for field in dataclasses.fields(cubepack.TrustPolicy)}
    for call in calls:
        # Every argument is a placeholder: what is checked is that the call fits.
        signature = inspect.signature(getattr(cubepack, call.func.attr))
        bound = signature.bind(*[None] * len(call.args), **{kw.arg: None for kw in call.keywords})
        # A verb's **options are a trust policy's fields (TrustPolicy.build refuses others).
        assert set(bound.arguments.get("options", {})) <= fields, (call.func.attr, bound.arguments)


def test_the_example_check_can_fail():
    """Planted: a call passing a keyword-only parameter by position does not bind."""
    with pytest.raises(TypeError):
        inspect.signature(cubepack.save_kv_cache).bind(None, None, None)
