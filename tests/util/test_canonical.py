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

from envs import once

pytestmark = once

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


# --- the fast path: json's own integers where no literal can break a limit --------------------

def reference_loads_strict(text, **kwargs):
    """loads_strict as it was before its fast path: every integer through the hook, nesting
    counted token by token (the property below holds the fast reader to it)."""
    import json
    import math
    import re

    from cubepack._util.canonical import MAX_DEPTH, _check_integers, _short

    depth = 0
    for match in re.finditer(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', text, re.DOTALL):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise LimitError(f"nesting deeper than {MAX_DEPTH} levels")
        elif char in "]}":
            depth -= 1

    def reject(name):
        raise ValueError(f"{name} is not valid JSON")

    def finite(number):
        _short(number)
        value = float(number)
        if math.isinf(value):
            raise ValueError(f"the number {number[:40]} overflows to infinity")
        return value

    out_of_range = False

    def integer(number):
        nonlocal out_of_range
        _short(number)
        value = int(number)
        if not -MAX_INT < value < MAX_INT:
            out_of_range = True
        return value

    value = json.loads(text, parse_constant=reject, parse_float=finite, parse_int=integer,
                       **kwargs)
    if out_of_range:
        _check_integers(value)
    return value


def outcome(reader, text, **kwargs):
    try:
        return ("value", reader(text, **kwargs))
    except ValueError as exc:  # JSONDecodeError and LimitError included
        return (type(exc).__name__, str(exc))


PIECES = ['"', '\\"', "\\\\", "[", "]", "{", "}", ",", ":", " ", "0", "7", "-", ".", "e",
          "1" * 15, "9" * 16, "12345678901234567", "1e999", "NaN", "true", '"a"', '"[{"',
          '"12345678901234567"', "\ufeff", "é",
          # floats near the bounds the fast reader's float check relies on
          "1e308", "1.7976931348623157e308", "2e308", "-1e309", "1e-400", "1E+99", "0.5",
          "0." + "1" * 30, "0." + "1" * 31, "-0." + "1" * 30, "1.5e" + "0" * 3 + "9",
          "9" * 15 + "." + "9" * 16 + "e99", '"1e999"']


@pytest.mark.parametrize("seed", range(600))
def test_the_fast_reader_accepts_and_refuses_exactly_as_the_hooked_one(seed):
    import json
    import random

    from cubepack._util.canonical import unique_pairs

    chooser = random.Random(seed)
    if seed % 3 == 0:  # a valid document with numbers near every bound
        numbers = [0, -1, 10**15 - 1, -(10**15 - 1), 10**15, MAX_INT - 1, -(MAX_INT - 1), 1.5,
                   1e300, 0.1, -3.5e-07, 0.12345678901234568, 1.7976931348623157e308, 5e-324]
        if chooser.random() < 0.3:
            numbers.append(chooser.choice([MAX_INT, -MAX_INT, 2**70]))
        doc = {"k": [chooser.choice(numbers) for _ in range(4)],
               "s": "[{" * chooser.randint(0, 70), "n": [[chooser.choice(numbers)]] * 2}
        for _ in range(chooser.randint(0, 70)):
            doc = [doc]
        text = json.dumps(doc)
    else:  # arbitrary text from JSON's pieces
        text = "".join(chooser.choice(PIECES) for _ in range(chooser.randint(1, 40)))
        if seed % 3 == 1:
            text = "[" * chooser.randint(60, 70) + text + "]" * chooser.randint(60, 70)
    assert outcome(loads_strict, text) == outcome(reference_loads_strict, text)
    assert outcome(loads_strict, text, object_pairs_hook=unique_pairs) == \
        outcome(reference_loads_strict, text, object_pairs_hook=unique_pairs)


def test_a_repeated_key_is_named_by_its_first_repetition():
    from cubepack._util.canonical import DuplicateKey, unique_pairs

    with pytest.raises(DuplicateKey, match="repeats the key 'b'"):
        loads_strict('{"a": 1, "b": 2, "a": 3, "b": 4, "b": 5}'.replace('"a": 3, ', ""),
                     object_pairs_hook=unique_pairs)
    assert loads_strict('{"a": {"a": 1}, "b": [{"a": 2}]}', object_pairs_hook=unique_pairs) == \
        {"a": {"a": 1}, "b": [{"a": 2}]}
