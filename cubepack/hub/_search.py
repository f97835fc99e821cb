"""``cubepack search --model M``: the cubes on an endpoint whose pins match a model.

M is a weights digest (``sha256:<hex>``), a local model folder, or a Hub model id
(``owner/name[@rev]``, resolved once to its commit). Candidates come from the Hub's list API
(what ``list_datasets`` / ``list_models`` send, every page followed, each repo once; a page
that lists nothing new yet links to another is refused as a loop), filtered on the tag the
card of a cube packed with M's weights carries (:func:`cubepack.format._card.weights_tag`;
``every_cube``: on the ``cubepack`` tag alone). A tag is a hint, never evidence: each
candidate's lock is read at the commit the list names (one download, two requests: its HEAD
and GET), parsed strictly, and its pins compared with M role by role; only a pin that
matches makes the cube a match. With trusted keys, its signature (and attestation) is fetched
too and must verify over that lock under one of them, or the cube is not a match. At most
``limit`` candidates are read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.canonical import digest_of_file_hashes
from .._util.revision import is_commit
from ..errors import CubepackError, HubError, SignatureError, UsageError
from ..format import _lock as lockfile
from ..format._card import PLAIN_TAGS, weights_tag
from ..format.sections import Lock, Pin
from ..format.sections import shards as shardformat
from ..identity._fingerprint import fingerprint
from ..identity._hub import hub_identity, hub_weight_hashes
from ..identity._identity import ModelIdentity, compare
from ..trust._keys import check_key
from ..trust._policy import key_paths
from ..trust._signing import verify_lock_signature
from ._client import REPO_TYPES, HubClient, offline_requested, parse_repo_spec

#: Candidates read when no limit is given.
DEFAULT_LIMIT = 50
#: The tag every cube's card carries (MemOS cubes and plain bundles alike).
CUBE_TAG = PLAIN_TAGS[-1]
_DIGEST = re.compile(r"(?:sha256|state-dict-sha256):[0-9a-f]{64}")
#: What each kind of M's identity rests on, as the result says it.
_BASIS = {"digest": "the digest given: only the weights are compared",
          "folder": "fingerprinted now from the folder, as run in each pin's dtype",
          "hub": "the Hub's file metadata at the resolved commit (LFS sha256 of the weights, "
                 "the small files), as run in each pin's dtype: the endpoint's word, not bytes "
                 "hashed here"}


@dataclass
class Candidate:
    """One repo the list named, and what reading its lock found."""

    repo_id: str
    repo_type: str
    revision: str | None
    match: bool = False
    memories: dict[str, int] = field(default_factory=dict)
    roles: list[dict[str, Any]] = field(default_factory=list)
    signature: str = "unsigned"
    signed_by: str | None = None
    reason: str | None = None

    @property
    def memory_count(self) -> int:
        return sum(self.memories.values())

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "repo_type": self.repo_type, "revision": self.revision,
                "match": self.match, "memory_count": self.memory_count,
                "memories": dict(self.memories), "roles": self.roles,
                "signature": self.signature, "signed_by": self.signed_by,
                "reason": self.reason}


@dataclass
class SearchResult:
    """What :func:`search` found: the matches, the candidates read that did not match (each
    with its reason), and how many the list named."""

    model: dict[str, Any]
    endpoint: str
    repo_types: list[str]
    hint: str
    limit: int
    listed: int = 0
    truncated: bool = False
    matches: list[Candidate] = field(default_factory=list)
    others: list[Candidate] = field(default_factory=list)

    @property
    def read(self) -> int:
        return len(self.matches) + len(self.others)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "endpoint": self.endpoint, "repo_types": self.repo_types,
                "hint": self.hint, "limit": self.limit, "listed": self.listed,
                "read": self.read, "truncated": self.truncated,
                "matches": [c.to_dict() for c in self.matches],
                "others": [c.to_dict() for c in self.others]}


class _Model:
    """M's identity, computed once per dtype a pin asks for."""

    def __init__(self, spec: str, client: HubClient):
        self.spec, self.client = spec, client
        self._identities: dict[str, ModelIdentity] = {}
        self.repo_id: str | None = None
        self.revision: str | None = None
        self._info: Any = None
        if _DIGEST.fullmatch(spec):
            self.kind, self.weights_digest = "digest", spec
        elif Path(spec).is_dir():
            self.kind, self.folder = "folder", Path(spec)
            self.weights_digest = fingerprint(spec).weights_digest
        elif Path(spec).exists():
            raise UsageError(f"--model {spec} is a file: name a model folder, a weights digest "
                             "(sha256:<hex>) or a Hub id owner/name[@rev].")
        else:
            self.kind = "hub"
            self._resolve_hub(spec)

    def _resolve_hub(self, spec: str) -> None:
        try:
            repo_id, wanted = parse_repo_spec(spec)
        except UsageError as exc:
            raise UsageError(f"--model {spec}: no such folder, and not a weights digest "
                             f"(sha256:<hex>) or a Hub id owner/name[@rev] ({exc})") from None
        client = self.client
        with client.translated(repo_id, "model", wanted):
            info = client.run(client.api.model_info, repo_id, revision=wanted or "main",
                              files_metadata=True)
        sha = getattr(info, "sha", None)
        if not isinstance(sha, str) or not is_commit(sha):
            raise HubError(f"{client.endpoint} answered {repo_id}@{wanted or 'main'} with "
                           f"{sha!r}, which is not a commit id.")
        if wanted and is_commit(wanted) and sha != wanted:
            raise HubError(f"{repo_id}@{wanted} resolved to commit {sha}: a branch or tag named "
                           "like that commit shadows it; name another revision.")
        entries, missing = hub_weight_hashes({s.rfilename: s for s in info.siblings or []})
        if missing or not entries:
            raise HubError(f"{repo_id}@{sha} has no weight files with an LFS sha256 at "
                           f"{client.endpoint}, so its weights digest is unknown: download it "
                           "and pass its folder to --model.")
        self.repo_id, self.revision, self._info = repo_id, sha, info
        self.weights_digest = digest_of_file_hashes(entries)

    def identity(self, dtype: str) -> ModelIdentity:
        if dtype not in self._identities:
            if self.kind == "folder":
                self._identities[dtype] = fingerprint(str(self.folder), dtype=dtype)
            else:
                client = self.client
                with client.translated(self.repo_id or "", "model", self.revision):
                    self._identities[dtype] = client.run(hub_identity, client.api, self.repo_id,
                                                         self._info, dtype=dtype)
        return self._identities[dtype]

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec, "kind": self.kind, "weights_digest": self.weights_digest,
                "repo_id": self.repo_id, "revision": self.revision, "basis": _BASIS[self.kind]}

    def role(self, pin: Pin) -> dict[str, Any]:
        """How ``pin`` compares with M: ``match`` True, False, or None (nothing to compare)."""
        row: dict[str, Any] = {"role": pin.role, "strict": pin.strict, "repo_id": pin.repo_id,
                               "revision": pin.revision, "match": None, "differences": []}
        if pin.identity is None:
            row["note"] = f"not pinned ({pin.reason or 'no identity'})"
            return row
        row["weights_digest"] = pin.identity.weights_digest
        if self.kind == "digest":
            same = pin.identity.weights_digest == self.weights_digest
            row["match"] = same
            row["note"] = "weights digest only (a digest names nothing else)"
            if not same:
                row["differences"] = [{"field": "weights_digest",
                                       "expected": pin.identity.weights_digest,
                                       "found": self.weights_digest}]
            return row
        if pin.identity.weights_digest != self.weights_digest:  # no fingerprint needed
            row["match"] = False
            row["differences"] = [{"field": "weights_digest",
                                   "expected": pin.identity.weights_digest,
                                   "found": self.weights_digest}]
            return row
        mismatches = compare(pin.identity, self.identity(pin.identity.dtype))
        row["match"] = not mismatches
        row["note"] = f"as run in {pin.identity.dtype}, the pin's dtype"
        row["differences"] = [{"field": m.field, "expected": m.expected, "found": m.found}
                              for m in mismatches]
        return row


def search(model: str, *, repo_type: str | None = None, limit: int = DEFAULT_LIMIT,
           trusted_keys: str | os.PathLike[str] | list[str | os.PathLike[str]] | tuple = (),
           every_cube: bool = False,
           endpoint: str | None = None, token: str | bool | None = None,
           offline: bool | None = None, timeout: float | None = None) -> SearchResult:
    """The cubes on the endpoint whose pins match ``model``.

    ``model``: a weights digest (``sha256:<hex>``), a local model folder (fingerprinted in each
    pin's dtype), or a Hub model id ``owner/name[@rev]`` (its commit resolved once; its
    identity from the Hub's file metadata, as ``verify --remote`` computes it). ``repo_type``:
    ``"dataset"``, ``"model"``, or None for both. Candidates are the repos the list API names
    with the tag of ``model``'s weights on their card (``every_cube``: every repo tagged
    ``cubepack``), every page followed; private repos are listed only where ``token`` reads
    them. Each candidate's lock is read at the commit the list names; a candidate matches only
    when a pin of its lock matches ``model`` (and, with ``trusted_keys``, its signature over
    that lock verifies under one of them). At most ``limit`` candidates are read
    (``truncated`` says more were listed).

    Raises:
        UsageError: ``model`` is none of the three, a bad limit or repo type, a trusted key
            that is missing or no public key cube signing takes (before any request).
        HubError: offline (``HF_HUB_OFFLINE``), the endpoint unreachable or refusing the list,
            the Hub model unknown, the deadline passed.

    Returns:
        a :class:`SearchResult`: ``matches`` and ``others`` (candidates read that did not
        match, each with its reason), each with its repo, the commit read, its memory count,
        each role's comparison and its signature's state.

    Example:
        ```python
        result = cubepack.hub.search("org/model-a", repo_type="dataset", limit=20)
        for cube in result.matches:
            print(cube.repo_id, cube.revision, cube.memory_count)
        ```
    """
    if repo_type is not None and repo_type not in REPO_TYPES:
        raise UsageError(f"repo_type {repo_type!r}: dataset, model, or None for both.")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"limit {limit!r}: read at least one candidate (a positive integer).")
    # The user's keys are checked as verify reads them, before any request: a bad key is the
    # user's to fix, never a property of each signed cube it fails on.
    keys = key_paths(trusted_keys)
    for key in keys:
        check_key(key, private=False)
    if offline_requested(offline):
        raise HubError("search asks the endpoint which repos it holds, which the HF cache "
                       "cannot answer offline (HF_HUB_OFFLINE is set): unset HF_HUB_OFFLINE "
                       "to search.")
    seconds = constants.hub_timeout(timeout)
    client = HubClient(endpoint, token, timeout=seconds, action=f"search for {model}",
                       outcome="Nothing was changed.")
    subject = _Model(model, client)
    hint = CUBE_TAG if every_cube else weights_tag(subject.weights_digest)
    kinds = [repo_type] if repo_type else ["dataset", "model"]
    result = SearchResult(model=subject.describe(), endpoint=client.endpoint, repo_types=kinds,
                          hint=hint, limit=limit)
    listed: list[tuple[str, Any]] = []
    for kind in kinds:
        try:  # one more than the limit: whether more were listed than read
            found = client.run(_list, client, kind, hint, limit + 1)
        except CubepackError:
            raise
        except Exception as exc:  # noqa: BLE001 - one sentence for any way the list fails
            raise _list_error(client, kind, exc) from exc
        listed += [(kind, info) for info in found]
    result.listed = len(listed)
    result.truncated = len(listed) > limit
    for kind, info in listed[:limit]:
        candidate = _read(client, subject, kind, info, list(keys))
        (result.matches if candidate.match else result.others).append(candidate)
    return result


def _read(client: HubClient, subject: _Model, kind: str, info: Any,
          trusted_keys: list[str | os.PathLike[str]]) -> Candidate:
    """One candidate: its lock at the listed commit, its pins against M, its signature."""
    repo_id, sha = str(getattr(info, "id", "")), getattr(info, "sha", None)
    candidate = Candidate(repo_id, kind, sha if isinstance(sha, str) else None)
    if not isinstance(sha, str) or not is_commit(sha):
        candidate.reason = f"the list named no commit for it ({sha!r})"
        return candidate
    names = {getattr(s, "rfilename", None) for s in getattr(info, "siblings", None) or []}
    if constants.LOCK_FILENAME not in names:
        candidate.reason = f"not a cube: no {constants.LOCK_FILENAME} at {sha}"
        return candidate
    try:
        lock_bytes = _fetch(client, repo_id, kind, sha, constants.LOCK_FILENAME)
        lock = lockfile.parse(lock_bytes)
    except CubepackError as exc:
        candidate.reason = f"its lock could not be read: {exc}"
        return candidate
    candidate.memories = _memories(lock)
    try:
        candidate.roles = [subject.role(pin) for _, pin in sorted(lock.models.items())]
    except CubepackError as exc:
        candidate.reason = f"the model could not be compared with its pins: {exc}"
        return candidate
    signed = constants.SIGNATURE_FILENAME in names
    candidate.signature = "signed (not checked: no --trusted-key)" if signed else "unsigned"
    matched = [row["role"] for row in candidate.roles if row["match"]]
    if not matched:
        candidate.reason = _why_not(candidate.roles)
        return candidate
    if trusted_keys:
        if not signed:
            candidate.reason = "unsigned, and a trusted key was asked for"
            return candidate
        try:
            attestation = (_fetch(client, repo_id, kind, sha, constants.ATTESTATION_FILENAME)
                           if constants.ATTESTATION_FILENAME in names else None)
            signature = _fetch(client, repo_id, kind, sha, constants.SIGNATURE_FILENAME)
            candidate.signed_by = verify_lock_signature(lock_bytes, signature, attestation,
                                                        trusted_keys)
        except SignatureError as exc:
            untrusted = "not trusted" in str(exc)
            candidate.signature = "signed by an untrusted key" if untrusted \
                else "signature does not verify over this lock"
            candidate.reason = f"{candidate.signature}: {exc}"
            return candidate
        except CubepackError as exc:
            candidate.signature = "signature unreadable"
            candidate.reason = f"its signature could not be read: {exc}"
            return candidate
        candidate.signature = f"signed by {candidate.signed_by}"
    candidate.match = True
    return candidate


def _list(client: HubClient, kind: str, hint: str, wanted: int) -> list[Any]:
    """The first ``wanted`` repos of ``kind`` tagged ``hint``, each once, as ``list_datasets``
    / ``list_models(filter=[hint], expand=["sha", "siblings"], limit=wanted)`` sends and reads
    them (huggingface_hub's session, headers, retries and info classes), walking the pages
    here rather than in the client: its pagination follows any next link, so an endpoint
    whose pages loop (or list nothing, each linking to another) would hold search until its
    deadline. A page that lists no repo not listed before yet links to another is refused."""
    from huggingface_hub.hf_api import DatasetInfo, ModelInfo
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    info_of = DatasetInfo if kind == "dataset" else ModelInfo
    headers = build_hf_headers(token=client.token)
    url: str | None = f"{client.endpoint}/api/{kind}s"
    params: dict[str, Any] | None = {"filter": [hint], "expand": ["sha", "siblings"],
                                     "limit": wanted}
    found: dict[str, Any] = {}
    pages = 0
    while url is not None and len(found) < wanted:
        response = http_backoff("GET", url, params=params, headers=headers)
        hf_raise_for_status(response)
        pages, params, before = pages + 1, None, len(found)  # a next link holds its query
        for item in response.json():
            if len(found) < wanted and item["id"] not in found:
                item.setdefault("siblings", None)
                found[item["id"]] = info_of(**item)
        url = response.links.get("next", {}).get("url")
        if url is not None and len(found) == before and len(found) < wanted:
            raise HubError(f"{client.endpoint}'s list API (GET /api/{kind}s) answered page "
                           f"{pages} with no repo it had not listed and a link to another "
                           f"page ({url}): its pages loop or list nothing. Search stopped "
                           "there instead of following it; tell whoever runs the endpoint, "
                           "or search another one.")
    return list(found.values())


def _list_error(client: HubClient, kind: str, exc: Exception) -> HubError:
    """Why the list API failed, naming the route: an unreachable endpoint as any request's,
    anything else (an endpoint without the list API answers 404) as the list's."""
    error = client.error(exc, f"the {kind} list", kind, None)
    if error.args and str(error.args[0]).startswith("Cannot reach"):
        return error
    status = getattr(getattr(exc, "response", None), "status_code", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return HubError(f"{client.endpoint} did not answer the Hub's list API (GET /api/{kind}s"
                    f"{f', {status}' if status else ''}: {text}); search needs an endpoint that "
                    "lists repos (the Hub, or cubepack hub serve).")


def _fetch(client: HubClient, repo_id: str, kind: str, sha: str, name: str) -> bytes:
    """One small file of commit ``sha``, through the HF cache (its HEAD, then its GET)."""
    with client.translated(repo_id, kind, sha):
        local = client.run(client.download, repo_id, name, repo_type=kind, revision=sha)
    expected = Path(local).parent
    if expected.name != sha:  # the client files a download under the commit it was served
        raise HubError(f"The endpoint served {name} of {repo_id} from another commit than {sha}.")
    return Path(local).read_bytes()


def _memories(lock: Lock) -> dict[str, int]:
    # A sharded cube's activation memories are counted by its shards' entries.
    counts = {"activations": shardformat.activation_count(lock), "adapters": len(lock.adapters)}
    return {kind: count for kind, count in counts.items() if count}


def _why_not(roles: list[dict[str, Any]]) -> str:
    if not roles:
        return "its lock pins no model"
    parts = []
    for row in roles:
        if row["match"] is None:
            parts.append(f"{row['role']}: {row.get('note')}")
        else:
            fields = ", ".join(d["field"] for d in row["differences"]) or "?"
            parts.append(f"{row['role']}: differs in {fields}")
    return "no pin matches the model (" + "; ".join(parts) + ")"
