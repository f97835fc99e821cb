"""The strict readers every untrusted document goes through: JSON, YAML and json_safe.

Each limit is refused with a ValueError naming it (``LimitError``), never a RecursionError,
whatever the depth, and without converting a huge number literal first.
"""

from __future__ import annotations

import datetime

import pytest

from cubepack._util.canonical import (
    MAX_INT,
    LimitError,
    json_safe,
    load_yaml_strict,
    loads_strict,
)

DEEP = 5000


@pytest.mark.parametrize("text", [
    "[" * DEEP + "]" * DEEP,
    '{"a": ' * DEEP + "1" + "}" * DEEP,
    '{"x": [' + "[" * 70 + "]" * 70 + "]}",
])
def test_json_nested_deeper_than_64_is_refused_before_parsing(text):
    with pytest.raises(LimitError, match="nesting deeper than 64 levels"):
        loads_strict(text)


def test_json_brackets_inside_strings_do_not_count_and_64_levels_pass():
    assert loads_strict('["' + "[" * 100 + '\\"{"]') == ["[" * 100 + '"{']
    assert loads_strict("[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize("literal", ["1" * 5000, "-" + "9" * 40, "0." + "1" * 5000,
                                     "1" * 40 + "e5"])
def test_long_number_literals_are_refused_before_conversion(literal):
    with pytest.raises(LimitError, match=f"has {len(literal)} characters; at most 32"):
        loads_strict('{"n": ' + literal + "}")


def test_integers_are_bounded_by_2_53_and_named_by_their_pointer():
    assert loads_strict(f'{{"n": {MAX_INT - 1}, "m": -{MAX_INT - 1}, "t": true}}')["n"] == \
        MAX_INT - 1
    with pytest.raises(LimitError, match=r"integer at /files/a~1b\.json/size \(9007199254740992\)"):
        loads_strict(f'{{"files": {{"a/b.json": {{"size": {MAX_INT}}}}}}}')
    with pytest.raises(LimitError, match=r"integer at / "):
        loads_strict(str(-MAX_INT))
    assert loads_strict("1e300") == 1e300  # floats are floats: only integers are bounded


@pytest.mark.parametrize("text, message", [
    ("a: " + "[" * DEEP + "]" * DEEP, "nesting deeper than 64 levels"),
    ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)), "nesting deeper than 64"),
    ("a: &x [1, 2]\nb: *x\n", r"YAML alias \(\*x\) at line 2"),
    ("a: &x [*x]\n", r"YAML alias \(\*x\)"),
    ("n: " + "1" * 5000, "has 5000 characters"),
    (f"n: {MAX_INT}", r"integer at line 1 \(9007199254740992\)"),
])
def test_yaml_limits(text, message):
    with pytest.raises(LimitError, match=message):
        load_yaml_strict(text)


def test_yaml_within_the_limits_loads_as_safe_load_does():
    assert load_yaml_strict("a: {b: [1, 2_0]}\nc: yes\n") == {"a": {"b": [1, 20]}, "c": True}
    with pytest.raises(ValueError, match="mapping values are not allowed"):
        load_yaml_strict("a: b: c")


def _deep(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def test_json_safe_refuses_depth_cycles_and_shared_blowups():
    with pytest.raises(LimitError, match="nesting deeper than 64 levels"):
        json_safe({"deep": _deep(DEEP)})
    cycle = []
    cycle.append(cycle)
    with pytest.raises(LimitError, match="nesting deeper than 64 levels"):
        json_safe(cycle)
    shared = ["leaf"]
    for _ in range(40):  # 2**40 values if copied naively
        shared = [shared, shared]
    with pytest.raises(LimitError, match="more than 1000000 values"):
        json_safe(shared)


def test_json_safe_never_reprs_a_deep_member_or_key():
    deep_tuple = ()
    for _ in range(DEEP):
        deep_tuple = (deep_tuple,)
    with pytest.raises(LimitError, match="nesting deeper than 64"):
        json_safe({"s": {deep_tuple}})
    with pytest.raises(LimitError, match="nesting deeper than 64"):
        json_safe({deep_tuple: 1})
    when = datetime.datetime(2026, 1, 2)
    assert json_safe({"t": when, (1, 2): {3, 1}, "o": object}) == {
        "t": "2026-01-02T00:00:00", "[1,2]": [1, 3], "o": repr(object)}
