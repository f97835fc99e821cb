"""Attacker-written regular expressions, matched under a bound: the one way cubepack runs a
pattern a cube's author wrote (a PEFT adapter's ``target_modules``, ``exclude_modules``,
``rank_pattern`` and ``alpha_pattern`` keys).

Python's ``re`` has no bound: ``(x+x+)+y`` against a long name backtracks for minutes, which
let a cube hang ``verify`` and outlive a pull's deadline. Two bounds, so that PEFT's own
``re`` (which matches the same patterns when an adapter is applied) is safe too:

- a shape bound, before any match (:func:`check_shape`): no repeat inside a repeat, no
  alternation inside a repeat (``?`` repeats nothing), at most :data:`MAX_UNBOUNDED` unbounded repeats in all
  (``(a+)+``, ``(a|a)*`` and ``.*.*.*.*x`` backtrack exponentially or polynomially), and at
  most :data:`MAX_PATTERN_CHARS` characters;
- a time bound on each of our matches: the ``regex`` package (a dependency of transformers,
  so always installed here) takes a ``timeout`` (:data:`MATCH_SECONDS`).

A pattern past either bound, or one the engine rejects, is a
:class:`~cubepack.errors.FormatError` naming where it sits. Patterns PEFT configs use
(``.*q_proj``, ``model.layers.\\d+.self_attn.(q|v)_proj``) pass and match in microseconds.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import FormatError

#: Seconds one match may take: thousands of times what a plain module pattern needs.
MATCH_SECONDS = 0.05
MAX_PATTERN_CHARS = 1000
#: Variable-length repeats (``*``, ``+``, ``{m,n}`` with m < n < ...) a pattern may hold in
#: all: each multiplies the ways a backtracking engine can split a name, bounded or not
#: (``.{0,40}`` sixteen times backtracks for hours in ``re``). Three keep the work cubic in
#: the length of a module name (an optional ``?`` only doubles it, and is not counted).
MAX_UNBOUNDED = 3


def check_shape(pattern: str, *, where: str) -> None:
    """Refuse a pattern whose shape lets a backtracking engine run without bound (see the
    module docstring). Cached by pattern: a config's patterns are checked once, however many
    names they are matched against."""
    problem = _shape_problem(pattern) if isinstance(pattern, str) else \
        f"must be a regular expression (a string), not {pattern!r}"
    if problem:
        raise FormatError(f"{where} {problem}.")


@functools.lru_cache(maxsize=1024)
def _shape_problem(pattern: str) -> str | None:
    """Why ``pattern``'s shape is refused, or None."""
    try:
        _walk_shape(pattern)
    except FormatError as exc:
        return str(exc)
    return None


def _walk_shape(pattern: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FormatError(f"a pattern of {len(pattern)} characters; at most "
                          f"{MAX_PATTERN_CHARS} are matched")
    try:
        from re import _parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser  # type: ignore[no-redef]
    try:
        tree = parser.parse(pattern)
    except Exception as exc:  # noqa: BLE001 - re.error, RecursionError, OverflowError...
        raise FormatError(f"{pattern[:80]!r}, not a regular expression: {exc}") from None
    unbounded = 0

    def walk(items: Any, inside_repeat: bool) -> None:
        nonlocal unbounded
        for op, arg in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = arg
                if inside_repeat:
                    raise FormatError(f"{pattern[:80]!r}, which repeats a repeat (as in "
                                      "(a+)+): it backtracks without bound; refused")
                if high > 1 and high != low:  # an optional part (?) splits a name 2 ways only
                    unbounded += 1
                walk(sub, inside_repeat or high > 1)  # and repeats nothing
            elif name == "BRANCH":
                if inside_repeat:
                    raise FormatError(f"{pattern[:80]!r}, which repeats an alternation (as "
                                      "in (a|a)*): it backtracks without bound; refused")
                for branch in arg[1]:
                    walk(branch, inside_repeat)
            elif name == "SUBPATTERN":
                walk(arg[-1], inside_repeat)
            elif name in ("ASSERT", "ASSERT_NOT"):
                walk(arg[1], inside_repeat)
            elif name == "GROUPREF_EXISTS":
                for branch in arg[1:]:
                    if branch is not None:
                        walk(branch, inside_repeat)
            elif name == "GROUPREF":
                raise FormatError(f"{pattern[:80]!r}, which uses a backreference; refused")

    walk(tree, False)
    if unbounded > MAX_UNBOUNDED:
        raise FormatError(f"{pattern[:80]!r}, which holds {unbounded} variable-length repeats; "
                          f"at most {MAX_UNBOUNDED} are matched (each multiplies the work)")


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    import regex

    # VERSION0: the ``re``-compatible dialect, so a pattern means what PEFT (``re``) reads.
    return regex.compile(pattern, flags=regex.VERSION0)


def _run(method: str, pattern: str, text: str, where: str) -> Any:
    check_shape(pattern, where=where)
    import regex

    try:
        compiled = _compiled(pattern)
    except (regex.error, ValueError, OverflowError) as exc:
        raise FormatError(f"{where} {pattern[:80]!r} is not a regular expression: {exc}") \
            from None
    try:
        return getattr(compiled, method)(text, timeout=MATCH_SECONDS)
    except TimeoutError:
        raise FormatError(f"{where} {pattern[:80]!r} did not match {text[:80]!r} within "
                          f"{MATCH_SECONDS} s (a pattern that backtracks without bound); "
                          "refused.") from None


def fullmatch(pattern: str, text: str, *, where: str) -> bool:
    """``re.fullmatch(pattern, text)`` under the bound."""
    return _run("fullmatch", pattern, text, where) is not None


def match(pattern: str, text: str, *, where: str) -> bool:
    """``re.match(pattern, text)`` under the bound."""
    return _run("match", pattern, text, where) is not None
