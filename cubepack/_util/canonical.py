"""Canonical JSON: the one byte layout cubepack hashes and writes.

Sorted keys, two-space indentation, ASCII-only escapes, a final newline. Two equal values always
give the same bytes, so a re-pack of an unchanged cube is byte-identical and digests are stable
across Python versions.

And the strict readers for documents someone else wrote (everything in a cube): JSON
(:func:`loads_strict`), YAML (:func:`load_yaml_strict`) and copies of unpickled values
(:func:`json_safe`) share one set of limits (nesting, number size), each enforced without
recursing deeper than the limit, so a hostile document is a ValueError, never a RecursionError.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import sys
from collections.abc import Iterator
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
#: Integers must lie strictly inside +-2**53, the range a double holds exactly (RFC 8259's
#: interoperable range): every reader, JavaScript's included, then sees the same value, and
#: no field can smuggle a 5000-digit number past a check that only compares it.
MAX_INT = 2**53
#: Longest number literal converted: a float's repr is at most 24 characters, and an integer
#: inside MAX_INT has at most 16 digits; ``int()`` of a longer literal only costs time (it is
#: quadratic in the digits, and refused by Python beyond 4300).
MAX_NUMBER_CHARS = 32

#: A JSON string, removed whole before nesting and numbers are measured (brackets and digits
#: inside one are text). Possessive where Python has it (3.11+): the same matches (what follows
#: a run can never extend it), found without keeping backtracking state.
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"' if sys.version_info >= (3, 11)
                     else r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BYTES_STRING = re.compile(_STRING.pattern.encode(), re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_ONLY_BRACKETS = str.maketrans({chr(code): None for code in range(128) if chr(code) not in "[]{}"})
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
#: Outside strings, digits as "0" and other ASCII as " ": a run of 16 zeros is a run of 16
#: digits, and only such a literal can reach 2**53 (16 digits) or the length limit; a document
#: without one takes the C parser's own integers.
_DIGITS_AS_ZEROS = str.maketrans({chr(code): "0" if chr(code) in "0123456789" else " "
                                  for code in range(128)})
#: The same for every character a number literal holds: a run of N zeros bounds every literal
#: (float or integer) to N characters.
_NUMBER_AS_ZEROS = str.maketrans({chr(code): "0" if chr(code) in "0123456789.eE+-" else " "
                                  for code in range(128)})
#: An exponent of three digits or more: only such a literal (of at most MAX_NUMBER_CHARS
#: characters, so below 10**(32 + 99) otherwise) can overflow to infinity.
_LARGE_EXPONENT = re.compile(r"[eE][+-]?[0-9]{3}")


def count_values(text: str | bytes) -> int:
    """At least as many as the JSON values in ``text`` (its commas and containers outside
    strings, and one), counted without parsing it: a reader bounds what a document of tiny
    values (``[{},{},...]``, about 26 bytes of Python a byte) would build before building it.
    Bytes are scanned as they are (the parse refuses those that are not UTF-8 after)."""
    if isinstance(text, str):
        structure = _STRING.sub("", text)
        return structure.count(",") + structure.count("[") + structure.count("{") + 1
    found = _BYTES_STRING.sub(b"", text)  # bytes as they are: no decoded copy
    return found.count(b",") + found.count(b"[") + found.count(b"{") + 1


def loads_strict(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` for untrusted documents: no NaN or Infinity (not JSON, and they would
    break digests later), no number that overflows to infinity (``1e999``), no number literal
    longer than :data:`MAX_NUMBER_CHARS` (refused before it is converted), no integer outside
    +-:data:`MAX_INT` (named by its JSON pointer), no nesting deeper than :data:`MAX_DEPTH`
    (measured before parsing, so no recursive reader ever sees it).

    Raises ValueError (UnicodeDecodeError for bytes that are not UTF-8) naming the limit;
    callers wrap it in their error, naming the file.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    structure = _STRING.sub("", text)
    _check_depth(structure)
    if "0" * 16 not in structure.translate(_DIGITS_AS_ZEROS):
        # Every integer literal has at most 15 digits: inside +-MAX_INT and shorter than
        # MAX_NUMBER_CHARS, so json's own (C) conversion accepts exactly what the hook would.
        # Likewise floats, when no literal is longer than MAX_NUMBER_CHARS and none has a
        # three-digit exponent: none can overflow, so float() is exactly the hook (a text
        # memory's vectors are parsed at C speed, not a Python call per number).
        floats = "0" * (MAX_NUMBER_CHARS + 1) not in structure.translate(_NUMBER_AS_ZEROS) \
            and _LARGE_EXPONENT.search(structure) is None
        decoder = _decoder(kwargs, floats)
        if decoder is not None and not text.startswith("\ufeff"):  # json.loads refuses a BOM
            return decoder.decode(text)
        return json.loads(text, parse_constant=_reject, parse_float=float if floats else _finite,
                          **kwargs)
    out_of_range = False

    def integer(number: str) -> int:
        nonlocal out_of_range
        _short(number)
        value = int(number)
        if not -MAX_INT < value < MAX_INT:
            out_of_range = True
        return value

    value = json.loads(text, parse_constant=_reject, parse_float=_finite, parse_int=integer,
                       **kwargs)
    if out_of_range:  # walk the document only to name the field (the walk costs a parse)
        _check_integers(value)
    return value


def _reject(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")  # NaN, Infinity


def _finite(number: str) -> float:
    _short(number)
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"the number {number[:40]} overflows to infinity")
    return value


#: Decoders with the strict hooks, by object_pairs_hook and whether floats need the hook
#: (building one costs as much as a small document's parse).
_DECODERS: dict[Any, json.JSONDecoder] = {}


def _decoder(kwargs: dict[str, Any], floats: bool = False) -> json.JSONDecoder | None:
    if set(kwargs) - {"object_pairs_hook"}:
        return None
    hook = kwargs.get("object_pairs_hook")
    decoder = _DECODERS.get((hook, floats))
    if decoder is None and len(_DECODERS) < 16:
        decoder = _DECODERS[(hook, floats)] = json.JSONDecoder(
            parse_constant=_reject, parse_float=float if floats else _finite,
            object_pairs_hook=hook)
    return decoder


class LimitError(ValueError):
    """A document goes beyond a limit cubepack sets on untrusted input (nesting, number size,
    YAML aliases): refused whatever else it holds, unlike a plain syntax error."""


def _short(number: str) -> None:
    if len(number) > MAX_NUMBER_CHARS:
        raise LimitError(f"the number literal {number[:20]}... has {len(number)} characters; "
                         f"at most {MAX_NUMBER_CHARS} are read")


def check_nesting(text: str) -> None:
    """Refuse JSON text nested deeper than :data:`MAX_DEPTH`, without parsing it (Python's
    parser recurses, so a 5000-deep document would raise RecursionError inside it)."""
    _check_depth(_STRING.sub("", text))


def _check_depth(structure: str) -> None:
    """The nesting check on JSON text whose strings were removed: the deepest running count
    of opening less closing brackets (measured in C, bracket by bracket)."""
    brackets = structure.translate(_ONLY_BRACKETS)
    if not brackets.isascii():  # text outside strings that is not ASCII (not JSON either)
        brackets = _NOT_BRACKET.sub("", structure)
    if len(brackets) > MAX_DEPTH and \
            max(itertools.accumulate(map(_STEP.__getitem__, brackets))) > MAX_DEPTH:
        raise LimitError(f"nesting deeper than {MAX_DEPTH} levels")


def walk_containers(value: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every object and array of a decoded JSON document, as (path of keys and indices, node),
    parents before children, in document order, without recursion: the one walker for
    documents someone else wrote. A callee inspects each node's own members.

    Raises:
        LimitError: a container nested deeper than :data:`MAX_DEPTH` (a document built in
            memory, or one holding itself, rather than one :func:`loads_strict` read).
    """
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if len(path) >= MAX_DEPTH:
            error = LimitError(f"nesting deeper than {MAX_DEPTH} levels")
            error.path = path  # where the walk stopped, for the caller's message
            raise error
        yield path, node
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        stack.extend((path + (key,), child) for key, child in reversed(children)
                     if isinstance(child, (dict, list)))


def _check_integers(value: Any) -> None:
    """Refuse a decoded JSON document holding an integer outside +-:data:`MAX_INT`, naming its
    field (bools are not integers here). Its depth was bounded before parsing."""
    if type(value) is int:
        _check_int(value, "/")
    for path, node in walk_containers(value):
        for key, child in (node.items() if isinstance(node, dict) else enumerate(node)):
            if type(child) is int:
                _check_int(child, pointer(path + (key,)))


def _check_int(value: int, where: str) -> None:
    if not -MAX_INT < value < MAX_INT:
        raise LimitError(f"the integer at {where} ({str(value)[:24]}) lies outside +-2**53")


def pointer(path: tuple[Any, ...]) -> str:
    """A JSON pointer (RFC 6901) naming a field: ``/files/config.json/size``."""
    return "".join("/" + str(key).replace("~", "~0").replace("/", "~1") for key in path) or "/"


def loads_pairs(data: bytes) -> Any:
    """The JSON ``data`` (UTF-8) with each object kept as the tuple of its ``(key, value)``
    pairs, in order, at the C parser's speed (no call a value): for a reader that uses one
    part of a large document it already trusts by digest and checks that part as strictly as
    :func:`loads_strict` (repeated keys, number bounds: the caller's). NaN and Infinity are
    refused; nesting past the interpreter's bound raises RecursionError.

    Raises:
        ValueError: not JSON (UnicodeDecodeError: not UTF-8).
    """
    return json.loads(data.decode("utf-8"), object_pairs_hook=tuple, parse_constant=_reject)


class DuplicateKey(ValueError):
    """A JSON object names the same key twice: readers disagree on which value wins."""


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses a repeated key (``json`` keeps the last silently)."""
    result = dict(pairs)
    if len(result) != len(pairs):  # name the first key seen twice
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"repeats the key {key!r}")
            seen.add(key)
    return result


def digest(value: Any) -> str:
    """sha256 hex of the compact canonical JSON of ``value``."""
    return hashlib.sha256(dumps(value, compact=True).encode("ascii")).hexdigest()


def digest_of_file_hashes(entries: list[tuple[str, str]]) -> str:
    """``sha256:<hex>`` over sorted (relative name, file sha256) pairs: the one definition of a
    set of files' digest (a model's weights, an adapter's files), for every caller."""
    return "sha256:" + digest(sorted(entries))


#: Most values :func:`json_safe` copies: a pickle can put one list at every level of a
#: 64-deep structure twice, which copied naively is 2**64 values.
MAX_VALUES = 1_000_000


def json_safe(value: Any, unwrap: Any = None) -> Any:
    """A JSON-serialisable copy of ``value``: datetimes become ISO strings, tuples and sets
    lists, unknown objects their ``repr``. ``unwrap`` may first replace a node (e.g. a
    stand-in object by its state).

    Raises :class:`LimitError` for nesting deeper than :data:`MAX_DEPTH` (so no recursion goes
    deeper, cycles included) or more than :data:`MAX_VALUES` values (shared sub-structures).
    """
    import datetime

    budget = [MAX_VALUES]

    def copy(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise LimitError(f"more than {MAX_VALUES} values")
        if unwrap is not None:
            node = unwrap(node)
        if isinstance(node, (dict, list, tuple, set, frozenset)) and depth >= MAX_DEPTH:
            raise LimitError(f"nesting deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            return {key_text(k, depth): copy(v, depth + 1) for k, v in node.items()}
        if isinstance(node, (set, frozenset)):  # members copied first: repr of one may recurse
            return sorted((copy(v, depth + 1) for v in node), key=lambda v: dumps(v, compact=True))
        if isinstance(node, (list, tuple)):
            return [copy(v, depth + 1) for v in node]
        if isinstance(node, (datetime.datetime, datetime.date)):
            return node.isoformat()
        if node is None or isinstance(node, (str, int, float, bool)):
            return node
        return repr(node)

    def key_text(key: Any, depth: int) -> str:
        if key is None or isinstance(key, (str, int, float, bool)):
            return str(key)
        return dumps(copy(key, depth + 1), compact=True)  # str() of a tuple key may recurse

    return copy(value, 0)


def load_yaml_strict(text: str) -> Any:
    """``yaml.safe_load`` for untrusted documents: nesting at most :data:`MAX_DEPTH` (counted
    while composing, before PyYAML's recursive composer and constructor run out of stack), no
    aliases (an alias can make a document recursive, or exponentially large, to whoever walks
    it), integers as :func:`loads_strict` reads them.

    Raises :class:`LimitError` for a limit, ValueError (the first line of PyYAML's message)
    for a syntax error.
    """
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass
        return yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


_LOADER: list[Any] = []


def _strict_loader() -> Any:
    """The loader class, built once, on first use (so importing this module needs no YAML)."""
    if _LOADER:
        return _LOADER[0]
    import yaml

    class StrictLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise LimitError(f"a YAML alias (*{event.anchor}) at line "
                                 f"{event.start_mark.line + 1}; aliases are not accepted")
            collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
            if collection:
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise LimitError(f"nesting deeper than {MAX_DEPTH} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1 if collection else 0

        def construct_yaml_int(self, node: Any) -> int:
            _short(str(node.value).replace("_", ""))
            value = super().construct_yaml_int(node)
            _check_int(value, f"line {node.start_mark.line + 1}")
            return value

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    _LOADER.append(StrictLoader)
    return StrictLoader
