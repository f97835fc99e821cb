"""Revisions: what a 40-hex commit looks like, and which ref names are safe to use.

One definition for every module that pins, resolves or reads a revision. A commit is matched in
full (``fullmatch``, so ``"<sha>\\n"`` is not a commit). The Hub and git write commit ids in
lower case; an upper-case 40-hex revision looks like a commit but is not one, so it is refused
rather than guessed at.
"""

from __future__ import annotations

import re

from ..errors import UsageError

_COMMIT = re.compile(r"[0-9a-f]{40}")
_HEX40_ANY_CASE = re.compile(r"[0-9a-fA-F]{40}")
#: Characters git forbids in ref names, plus the path separators that would let a name leave
#: ``refs/`` when it is used as a file name in the HF cache.
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|//|@\{")


def is_commit(revision: object) -> bool:
    """True when ``revision`` is exactly 40 lower-case hex digits."""
    return isinstance(revision, str) and _COMMIT.fullmatch(revision) is not None


def looks_like_commit(revision: object) -> bool:
    """True for 40 hex digits in any case (a revision the user meant as a commit)."""
    return isinstance(revision, str) and _HEX40_ANY_CASE.fullmatch(revision) is not None


def check_ref_name(name: str) -> str:
    """Return ``name`` if it is a branch or tag name git would accept; else raise UsageError.

    Used before a name touches the file system (``<cache>/refs/<name>``), so ``../../x`` or an
    absolute path never reaches ``open``.
    """
    if (not name or name.startswith(("/", ".", "-")) or name.endswith(("/", ".", ".lock"))
            or _REF_FORBIDDEN.search(name) or any(part.startswith(".") for part in name.split("/"))):
        raise UsageError(f"{name!r} is not a valid branch or tag name.")
    return name
