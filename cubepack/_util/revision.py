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


def check_ref_name(name: str, *, what: str = "revision", new: bool = False) -> str:
    """Return ``name`` if it is a branch or tag name git (``git check-ref-format``) and the Hub
    accept; else raise UsageError saying which rule it breaks.

    Used before a name touches the file system (``<cache>/refs/<name>``) or the endpoint, so
    ``../../x`` never reaches ``open`` and a push never commits before its tag is refused.
    ``new``: the name of a ref to create (a tag), which cannot start with ``refs/``.
    """
    reason = (new_ref_problem if new else ref_name_problem)(name)
    if reason:
        raise UsageError(f"{what} {name!r} is not a valid branch or tag name: {reason}.")
    return name


def ref_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid git ref name (git check-ref-format's rules), or None."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if any("\ud800" <= ch <= "\udfff" for ch in name):
        return "it is not valid UTF-8 (it holds a byte your terminal's encoding could not decode)"
    if looks_like_commit(name):
        return ("it is 40 hex digits, which reads as a commit id: a pull by that name resolves "
                "the commit, never this ref")
    if name == "HEAD" or name == "@":
        return f"{name} is reserved"
    if name.startswith("-"):
        return "it starts with '-' (it would read as an option)"
    if name.startswith("/") or name.endswith("/") or "//" in name:
        return "it has an empty path component (a leading, trailing or double '/')"
    if match := _REF_FORBIDDEN.search(name):
        return f"it contains {match.group(0)!r} (no space, control character, ~^:?*[\\, '..' or '@{{')"
    for part in name.split("/"):
        if part.startswith("."):
            return f"the component {part!r} starts with '.'"
        if part.endswith(".lock"):
            return f"the component {part!r} ends with '.lock'"
    if name.endswith("."):
        return "it ends with '.'"
    if name.startswith("refs/pr/") and not re.fullmatch(r"refs/pr/[1-9][0-9]*", name):
        return "a pull request ref is refs/pr/N, N a number from 1 (no leading zero)"
    return None


def new_ref_problem(name: object) -> str | None:
    """Why ``name`` cannot name a new branch or tag, or None: git's rules, and no ``refs/``
    prefix (the Hub names ``refs/heads/``, ``refs/tags/`` and ``refs/pr/`` itself)."""
    if isinstance(name, str) and name.startswith("refs/"):
        return "it starts with 'refs/' (give the bare name: refs/heads/ or refs/tags/ is implied)"
    return ref_name_problem(name)
