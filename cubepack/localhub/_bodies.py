"""Request bodies at the endpoint's edge: each parsed into a typed value, shape and types checked.

Every route that reads a body names one parser of this module in the routing table
(:data:`cubepack.localhub._server.ROUTES`); the dispatcher runs it before the handler, so a
handler only ever sees typed values. A parser takes the raw bytes and the Content-Type and
returns a value, or raises a 400 whose one sentence names the field that is wrong
(``Field 'files[0].size' must be an integer ...``): never a KeyError deep in a handler, never a
500.

Unknown fields are ignored, as the Hub ignores them, but every field the huggingface_hub
clients (0.36 and 2.x) send is type-checked, even one this endpoint does not use: a body is
either well formed or refused, never half read.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

from .._util import canonical
from ._errors import StoreError, bad_request, shown
from ._ids import (
    Revision,
    blob_oid,
    commit_id,
    new_ref_name,
    new_repo_ref,
    parse_revision,
    repo_name,
    repo_path,
)
from ._store import AddFile, AddLfsFile, DeleteFile, DeleteFolder, Operation, RepoRef

#: Largest size a body may give a file: 2**53 - 1, the largest integer every JSON reader holds
#: exactly; anything larger is a typo or an attack, not a file.
MAX_SIZE = 2**53 - 1
#: Most fields a form-encoded body may have (paths-info asks for up to a few thousand paths).
MAX_FORM_FIELDS = 100_000
#: Most values a JSON body may hold, counted before it is parsed (its commas, brackets and
#: braces, in strings too: a bound from above): a parsed value costs ~60 bytes however short
#: its text, so 64 MiB of ``"0000001",`` once held 6.7 million strings, ~600 MB, where the
#: bodies' budget counted 64 MiB. A JSON paths-info names at most MAX_FORM_FIELDS paths, as
#: its form does.
MAX_JSON_VALUES = 2 * MAX_FORM_FIELDS
#: The repo types a body may name, as the URL kinds; a missing type is a model, as on the Hub.
KINDS = {"dataset": "datasets", "model": "models", None: "models"}

T = TypeVar("T")


def _type_name(value: object) -> str:
    """The JSON name of ``value``'s type, as a message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def load_json(raw: bytes, what: str = "The body") -> Any:
    """``raw`` parsed as JSON (an empty body is ``{}``: the client sends none when every field
    is optional), strictly: UTF-8, no NaN, no number beyond +-2**53, no deep nesting."""
    if not raw.strip():
        return {}
    if raw.count(b",") + raw.count(b"[") + raw.count(b"{") > MAX_JSON_VALUES:
        raise bad_request(f"{what} holds more than {MAX_JSON_VALUES} JSON values (counted "
                          "by its commas, brackets and braces), more than this endpoint "
                          "parses.")
    try:
        return canonical.loads_strict(raw)
    except UnicodeDecodeError:
        raise bad_request(f"{what} is not UTF-8 text.") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno}).") from None
    except ValueError as exc:  # the strict reader's limits: depth, NaN, long numbers
        raise bad_request(f"{what} is not JSON this endpoint reads ({exc}).") from None


class Fields:
    """A JSON object of a request, read one typed field at a time; every refusal names the field
    (``prefix`` + key, e.g. ``files[0].size``) and where it is (``context``, e.g. `` of line 2``).
    A missing field and a null one are the same: clients send ``"organization": null``.
    ``subject``: how a refusal of the object itself names it."""

    def __init__(self, data: Any, prefix: str = "", context: str = "",
                 subject: str = "The body"):
        self.prefix, self.context = prefix, context
        if not isinstance(data, dict):
            raise bad_request(f"{subject} must be a JSON object, not {_type_name(data)}.")
        self.data = data

    def name(self, key: str) -> str:
        """How a message names field ``key``."""
        return f"Field {self.prefix + key!r}{self.context}"

    def _get(self, key: str, required: bool, kind: str) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise bad_request(f"{self.name(key)} is missing; it must be {kind}.")
        return value

    def text(self, key: str, *, required: bool = False, nonempty: bool = False,
             default: str | None = None) -> str | None:
        """A string field (``default`` when missing); ``nonempty``: not only whitespace."""
        value = self._get(key, required, "a string")
        if value is None:
            return default
        return self._text(key, value, nonempty)

    def _text(self, key: str, value: Any, nonempty: bool = False) -> str:
        if not isinstance(value, str):
            raise bad_request(f"{self.name(key)} must be a string, not {_type_name(value)}.")
        try:  # JSON may carry lone surrogates ("\ud800"): no file or header can hold them
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(f"{self.name(key)} is not valid Unicode (it holds a lone "
                              "surrogate).") from None
        if nonempty and not value.strip():
            raise bad_request(f"{self.name(key)} must not be empty.")
        return value

    def flag(self, key: str, default: bool | None = False) -> bool | None:
        """A boolean field (``true``/``false``, not 0, 1 or a string)."""
        value = self._get(key, False, "true or false")
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{self.name(key)} must be true or false, not {_type_name(value)}.")
        return value

    def integer(self, key: str, *, required: bool = False, default: int | None = None,
                maximum: int = MAX_SIZE) -> int | None:
        """A whole number from 0 to ``maximum`` (no boolean, no fraction)."""
        value = self._get(key, required, "a whole number")
        if value is None:
            return default
        if isinstance(value, float):
            raise bad_request(f"{self.name(key)} must be a whole number, not {shown(value)}.")
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"{self.name(key)} must be a whole number, not {_type_name(value)}.")
        if not 0 <= value <= maximum:
            raise bad_request(f"{self.name(key)} must be from 0 to {maximum}, not {shown(value)}.")
        return value

    def choice(self, key: str, choices: Iterable[str | None], default: str | None = None) -> str | None:
        """A string field that is one of ``choices`` (None among them: it may be missing)."""
        allowed = tuple(choices)
        value = self._get(key, None not in allowed, "one of " + ", ".join(
            repr(c) for c in allowed if c is not None))
        if value is None:
            return default
        if value not in allowed:  # a list or object is never in allowed, nor hashable-checked
            listed = ", ".join(repr(c) for c in allowed if c is not None)
            raise bad_request(f"{self.name(key)} must be one of {listed}, not {shown(value)}.")
        return value

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        """An array field (``[]`` when missing)."""
        value = self._get(key, required, "an array")
        if value is None:
            return []
        if not isinstance(value, list):
            raise bad_request(f"{self.name(key)} must be an array, not {_type_name(value)}.")
        return value

    def texts(self, key: str) -> list[str]:
        """An array of strings."""
        return [self._text(f"{key}[{index}]", item) for index, item in enumerate(self.items(key))]

    def objects(self, key: str, *, required: bool = False) -> list[Fields]:
        """An array of objects, each read as :class:`Fields`."""
        return [Fields(item, f"{self.prefix}{key}[{index}].", self.context,
                       self.name(f"{key}[{index}]"))
                for index, item in enumerate(self.items(key, required=required))]

    def object(self, key: str, *, required: bool = False) -> Fields | None:
        """An object field, read as :class:`Fields` (None when missing)."""
        value = self._get(key, required, "an object")
        return None if value is None else Fields(value, f"{self.prefix}{key}.", self.context,
                                                 self.name(key))

    def id(self, key: str, parse: Callable[[Any, str], T], *, required: bool = True) -> T | None:
        """An id field through its parser of :mod:`._ids` (which names the field when it
        refuses it); None when missing and not ``required``."""
        value = self._get(key, required, "an id")
        return None if value is None else parse(value, self.name(key))

    def revision(self, key: str) -> Revision | None:
        """A revision field (None when missing): a malformed one is this body's fault (400),
        not a revision that is not there."""
        value = self.data.get(key)
        if value is None:
            return None
        try:
            return parse_revision(value)
        except StoreError as exc:
            raise bad_request(f"{self.name(key)} is not a revision: {exc}") from None

    def base64(self, key: str, *, required: bool = False) -> bytes:
        """A base64 string field, decoded strictly (a stray character is refused, not skipped)."""
        value = self.text(key, required=required, default="")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{self.name(key)} is not valid base64.") from None

    def path(self, key: str, *, folder: bool = False) -> str:
        """A path inside a repo, as the Hub stores it (:func:`._ids.repo_path`: a 422 naming
        the field and the rule); ``folder``: a trailing ``/`` is dropped."""
        value = self.text(key, required=True)
        if folder:
            value = value.rstrip("/")
        try:
            return repo_path(value)
        except StoreError as exc:  # its message says which rule
            raise StoreError(exc.status, f"{self.name(key)} is not a path inside a repo: "
                                         f"{exc}") from None


def json_object(parse: Callable[[Fields], T]) -> Callable[[bytes, str], T]:
    """A body parser from a function of the body's :class:`Fields`: the body must be a JSON
    object (or empty)."""

    def parser(raw: bytes, content_type: str = "") -> T:
        return parse(Fields(load_json(raw)))

    parser.__name__ = parser.__qualname__ = parse.__name__
    parser.__doc__ = parse.__doc__
    return parser


# --- repos ---------------------------------------------------------------------------------------
def _kind(body: Fields) -> str:
    kind = body.choice("type", ("model", "dataset", None))
    return KINDS[kind]


@dataclass(frozen=True)
class RepoName:
    """A repo a body names: its kind, its namespace (None: the caller's) and name."""

    kind: str
    namespace: str | None
    name: str


@dataclass(frozen=True)
class NewRepo:
    """``POST /api/repos/create``."""

    kind: str
    namespace: str | None
    name: str
    private: bool


@json_object
def create_repo(body: Fields) -> NewRepo:
    """``{name, organization?, type?, private? (0.36), visibility? (2.x)}``; ``type`` "space"
    is refused (no Spaces here)."""
    kind = body.choice("type", ("model", "dataset", None))
    name, namespace = body.id("name", repo_name), body.id("organization", repo_name,
                                                          required=False)
    private = bool(body.flag("private")) or \
        body.choice("visibility", ("private", "public", None)) == "private"
    body.text("resourceGroupId"), body.text("region")  # sent only when given: checked, unused
    return NewRepo(KINDS[kind], namespace, name, private)


@json_object
def delete_repo(body: Fields) -> RepoName:
    """``{name, organization?, type?}``: the repo is looked up (404 when no repo can be named
    so)."""
    return RepoName(_kind(body), body.text("organization"), body.text("name", required=True))


@dataclass(frozen=True)
class MoveRepo:
    """``POST /api/repos/move``: ``source`` (looked up) to ``target`` (a valid new id)."""

    kind: str
    source: tuple[str, str]
    target: RepoRef


@json_object
def move_repo(body: Fields) -> MoveRepo:
    """``{fromRepo: "ns/name", toRepo: "ns/name", type?}``."""
    kind = _kind(body)
    source, target = body.text("fromRepo", required=True), body.text("toRepo", required=True)
    if source.count("/") != 1:
        raise bad_request(f"{body.name('fromRepo')} must be namespace/name, not {shown(source)}.")
    if target.count("/") != 1:
        raise bad_request(f"{body.name('toRepo')} must be namespace/name, not {shown(target)}.")
    namespace, name = source.split("/")
    return MoveRepo(kind, (namespace, name),
                    new_repo_ref(kind, *target.split("/"), what=body.name("toRepo")))


@dataclass(frozen=True)
class RepoSettings:
    """``PUT .../settings``: the new privacy (None: unchanged), the gating and Xet asked for
    (None: not asked)."""

    private: bool | None
    gated: str | bool | None
    xet: bool | None


@json_object
def repo_settings(body: Fields) -> RepoSettings:
    """``{private? (0.36), visibility? (2.x), gated?, xetEnabled?}``."""
    private = body.flag("private", None)
    visibility = body.choice("visibility", ("private", "public", None))
    gated = body.data.get("gated")
    if gated not in (None, False, "auto", "manual"):
        raise bad_request(f"{body.name('gated')} must be false, 'auto' or 'manual', not "
                          f"{shown(gated)}.")
    xet = body.flag("xetEnabled", None)
    if private is None and visibility is not None:
        private = visibility == "private"
    return RepoSettings(private, gated, xet)


@json_object
def new_tag(body: Fields) -> str:
    """``{tag, message?}`` -> the tag's name, as sent: the store checks it against git's rules
    once the revision it tags is found (a missing revision is what the Hub answers first)."""
    body.text("message")
    return body.text("tag", required=True)


@json_object
def new_branch(body: Fields) -> Revision | None:
    """``{startingPoint?}`` -> the revision the branch starts at (None: main)."""
    return body.revision("startingPoint")


@json_object
def validate_yaml(body: Fields) -> None:
    """``{content, repoType}``: nothing is validated here (always no errors), but the body
    must have that shape."""
    body.text("content"), body.text("repoType")


# --- uploads -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreuploadFile:
    """One file of a preupload request: its path, size and first bytes."""

    path: str
    size: int
    sample: bytes


@dataclass(frozen=True)
class Preupload:
    """``POST .../preupload/{rev}``: the files, and the ``.gitignore`` and ``.gitattributes``
    the same upload commits (None: it commits none; the repo's own applies)."""

    files: list[PreuploadFile]
    git_ignore: str | None
    git_attributes: str | None = None


@json_object
def preupload(body: Fields) -> Preupload:
    """``{files: [{path, sample (base64), size}], gitIgnore?, gitAttributes?}``."""
    git_ignore, git_attributes = body.text("gitIgnore"), body.text("gitAttributes")
    return Preupload([PreuploadFile(item.text("path", required=True, nonempty=True),
                                    item.integer("size", default=0), item.base64("sample"))
                      for item in body.objects("files")], git_ignore, git_attributes)


@json_object
def lfs_batch(body: Fields) -> list[tuple[str, int]]:
    """``{operation, transfers?, objects: [{oid, size}], hash_algo?, ref?: {name}}`` -> the
    (oid, size) of each object."""
    body.choice("operation", ("upload", "download", None))
    body.texts("transfers")
    body.choice("hash_algo", ("sha256", None))  # the only one this endpoint stores blobs by
    if (ref := body.object("ref")) is not None:
        ref.text("name")
    return [(item.id("oid", blob_oid), item.integer("size", required=True))
            for item in body.objects("objects", required=True)]


@json_object
def lfs_verify(body: Fields) -> tuple[str, int]:
    """``{oid, size}`` of the object just uploaded."""
    return body.id("oid", blob_oid), body.integer("size", required=True)


@dataclass(frozen=True)
class PathsInfo:
    """``POST .../paths-info/{rev}``: the paths asked about, and whether to expand them."""

    paths: list[str]
    expand: bool


def paths_info(raw: bytes, content_type: str = "") -> PathsInfo:
    """The clients send a form (``paths=a&paths=b&expand=false``); JSON
    (``{"paths": [...], "expand": false}``) is read too."""
    if "json" in content_type:
        body = Fields(load_json(raw))
        paths = body.texts("paths")
        if len(paths) > MAX_FORM_FIELDS:
            raise bad_request(f"Field 'paths' names more than {MAX_FORM_FIELDS} paths.")
        return PathsInfo(paths, bool(body.flag("expand")))
    try:
        form = parse_qs(raw.decode("utf-8"), max_num_fields=MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise bad_request("The form body is not UTF-8 text.") from None
    except ValueError:
        raise bad_request(f"The form body has more than {MAX_FORM_FIELDS} fields.") from None
    expand = (form.get("expand") or [""])[0]
    if expand.lower() not in ("", "true", "false"):  # httpx sends "false", requests "False"
        raise bad_request(f"Field 'expand' must be true or false, not {shown(expand)}.")
    return PathsInfo(form.get("paths", []), expand.lower() == "true")


# --- commits -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Commit:
    """``POST .../commit/{rev}``: the header's summary, description and parent, then the
    operations in order."""

    summary: str
    description: str
    parent: str | None
    operations: list[Operation]


def _operation(key: str, value: Fields) -> Operation:
    if key == "file":
        value.choice("encoding", ("base64", None))
        return AddFile(value.path("path"), value.base64("content", required=True))
    if key == "lfsFile":
        value.choice("algo", ("sha256", None))
        return AddLfsFile(value.path("path"), value.id("oid", blob_oid),
                          value.integer("size"))  # no size: a copy names the oid only
    if key == "deletedFile":
        return DeleteFile(value.path("path"))
    return DeleteFolder(value.path("path", folder=True))


_OPERATIONS = ("file", "lfsFile", "deletedFile", "deletedFolder")


def commit(raw: bytes, content_type: str = "") -> Commit:
    """NDJSON, one JSON object a line: ``{key: "header", value: {summary, description?,
    parentCommit?}}`` first, then ``file`` / ``lfsFile`` / ``deletedFile`` / ``deletedFolder``
    lines, each ``{key, value: {path, ...}}``."""
    lines = [(number, line) for number, line in enumerate(raw.splitlines(), 1) if line.strip()]
    if not lines:
        raise bad_request("A commit starts with a header line; the body is empty.")
    header: Fields | None = None
    operations: list[Operation] = []
    for number, line in lines:
        where = f" of line {number}"
        entry = Fields(load_json(line, f"Line {number}"), context=where,
                       subject=f"Line {number}")
        key = entry.choice("key", ("header", *_OPERATIONS))
        value = entry.object("value", required=True)
        if (key == "header") != (header is None):
            raise bad_request("A commit starts with one header line, then operations; line "
                              f"{number} is {'a second header' if header else 'not the header'}.")
        if key == "header":
            header = value
        else:
            operations.append(_operation(key, value))
    assert header is not None  # the first line is one, or the loop refused it
    return Commit(summary=header.text("summary", default=""),
                  description=header.text("description", default=""),
                  # A parent becomes a file name in the store: 40 hex only, not even a short id.
                  parent=header.id("parentCommit", commit_id, required=False),
                  operations=operations)


# --- discussions and pull requests ---------------------------------------------------------------
@dataclass(frozen=True)
class NewDiscussion:
    """``POST .../discussions``."""

    title: str
    description: str
    pull_request: bool


@json_object
def new_discussion(body: Fields) -> NewDiscussion:
    """``{title, description?, pullRequest?}``."""
    return NewDiscussion(body.text("title", required=True, nonempty=True).strip(),
                         body.text("description", default=""), bool(body.flag("pullRequest")))


def _comment(body: Fields, key: str = "comment") -> str | None:
    """An optional comment: None when missing or blank."""
    return (body.text(key) or "").strip() or None


@json_object
def new_comment(body: Fields) -> str:
    """``{comment}``."""
    return body.text("comment", required=True, nonempty=True).strip()


@json_object
def new_title(body: Fields) -> str:
    """``{title}``."""
    return body.text("title", required=True, nonempty=True).strip()


@dataclass(frozen=True)
class StatusChange:
    """``POST .../discussions/{num}/status``."""

    status: str
    comment: str | None


@json_object
def new_status(body: Fields) -> StatusChange:
    """``{status: "open" | "closed", comment?}``."""
    return StatusChange(body.choice("status", ("open", "closed")), _comment(body))


@json_object
def merge(body: Fields) -> str | None:
    """``{comment?}`` (or no body at all)."""
    return _comment(body)


@json_object
def edited_comment(body: Fields) -> str:
    """``{content}``: the comment's new text."""
    return body.text("content", required=True, nonempty=True)
