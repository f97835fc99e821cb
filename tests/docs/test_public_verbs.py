"""Every public verb's docstring says what it returns and shows a short example, and each
example calls cubepack as its signature allows (the call is bound to the signature: a renamed
or keyword-only parameter, a missing argument, fails here, not in a reader's session)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing

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
    for call in calls:
        # Every argument is a placeholder: what is checked is that the call fits.
        verb = getattr(cubepack, call.func.attr)
        signature = inspect.signature(verb)
        bound = signature.bind(*[None] * len(call.args), **{kw.arg: None for kw in call.keywords})
        # A verb's keyword arguments beyond its parameters are its options object's fields
        # and, for a verb taking a policy, a trust policy's (each refuses others).
        extra = next((bound.arguments.get(p.name, {}) for p in signature.parameters.values()
                      if p.kind is p.VAR_KEYWORD), {})
        assert set(extra) <= taken_through_keywords(verb), (call.func.attr, bound.arguments)


def taken_through_keywords(verb) -> set[str]:
    """The names a verb's ``**`` takes: its options object's fields (the type its
    ``options`` parameter is annotated with), a trust policy's when it takes ``policy``."""
    hints = typing.get_type_hints(inspect.unwrap(verb))
    names: set[str] = set()
    if "policy" in hints:
        names |= {field.name for field in dataclasses.fields(cubepack.TrustPolicy)}
    options = [arg for arg in typing.get_args(hints.get("options")) if arg is not type(None)]
    for kind in options:
        names |= {field.name for field in dataclasses.fields(kind)}
    return names


#: What a public operation may take: a few parameters and an options object (its other
#: settings as the options' fields, by keyword), and a body a reader takes in at once.
MOST_PARAMETERS = 8
MOST_LINES = 60


def verb_size(verb) -> tuple[int, int]:
    """(parameters, lines of its body without the docstring) of a public verb; ``**fields``
    (an options object's, a policy's) is not counted."""
    function = inspect.unwrap(verb)
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    tree = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    return len(parameters), body[-1].end_lineno - body[0].lineno + 1


@pytest.mark.parametrize("name", VERBS)
def test_a_public_verb_takes_few_parameters_and_reads_at_once(name):
    parameters, lines = verb_size(getattr(cubepack, name))
    assert parameters <= MOST_PARAMETERS, (
        f"cubepack.{name} takes {parameters} parameters: give it an options object")
    assert lines <= MOST_LINES, f"cubepack.{name} runs {lines} lines: split its steps"


def test_the_verb_measure_counts_what_was_planted(tmp_path, monkeypatch):
    """Planted: a verb of nine parameters and a 61-line body is measured so."""
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    (tmp_path / "planted_verb.py").write_text(
        f'def planted(a, b, c, d, e, f, g, h, i, **fields):\n    """Doc."""\n{body}')
    monkeypatch.syspath_prepend(str(tmp_path))
    import planted_verb

    assert verb_size(planted_verb.planted) == (9, 61)
