"""``cubepack lineage``: a cube's chain of parents, followed through the Hub when asked.

The chain starts at the cube's own lock (parsed and checked as verify checks it: structure and
both digests). With ``follow``, each parent's ``cubepack.lock`` is downloaded alone, at the
exact commit its child's lineage records, and its digests must be the ones the child recorded:
a parent link that does not match (a tampered or re-pointed link) is refused. Each fetched
parent is named by the ref of its repo that holds its commit (``ref``): a branch (the commit is
in its history), else a tag on it, else a pull request (``refs/pr/N``, in its history: a
proposal anyone may open on a repo, not a commit its owner placed on a branch), else none. The
chain ends at a root (a lock without lineage), or where a parent was never pulled from a Hub
(no commit recorded: the result says the chain is incomplete).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.paths import regular_file
from .._util.quiet import terminal_bars
from ..errors import FormatError, IntegrityError
from ..format import _lock as lockfile
from ..format._lock import PARENT_LINK_KEYS
from ..format.sections import Lock
from ..trust import _lineage as lineage_format
from ..trust._evidence import PROVED
from ._client import HubClient

#: Longest chain followed: a Hub serving an endless chain of parents cannot keep us looping.
MAX_DEPTH = 256


@dataclass
class LineageResult:
    """The chain, this cube first: each link's lock digests and what its lineage records."""

    cube_dir: Path
    chain: list[dict[str, Any]] = field(default_factory=list)
    followed: bool = False
    #: the chain reached a root (a lock recording no parent); False when not followed or when
    #: a parent was never pulled from a Hub (``stopped`` says which)
    complete: bool = False
    stopped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cube_dir": str(self.cube_dir), "chain": self.chain, "followed": self.followed,
                "complete": self.complete, "stopped": self.stopped}


@terminal_bars
def lineage(cube_dir: str | Path, *, follow: bool = False, repo_type: str = "dataset",
            endpoint: str | None = None, token: str | None = None,
            timeout: float | None = None) -> LineageResult:
    """The lineage chain of the cube at ``cube_dir``; with ``follow``, up to its root.

    Raises:
        FormatError: the cube's lock (or a fetched parent's) is malformed.
        IntegrityError: a fetched parent lock's digests are not those its child recorded.
        HubError: a parent's lock could not be downloaded.

    Returns:
        a ``LineageResult``: the chain of ancestors (each a claim unless a trusted key
        signed it), whether it was followed on the Hub, and where and why it stopped.

    Example:
        ```python
        result = cubepack.lineage("my-cube", follow=True)
        for link in result.chain:
            print(link)
        ```
    """
    cube = Path(cube_dir)
    seconds = constants.hub_timeout(timeout)  # a bad --timeout is refused before any work
    try:
        path = regular_file(cube, constants.LOCK_FILENAME)
    except FileNotFoundError as exc:
        raise FormatError(f"{cube} holds no {constants.LOCK_FILENAME}: it was not packed by "
                          "cubepack (lineage is recorded by cubepack migrate).") from exc
    lock = lockfile.parse(path.read_bytes())
    result = LineageResult(cube, [lineage_format.describe(lock)], followed=follow)
    if not follow:
        result.complete = lock.lineage is None
        return result
    client = HubClient(endpoint, token, timeout=seconds, action="lineage --follow",
                       outcome="Nothing was changed.", cached=True)
    child, where = lock, str(cube)
    while child.lineage is not None:
        parent = child.lineage.parent
        if parent.repo_id is None or parent.revision is None:
            result.stopped = (f"the parent of {where} (lock {parent.lock_digest}) was not "
                              "pulled from a Hub, so no commit of it is recorded to follow")
            return result
        if len(result.chain) > MAX_DEPTH:
            raise FormatError(f"The lineage of {cube} is longer than {MAX_DEPTH} links; refusing "
                              "to follow it further.")
        spec = f"{parent.repo_id}@{parent.revision}"
        fetched = _fetch_lock(client, parent.repo_id, parent.revision, repo_type)
        # The one definition of what a parent link names (Parent.link), met by the lock the
        # commit holds: its own digest, content digest and id.
        recorded = parent.link()
        holds = {"lock_digest": fetched.digest, "content_digest": fetched.content_digest,
                 "cube_id": fetched.cube_id}
        for key in PARENT_LINK_KEYS:
            found = holds[key]
            if found != recorded[key] and (key != "cube_id" or recorded[key] is not None):
                raise IntegrityError(
                    f"Tampered parent link: {where} records its parent as {spec} with "
                    f"{key.replace('_', ' ')} {recorded[key]}, but the cubepack.lock that commit "
                    f"holds has {found}. The lineage does not lead to the cube it names; do not "
                    "trust it (ask the cube's publisher which parent it was derived from).")
        result.chain[-1]["parent_basis"] = PROVED  # fetched now: its digests are the recorded
        entry = lineage_format.describe(fetched)
        entry.update(repo_id=parent.repo_id, revision=parent.revision,
                     ref=_ref_of(client, parent.repo_id, parent.revision, repo_type))
        result.chain.append(entry)
        child, where = fetched, spec
    result.complete = True
    return result


def _fetch_lock(client: HubClient, repo_id: str, revision: str, repo_type: str) -> Lock:
    """Only the lock of one exact commit, parsed strictly."""
    with client.translated(repo_id, repo_type, revision):
        local = client.run(client.download, repo_id, constants.LOCK_FILENAME,
                           repo_type=repo_type, revision=revision)
    try:
        return lockfile.parse(Path(local).read_bytes())
    except FormatError as exc:
        raise FormatError(f"The cubepack.lock of {repo_id}@{revision}: {exc}") from exc


#: What :func:`_ref_of` names: the kinds of ref, in the order they are looked for.
BRANCH, TAG, PULL_REQUEST = "branch", "tag", "pull request"


def _ref_of(client: HubClient, repo_id: str, commit: str, repo_type: str) -> dict[str, Any]:
    """The ref of ``repo_id`` that holds ``commit``: ``{"kind", "name"}``, a branch whose
    history holds it, else a tag on it, else a pull request (``refs/pr/N``) whose history holds
    it (checked after the branches: a pull request's history starts on its branch), else
    ``{"kind": None, "name": None}``."""
    api = client.api
    with client.translated(repo_id, repo_type, commit):
        refs = client.run(api.list_repo_refs, repo_id, repo_type=repo_type,
                          include_pull_requests=True)

        def holds(ref: Any) -> bool:
            if ref.target_commit == commit:
                return True
            history = client.run(api.list_repo_commits, repo_id, repo_type=repo_type,
                                 revision=ref.ref)
            return any(entry.commit_id == commit for entry in history)

        for ref in refs.branches:
            if holds(ref):
                return {"kind": BRANCH, "name": ref.name}
        for ref in refs.tags:
            if ref.target_commit == commit:
                return {"kind": TAG, "name": ref.name}
        for ref in refs.pull_requests or []:
            if holds(ref):
                return {"kind": PULL_REQUEST, "name": ref.ref}
    return {"kind": None, "name": None}
