"""Ids at the endpoint's edge: every id a request names, parsed into a typed value before use.

A request names repos, revisions, commits, pull requests and discussions, comments and blobs,
in its path and in its body. Each becomes a file name or a look-up key of the store, so each is
parsed here, by one function per kind of id, before any handler or the store sees it:

* a repo (``kind``, ``namespace``, ``name``) -> :class:`RepoRef`: an id huggingface_hub's own
  :func:`~huggingface_hub.utils.validate_repo_id` takes, ASCII, with a namespace of at most 96
  characters, and that its own ``REPO_ID_REGEX`` matches in full (so never ``..``, ``a-``,
  ``x.git`` or ``cube\\n``; 0.36's validator reads ``\\w`` as Unicode, bounds no namespace
  and lets a final newline through its ``$``, 2.x's and the Hub's do none of it): what either
  version refuses. The client's rule is called, not copied: a copy drifted and created ids
  the client refuses;
* a path in a repo -> :func:`repo_path`: the Hub's rule (a backslash is part of a name; no
  ``.``/``..``/empty segment, no leading ``..\\``, no ``.git`` or ``.cache`` folder, which the
  client refuses to write);
* a revision -> :class:`Revision`: a 40-hex commit id, ``refs/pr/N``, or a branch or tag name
  that git accepts (optionally qualified: ``refs/heads/x`` names branch ``x`` alone,
  ``refs/tags/x`` tag ``x`` alone). The store resolves it to a commit id by look-ups; its text
  is never joined into a path;
* a commit id (``parentCommit``) -> 40 lower-case hex (:func:`commit_id`);
* a discussion or pull request number -> int from 1, no sign, exponent or leading zero;
* a comment (event) id -> 24 lower-case hex; a blob oid -> 64 lower-case hex (sha256).

A malformed id the client may be probing for (a repo, a revision, a ref to delete) answers 404
with the Hub's error code, as the Hub does, so ``repo_exists`` and ``revision_exists`` still
return False; any other malformed id is a 400 saying what the id must look like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from huggingface_hub.utils import HFValidationError, validate_repo_id
from huggingface_hub.utils import _validators as client_validators

from .._util.paths import MAX_PATH_LENGTH
from .._util.revision import is_commit, new_ref_problem, ref_name_problem
from ._errors import StoreError, bad_request, shown

REPO_TYPES = {"models": "model", "datasets": "dataset"}
#: Folders the client refuses to write files under (huggingface_hub's FORBIDDEN_FOLDERS).
FORBIDDEN_FOLDERS = (".git", ".cache")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHORT_SHA = re.compile(r"[0-9a-f]{7,39}")
_EVENT = re.compile(r"[0-9a-f]{24}")
#: A discussion or pull request number: from 1, at most 9 digits, no leading zero (so ``01``
#: and ``1`` are not two spellings of one number).
_NUMBER = re.compile(r"[1-9][0-9]{0,8}")
#: A pull request's ref, as the Hub names them.
PR_REF = re.compile(r"refs/pr/([1-9][0-9]{0,8})")


@dataclass(frozen=True)
class RepoRef:
    """A repo: ``kind`` ("models" or "datasets"), ``namespace`` and ``name``, checked when made
    (the store builds ``repos/<kind>/<namespace>/<name>`` from them)."""

    kind: str
    namespace: str
    name: str

    def __post_init__(self) -> None:
        if self.kind not in REPO_TYPES or not is_repo_id(self.namespace, self.name):
            raise StoreError(404, f"Repository {shown(self.namespace)}/{shown(self.name)} not "
                                  "found.", "RepoNotFound")

    @property
    def repo_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def repo_type(self) -> str:
        return REPO_TYPES[self.kind]


def repo_id_problem(repo_id: object) -> str | None:
    """Why the client refuses ``repo_id`` (``name`` or ``namespace/name``), in its own words,
    or why it is no id here (not ASCII); None when it is one."""
    if not isinstance(repo_id, str) or not repo_id.isascii():
        return "a repo id is ASCII: letters, digits, '-', '_' and '.'"
    if len(repo_id.split("/")[0]) > 96:  # 2.x and the Hub bound a namespace too; 0.36 did not
        return "a namespace is at most 96 characters"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as refusal:  # its words, the id quoted as ours are (escaped, cut)
        return str(refusal).replace(f"'{repo_id}'", shown(repo_id)).replace(repo_id, "the id")
    # The client's own pattern, applied in full as 2.x applies it: 0.36 applies it with .match
    # and its closing `$` matches before a final newline, so 0.36 takes "ns/cube\n".
    pattern = getattr(client_validators, "REPO_ID_REGEX", None)
    if pattern is not None and not pattern.fullmatch(repo_id):
        return ("Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start "
                "or end with '-' or '.' and the maximum length is 96")
    return None


def is_repo_id(namespace: object, name: object) -> bool:
    """True for a repo id ``namespace/name`` the client takes."""
    return isinstance(namespace, str) and isinstance(name, str) and "/" not in namespace \
        and "/" not in name and repo_id_problem(f"{namespace}/{name}") is None


def is_sha256(value: object) -> bool:
    """True for a blob id: a sha256 as 64 lower-case hex digits."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def repo_ref(kind: str, namespace: str, name: str) -> RepoRef:
    """The repo a request names, to look up: 404 RepoNotFound when no repo can have that id."""
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise StoreError(404, f"Repository {shown(namespace)}/{shown(name)} not found.",
                         "RepoNotFound")
    return RepoRef(kind, namespace, name)


def new_repo_ref(kind: str, namespace: str, name: str, what: str = "The repo id") -> RepoRef:
    """A repo to create or move to: 400 saying ``what`` is wrong when the client takes no repo
    of that id (its own message)."""
    for part in (namespace, name):
        repo_name(part, f"{what} {shown(f'{namespace}/{name}')}: each part")
    if problem := repo_id_problem(f"{namespace}/{name}"):
        raise bad_request(f"{what} {shown(f'{namespace}/{name}')} is refused: {problem}")
    return RepoRef(kind, namespace, name)


#: The refs a qualified name names: ``refs/heads/x`` is branch ``x`` only, ``refs/tags/x`` tag
#: ``x`` only, as in git and on the Hub (a bare name is a branch, else a tag).
QUALIFIERS = {"refs/heads/": "branches", "refs/tags/": "tags"}


@dataclass(frozen=True)
class Revision:
    """A revision as a request names it, parsed: exactly one of ``commit`` (40 hex), ``pull``
    (the N of ``refs/pr/N``) or a ref name (``text``, a branch or tag, optionally qualified by
    ``refs/heads/`` or ``refs/tags/``, which then names that kind of ref only: ``group``) is
    what the store looks up. Build it with :func:`parse_revision`."""

    text: str
    commit: str | None = None
    pull: int | None = None
    group: str | None = None

    def __str__(self) -> str:
        return self.text

    @property
    def lookups(self) -> tuple[tuple[str, str], ...]:
        """The (refs group, name) pairs this revision may be, in the order the Hub tries them:
        a bare name is a branch, else a tag; a qualified one is the ref of its kind alone."""
        if self.group is not None:
            return ((self.group, self.name),)
        return (("branches", self.text), ("tags", self.text))

    @property
    def name(self) -> str:
        """The ref's name without its qualifier (``refs/tags/v1`` -> ``v1``)."""
        for prefix, group in QUALIFIERS.items():
            if self.group == group:
                return self.text.removeprefix(prefix)
        return self.text

    @property
    def branch(self) -> str | None:
        """The branch a write to this revision moves (``refs/heads/`` dropped); None when the
        revision names no branch (a tag, qualified: a write never moves one)."""
        return self.name if self.group in (None, "branches") else None

    @property
    def prefix(self) -> str | None:
        """7 to 39 lower-case hex digits: the start of a commit id, as the Hub accepts them."""
        return self.text if _SHORT_SHA.fullmatch(self.text) else None


def parse_revision(value: object) -> Revision:
    """``value`` (a revision from a URL, a body or the store's own callers) as a
    :class:`Revision`; 404 RevisionNotFound (the Hub's "Invalid rev id") when nothing could be
    named so. An already parsed revision is returned as it is."""
    if isinstance(value, Revision):
        return value
    if is_commit(value):
        return Revision(value, commit=value)
    if isinstance(value, str) and (pull := PR_REF.fullmatch(value)):
        return Revision(value, pull=int(pull.group(1)))
    if isinstance(value, str):
        bare, group = value, None
        for prefix, kind in QUALIFIERS.items():
            if value.startswith(prefix):
                bare, group = value[len(prefix):], kind
                break
        problem = ref_name_problem(bare)
        if problem is None and not bare.startswith("refs/"):
            return Revision(value, group=group)
        problem = problem or ("refs/ names a branch (refs/heads/), tag (refs/tags/) or pull "
                              "request (refs/pr/N)")
    else:
        problem = f"a revision is a string, not {type(value).__name__}"
    raise StoreError(404, f"Invalid rev id: {shown(value)} ({problem}).", "RevisionNotFound")


def commit_id(value: object, what: str = "The commit id") -> str:
    """A full commit id (40 lower-case hex), or a 400 saying ``what`` must be one."""
    if not is_commit(value):
        raise bad_request(f"{what} must be a full commit id (40 lower-case hex digits), not "
                          f"{shown(value)}.")
    return value  # type: ignore[return-value]


def blob_oid(value: object, what: str = "The oid") -> str:
    """A blob's sha256 (64 lower-case hex), or a 400 saying ``what`` must be one."""
    if not is_sha256(value):
        raise bad_request(f"{what} must be a sha256 (64 lower-case hex digits), not "
                          f"{shown(value)}.")
    return value  # type: ignore[return-value]


def repo_name(value: object, what: str = "The repo name") -> str:
    """A namespace or repo name as a body gives it: one non-empty name without ``/`` (the id it
    makes is checked whole, by :func:`new_repo_ref`), or a 400 saying ``what`` must be one."""
    if not isinstance(value, str) or not value or "/" in value:
        raise bad_request(f"{what} must be one name, without '/', not {shown(value)}.")
    return value


def repo_path(value: object) -> str:
    """A path in a repo, as the Hub stores it, or a 422 saying what is wrong. A path is only
    ever a key of a commit's tree here, never a file name; the rule is the Hub's: a backslash is
    part of a name (``folder/..\\..\\file`` is stored), but a path is not empty, at most
    1024 characters, without control characters, relative, without an empty, ``.`` or ``..``
    segment, not starting with ``..\\`` or ``\\`` or a drive (``C:``), and not under a ``.git``
    or ``.cache`` folder (the client refuses to write there)."""
    problem = None
    if not isinstance(value, str) or not value:
        problem = "a path is a non-empty string"
    elif not _encodable(value):
        problem = "it is not valid Unicode (it holds a lone surrogate)"
    elif len(value) > MAX_PATH_LENGTH:
        problem = f"it is longer than {MAX_PATH_LENGTH} characters"
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        problem = "it holds a control character"
    elif any(part in ("", ".", "..") for part in value.split("/")):
        problem = "it has an empty, '.' or '..' segment (or starts or ends with '/')"
    elif value.split("\\")[0] in ("", "..") or re.match(r"[A-Za-z]:", value):
        problem = "read on Windows it starts outside the repo ('..\\', '\\' or a drive)"
    elif any(part in FORBIDDEN_FOLDERS for part in value.split("/")):
        problem = "the client writes nothing under a '.git' or '.cache' folder"
    if problem is not None:
        raise StoreError(422, f"Invalid path {shown(value)}: {problem}.")
    return value  # type: ignore[return-value]


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def discussion_number(value: str) -> int:
    """A discussion or pull request number from a URL: 400 unless it is 1-999999999 written
    plainly (``-1``, ``1e3``, ``01``, ``0`` and longer numbers are refused, not guessed at)."""
    if not _NUMBER.fullmatch(value):
        raise bad_request(f"Invalid discussion number {shown(value)}: a number from 1, in plain "
                          "digits without a leading zero.")
    return int(value)


def event_id(value: str) -> str:
    """A comment's id from a URL: 24 lower-case hex digits, as the Hub's, else 400."""
    if not _EVENT.fullmatch(value):
        raise bad_request(f"Invalid comment id {shown(value)}: 24 lower-case hex digits.")
    return value


def new_ref_name(value: object, kind: str = "branch") -> str:
    """The name of a branch or tag to create: git's rules and no ``refs/`` prefix, else 400."""
    if problem := new_ref_problem(value):
        raise bad_request(f"Invalid {kind} name {shown(value)}: {problem}.")
    return value  # type: ignore[return-value]


def ref_name(value: str) -> str:
    """The name of an existing branch or tag (to delete): 404 when no ref can be named so."""
    if problem := new_ref_problem(value):
        raise StoreError(404, f"Invalid rev id: {shown(value)} ({problem}).", "RevisionNotFound")
    return value
