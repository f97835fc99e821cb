"""``cubepack push``: a verified cube as one commit (or none when nothing changed; several,
the lock last, when more than 100 files change: ``_incremental.py``).

``create_commit`` with explicit operations: changed files added, vanished files deleted. A tag
that exists is refused before anything is committed; a stale parent (another push landed first)
is planned again and retried, with jittered exponential backoff, until the push's deadline,
as long as the branch's lock is still the one planned against (else ``PushConflict``).
With ``create_pr`` the commit is proposed as a pull request (``refs/pr/N``) instead.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .._util import constants
from .._util.hashing import sha256_file
from .._util.options import Options
from .._util.paths import names_a_path
from .._util.quiet import terminal_bars
from .._util.revision import check_ref_name
from ..errors import HubError, UsageError
from ..format import _fileset as fileset
from ..format import _partial as partialformat
from ..memos_format import _layout as memos_layout
from ..ops import sign, verify
from ..trust._report import VerifyReport
from . import _incremental as incremental
from ._client import REPO_TYPES, HubClient, lfs_sha256, offline_requested, parse_repo_spec


@dataclass
class PushResult:
    repo_id: str
    repo_type: str
    branch: str
    commit_sha: str
    commit_url: str | None
    changed: bool
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    tag: str | None = None
    pr_num: int | None = None
    pr_revision: str | None = None
    pr_url: str | None = None
    #: every commit the push made, in order (more than one: a push of more than 100 files,
    #: the lock in the last)
    commits: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: Backoff after a stale parent (another push landed first): the n-th retry waits a random
#: time up to min(RETRY_CAP, RETRY_BASE * 2**n) seconds ("full jitter": pushers that collided
#: spread out instead of colliding again), for as long as the push's deadline allows.
RETRY_BASE = 0.05
RETRY_CAP = 5.0


@dataclass(frozen=True)
class PushOptions(Options):
    """Where and how ``push`` commits (``cubepack.push``'s keyword arguments; see its
    docstring for each)."""

    VERB: ClassVar[str] = "push"

    repo_type: str = "dataset"
    private: bool = False
    revision: str | None = None
    tag: str | None = None
    commit_message: str | None = None
    token: str | None = None
    endpoint: str | None = None
    progress: bool | None = None
    allow_local_paths: bool = False
    timeout: float | None = None
    create_pr: bool = False
    #: sign the cube (``cubepack sign``, in place) before it is verified and pushed
    sign_key: str | Path | None = None
    sign_password: str | None = None
    #: publish an unsigned cube over a signed one (refused otherwise)
    allow_unsigned: bool = False


@terminal_bars
def push(cube_dir: str | Path, repo_id: str, options: PushOptions | None = None,
         **fields: Any) -> PushResult:
    """Push a packed cube as one commit (or none when nothing changed; several, the lock in the
    last, when more than 100 files are added or deleted).

    ``options`` (a ``PushOptions``: ``revision``, ``tag``, ``create_pr``, ``token``...)
    may be given as ``fields`` too, set over it. The cube is verified first: an unpacked or
    failing cube is refused before any network
    call, and so is one whose ``config.json`` names a model by a local path (unless
    ``allow_local_paths``). Only files whose content differs from the branch head are
    uploaded; files the cube no longer has are deleted in the same commit. A ``tag`` that
    exists is refused before anything is committed. Every commit names its parent; when
    another push lands on the branch first without changing its cube (its lock), the plan is
    made again against the new head and retried after a jittered, exponentially growing wait,
    for as long as the deadline allows; when it changed the cube, the push stops
    (``PushConflict``). A branch holding a signed cube is not given an unsigned one unless
    ``allow_unsigned``; ``sign_key`` signs the cube (in place) before it is verified.

    With ``create_pr``, the commit is proposed to the branch as a pull request: it lands on a
    new ``refs/pr/N`` (the result's ``pr_num``, ``pr_revision``, ``pr_url``), the branch does
    not move, and no tag can be given (tag the commit once it is merged).

    ``timeout`` (seconds; default ``CUBEPACK_HUB_TIMEOUT`` or 3600) bounds everything the push
    asks of the endpoint; on expiry the requests in flight are aborted and the error names
    what was slow (a push may then have landed or not: pushing again makes no second commit).

    Raises:
        VerificationFailed: the cube does not verify.
        UsageError: a local model path in config.json; a bad repo type or timeout; a tag
            with ``create_pr``; HF_HUB_OFFLINE set.
        HubError: the endpoint refused or failed (one sentence: unknown repo, no token, a tag
            that exists, a branch that keeps moving, the deadline passed).
        PushConflict: another push landed a different cube on the branch first (pull,
            re-pack the changes onto it, push again); the remote stays as it left it.
        SignatureError: the branch holds a signed cube and this one is not signed (pass
            ``sign_key``, or ``allow_unsigned``).

    Returns:
        a ``PushResult``: the repo, the branch and commit written (and its URL), what
        changed and was uploaded or deleted, and the tag or pull request made.

    Example:
        ```python
        result = cubepack.push("my-cube", "org/my-cube", tag="v1")
        print(result.commit_sha)
        ```
    """
    return _push(Path(cube_dir), repo_id, PushOptions.build(options, **fields))


def _push(cube_dir: Path, repo_id: str, options: PushOptions) -> PushResult:
    repo_type, private, revision = options.repo_type, options.private, options.revision
    tag, commit_message, token = options.tag, options.commit_message, options.token
    endpoint, progress = options.endpoint, options.progress
    allow_local_paths, timeout, create_pr = (options.allow_local_paths, options.timeout,
                                             options.create_pr)
    if repo_type not in REPO_TYPES:
        raise UsageError(f"--repo-type must be one of {', '.join(REPO_TYPES)}, not {repo_type!r}.")
    # Every argument is checked before the cube is hashed or the endpoint asked anything.
    partialformat.refuse(cube_dir, "push", "would publish a cube without the memories it lacks")
    repo_id, at_revision = parse_repo_spec(repo_id)
    if at_revision:
        raise UsageError(f"Push to a branch with --revision, not {repo_id}@{at_revision}.")
    if revision is not None:  # a branch, or an open pull request's refs/pr/N
        check_ref_name(revision, what="--revision")
    if tag is not None:  # a new tag: a bare name
        check_ref_name(tag, what="--tag", new=True)
    if create_pr and tag:
        raise UsageError("--tag cannot be combined with --create-pr: a pull request's commit is "
                         "not published yet; tag it once the request is merged.")
    seconds = constants.hub_timeout(timeout)
    if offline_requested():  # huggingface_hub would refuse every request, as unreachable
        raise UsageError("A push needs its endpoint, and HF_HUB_OFFLINE is set (huggingface_hub "
                         "then sends no request): unset HF_HUB_OFFLINE to push.")
    cube = Path(cube_dir)
    if options.sign_key is not None:  # a changed signed cube is signed again, then pushed
        sign(cube, options.sign_key, password=options.sign_password)
    report = verify(cube, progress=progress)
    if not allow_local_paths:
        _refuse_local_model_paths(cube)
    local = _local_files(cube, report)
    branch = revision or "main"
    client = HubClient(endpoint, token, timeout=seconds, action=f"push to {repo_id}",
                       outcome="The commit may or may not have landed: push again (an "
                               "unchanged cube makes no second commit).")
    for path, sha256 in local.items():
        client.deadline.name(sha256, path)  # LFS upload URLs carry the file's sha256
    message = commit_message or f"cubepack push (lock {report.lock.digest[:12]})"
    with client.translated(repo_id, repo_type, branch):
        return client.run(_push_commit, client, cube, local, repo_id, repo_type=repo_type,
                          private=private, branch=branch, tag=tag, message=message,
                          create_pr=create_pr, allow_unsigned=options.allow_unsigned)


def _push_commit(client: HubClient, cube: Path, local: dict[str, str], repo_id: str, *,
                 repo_type: str, private: bool, branch: str, tag: str | None,
                 message: str, create_pr: bool, allow_unsigned: bool = False) -> PushResult:
    """Everything a push asks of the endpoint: at most one commit, then the tag."""
    api = client.api
    api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    if branch.startswith("refs/pr/"):  # an open pull request: the commit is added to it
        if branch not in {ref.ref for ref in api.list_repo_refs(
                repo_id, repo_type=repo_type, include_pull_requests=True).pull_requests or []}:
            raise UsageError(f"{repo_id} has no pull request {branch}: push --create-pr opens "
                             "one (its refs/pr/N is printed); --revision refs/pr/N adds a "
                             "commit to an open one.")
    elif branch != "main":
        api.create_branch(repo_id, repo_type=repo_type, branch=branch, exist_ok=True)
    collisions = 0
    planned: list[str | None] = []  # the remote lock the first plan was made against
    landed: list[str] = []
    uploaded: set[str] = set()
    while True:
        info = api.repo_info(repo_id, repo_type=repo_type, revision=branch,
                             files_metadata=True)
        head = info.sha
        remote = {sibling.rfilename: sibling for sibling in info.siblings or []}
        if planned and incremental.lock_id(remote) != planned[0]:
            raise incremental.conflict(repo_id, branch, planned[0],
                                       incremental.lock_id(remote), head)
        planned = planned or [incremental.lock_id(remote)]
        additions, deletions = _plan(cube, local, remote)
        if not allow_unsigned:
            incremental.refuse_unsigning(repo_id, branch, remote, local,
                                         bool(additions or deletions))
        if tag:
            _check_tag(client, repo_id, repo_type, tag, None if additions or deletions
                       else head)
        if not (additions or deletions):
            commit = None
            break
        # A pull request is one commit (create_pr starts it from the head planned against:
        # never stale); a branch takes several when the push is more than 100 files.
        steps = ([(additions, deletions)] if create_pr
                 else incremental.commits(additions, deletions, remote))
        try:
            for adds, dels in steps:
                commit = client.create_commit(repo_id, _operations(adds, dels),
                                              repo_type=repo_type, branch=branch,
                                              message=message if len(steps) == 1 else
                                              f"{message} [{len(landed) + 1}/{len(steps)}]",
                                              parent_commit=head, create_pr=create_pr)
                head = commit.oid
                landed.append(commit.oid)
                uploaded.update(path for path, _ in adds)
            break
        except Exception as exc:
            if _status(exc) != 412:
                raise
            collisions += 1
            if not _back_off(client, collisions):
                raise HubError(f"{repo_id}@{branch} kept moving while pushing: another push "
                               f"landed first {collisions} times before the push's deadline "
                               f"({client.deadline.seconds:g} s, --timeout); push again.") from exc
    sha = commit.oid if commit is not None else head
    if tag and _tag_target(client, repo_id, repo_type, tag) is None:
        client.api.create_tag(repo_id, tag=tag, revision=sha, repo_type=repo_type)
    pr_url = getattr(commit, "pr_url", None)
    return PushResult(repo_id=repo_id, repo_type=repo_type, branch=branch, commit_sha=sha,
                      commit_url=commit.commit_url if commit is not None else None,
                      changed=commit is not None, uploaded=sorted(uploaded),
                      deleted=sorted(deletions), tag=tag, commits=landed,
                      pr_num=getattr(commit, "pr_num", None) if pr_url else _pr_number(branch),
                      pr_revision=getattr(commit, "pr_revision", None) if pr_url
                      else (branch if branch.startswith("refs/pr/") else None),
                      pr_url=pr_url)


def _pr_number(branch: str) -> int | None:
    """N of ``refs/pr/N`` (a push that added a commit to an open pull request), else None."""
    number = branch.removeprefix("refs/pr/")
    return int(number) if branch.startswith("refs/pr/") and number.isdigit() else None


def _back_off(client: HubClient, collisions: int) -> bool:
    """Wait before re-planning after the ``collisions``-th stale parent: a random time up to
    ``min(RETRY_CAP, RETRY_BASE * 2**collisions)``. False, without waiting, when that would
    run past the push's deadline."""
    delay = random.uniform(0, min(RETRY_CAP, RETRY_BASE * 2 ** collisions))
    return client.deadline.pause(delay)


def _status(exc: Exception) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _refuse_local_model_paths(cube: Path) -> None:
    """A model named by a local path means nothing on another machine and reveals the
    pusher's file system; pack names Hub-cache snapshots by their Hub id instead. An adapter's
    ``base_model_name_or_path`` too (pack never rewrites an adapter's files: its digest is the
    digest of the folder PEFT saved)."""
    for adapter in sorted((cube / constants.PARAMETRIC_DIR).glob(f"*/{constants.ADAPTER_CONFIG}")):
        claimed = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if names_a_path(claimed):
            raise UsageError(
                f"{adapter.relative_to(cube).as_posix()} names its base model by the local path "
                f"{claimed}, which means nothing on another machine and reveals your file "
                "system (the lock pins the base by its fingerprint either way). Set "
                "base_model_name_or_path to the base's Hub id and pack again, or pass "
                "--allow-local-paths to push it anyway.")
    config_path = cube / constants.MEMOS_CONFIG
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for role in memos_layout.roles(config if isinstance(config, dict) else {}):
        inner = memos_layout.llm_config(config if isinstance(config, dict) else {}, role) or {}
        name = inner.get("model_name_or_path")
        if names_a_path(name):
            fix = (f"Pack with its Hub id (cubepack pack {cube} --model OWNER/MODEL): config.json "
                   "then names it" if role == memos_layout.ACT_ROLE else
                   "Name its Hub id in config.json (or load it from the HF cache) and pack again")
            raise UsageError(
                f"config.json names the {role} model by the local path {name}, which means "
                f"nothing on another machine and reveals your file system. {fix}; or pass "
                "--allow-local-paths to push it anyway (e.g. a shared mount).")


def _local_files(cube: Path, report: VerifyReport) -> dict[str, str]:
    """path -> sha256 of everything a push sends: the locked files, the lock, a signature and
    the lock's attestation."""
    locked = report.lock.files
    files = {path: entry.sha256 for path, entry in locked.items()}
    for extra in fileset.uploaded(list(locked))[len(locked):]:
        if (cube / extra).is_file():
            files[extra] = sha256_file(cube / extra)
    return files


def _plan(cube: Path, local: dict[str, str],
          remote: dict[str, Any]) -> tuple[list[tuple[str, Path]], list[str]]:
    additions = []
    for path, sha256 in sorted(local.items()):
        sibling = remote.get(path)
        if sibling is not None and _same_content(cube / path, sha256, sibling):
            continue
        additions.append((path, cube / path))
    deletions = sorted(p for p in remote if p not in local and p != fileset.HUB_ATTRIBUTES)
    return additions, deletions


def _same_content(path: Path, sha256: str, sibling: Any) -> bool:
    """Does the Hub already hold exactly this file? LFS files by sha256, regular files by the
    git blob id (computed as git and the Hub compute it)."""
    from huggingface_hub.utils.sha import git_hash

    remote_sha256 = lfs_sha256(sibling)
    if remote_sha256 is not None:
        return remote_sha256 == sha256
    blob_id = getattr(sibling, "blob_id", None)
    if blob_id is None or sibling.size != path.stat().st_size:
        return False
    return blob_id == git_hash(path.read_bytes())


def _operations(additions: list[tuple[str, Path]], deletions: list[str]) -> list[Any]:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    return ([CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local))
             for path, local in additions]
            + [CommitOperationDelete(path_in_repo=path) for path in deletions])


def _tag_target(client: HubClient, repo_id: str, repo_type: str, tag: str) -> str | None:
    refs = client.api.list_repo_refs(repo_id, repo_type=repo_type)
    return {ref.name: ref.target_commit for ref in refs.tags}.get(tag)


def _check_tag(client: HubClient, repo_id: str, repo_type: str, tag: str,
               unchanged_head: str | None) -> None:
    """Before anything is committed: an existing tag is refused unless it already names the
    commit this push would report (nothing changed and it points at the head)."""
    existing = _tag_target(client, repo_id, repo_type, tag)
    if existing is not None and existing != unchanged_head:
        raise HubError(f"Tag {tag!r} of {repo_id} already points at {existing}; tags are "
                       "immutable pins, choose a new tag. Nothing was pushed.")
