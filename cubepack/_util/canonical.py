"""Canonical JSON: the one byte layout cubepack hashes and writes.

Sorted keys, two-space indentation, ASCII-only escapes, a final newline. Two equal values always
give the same bytes, so a re-pack of an unchanged cube is byte-identical and digests are stable
across Python versions.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def dumps(value: Any, *, compact: bool = False) -> str:
    """Serialise ``value`` canonically (compact: no whitespace, for digests)."""
    if compact:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


#: Deepest nesting accepted in a document cubepack reads: locks, headers and metadata are
#: shallow; thousands of levels only serve to crash a recursive reader later.
MAX_DEPTH = 64


def loads_strict(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` for untrusted documents: no NaN or Infinity (not JSON, and they would
    break digests later), no number that overflows to infinity (``1e999``), no nesting deeper
    than :data:`MAX_DEPTH`.

    Raises ValueError (or RecursionError) like ``json.loads``; callers wrap it in their error.
    """
    def reject(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    def finite(number: str) -> float:
        value = float(number)
        if math.isinf(value):
            raise ValueError(f"the number {number[:40]} overflows to infinity")
        return value

    value = json.loads(text, parse_constant=reject, parse_float=finite, **kwargs)
    _check_depth(value)
    return value


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


class DuplicateKey(ValueError):
    """A JSON object names the same key twice: readers disagree on which value wins."""


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses a repeated key (``json`` keeps the last silently)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(f"repeats the key {key!r}")
        result[key] = value
    return result


def digest(value: Any) -> str:
    """sha256 hex of the compact canonical JSON of ``value``."""
    return hashlib.sha256(dumps(value, compact=True).encode("ascii")).hexdigest()


def json_safe(value: Any, unwrap: Any = None) -> Any:
    """A JSON-serialisable copy of ``value``: datetimes become ISO strings, tuples and sets
    lists, unknown objects their ``repr``. ``unwrap`` may first replace a node (e.g. a
    stand-in object by its state)."""
    import datetime

    if unwrap is not None:
        value = unwrap(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, unwrap) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [json_safe(v, unwrap) for v in items]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
