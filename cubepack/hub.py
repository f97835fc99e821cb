"""Push and pull cubes at exact revisions, and check pinned models against the Hub.

``push`` verifies the cube, then makes exactly one commit (``create_commit`` with explicit
operations: changed files added, vanished files deleted), or none when nothing changed.
``pull`` resolves a branch or tag to its 40-hex commit first, downloads exactly that commit,
verifies it against its lock, and only then swaps it into the target folder.

Works with huggingface_hub 0.36 and 2.x, against the Hub or any compatible endpoint (such as
``cubepack hub serve``). ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and
``HF_HUB_CACHE`` are honoured through huggingface_hub itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import _atomic, constants
from .errors import CubepackError, HubError, VerificationFailed
from .identity import ModelIdentity, compare_geometry
from .localhub.store import git_blob_oid
from .verify import VerifyReport, verify

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_TYPES = ("dataset", "model")
#: Parallel downloads in ``pull``. Fewer than snapshot_download's 8, so files finish one after
#: another and each is hashed while the others still download (measured: bench/pull.py).
_DOWNLOAD_WORKERS = 4


def parse_repo_spec(spec: str, revision: str | None = None) -> tuple[str, str | None]:
    """``"ns/name@rev"`` -> ("ns/name", "rev"); a separate ``revision`` must agree."""
    repo_id, _, at_revision = spec.partition("@")
    if at_revision and revision and at_revision != revision:
        raise CubepackError(f"Two revisions given for {repo_id}: @{at_revision} and "
                            f"--revision {revision}; give one.")
    if not re.match(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$", repo_id):
        raise CubepackError(f"{spec!r} is not a repo id of the form owner/name[@revision].")
    return repo_id, at_revision or revision


def _api(endpoint: str | None, token: str | None) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def _hub_error(exc: Exception, repo_id: str, repo_type: str, revision: str | None,
               endpoint: str | None) -> HubError:
    """One clear sentence for each way the Hub says no."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.errors import (EntryNotFoundError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    where = endpoint or hub_constants.ENDPOINT
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"The {repo_type} repo {repo_id} has no branch, tag or commit named "
                        f"{revision!r} at {where}.")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"The {repo_type} repo {repo_id} was not found at {where}, or it is "
                        "private and no valid token was given (set HF_TOKEN or pass --token).")
    if isinstance(exc, LocalEntryNotFoundError):  # a subclass of EntryNotFoundError in 2.x
        return HubError(f"{repo_id}@{revision} could not be downloaded from {where} and is not "
                        "complete in the HF cache (connection failed or offline).")
    if isinstance(exc, EntryNotFoundError):
        return HubError(f"A file of {repo_id}@{revision} was not found at {where}.")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return HubError(f"{where} refused the request for {repo_id} ({status}): pass a token "
                        "with write access (HF_TOKEN or --token).")
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return HubError(f"The request for {repo_id}@{revision or 'main'} to {where} failed: {first_line}")


@contextlib.contextmanager
def _translated(repo_id: str, repo_type: str, revision: str | None,
                endpoint: str | None) -> Iterator[None]:
    """Turn whatever the Hub client raises (its typed errors, or the HTTP library's: requests in
    0.36, httpx in 2.x) into one :class:`HubError` sentence; cubepack's own errors pass through."""
    try:
        yield
    except CubepackError:
        raise
    except Exception as exc:  # noqa: BLE001 - every client failure becomes a HubError
        raise _hub_error(exc, repo_id, repo_type, revision, endpoint) from exc


@contextlib.contextmanager
def _client_settings(endpoint: str | None, *, xet: bool) -> Iterator[None]:
    """Settings huggingface_hub reads from module constants during ``create_commit``.

    - Xet: 2.x uploads through Xet whenever hf_xet is installed and fails (no LFS fallback)
      on an endpoint without it; we turn it off for endpoints that do not offer it.
    - 0.36 parses the returned commit URL against ``constants.ENDPOINT``, not the endpoint
      the call used.
    """
    from huggingface_hub import constants as hub_constants

    saved = (hub_constants.ENDPOINT, hub_constants.HF_HUB_DISABLE_XET)
    if endpoint:
        hub_constants.ENDPOINT = endpoint.rstrip("/")
    hub_constants.HF_HUB_DISABLE_XET = saved[1] or not xet
    try:
        yield
    finally:
        hub_constants.ENDPOINT, hub_constants.HF_HUB_DISABLE_XET = saved


def _xet_supported(api: Any, repo_id: str, repo_type: str, branch: str) -> bool:
    """Does the endpoint hand out Xet write tokens for this repo? (Only asked when hf_xet is
    installed, since otherwise the client never tries Xet.)"""
    try:
        import hf_xet  # noqa: F401
    except ImportError:
        return False
    from urllib.parse import quote

    from huggingface_hub.utils import build_hf_headers, get_session

    url = f"{api.endpoint}/api/{repo_type}s/{repo_id}/xet-write-token/{quote(branch, safe='')}"
    try:
        response = get_session().get(url, headers=build_hf_headers(token=api.token))
    except Exception:  # noqa: BLE001 - any failure means "do not use Xet"
        return False
    return response.status_code == 200


# --- push ---------------------------------------------------------------------------------------

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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def push(cube_dir: str | Path, repo_id: str, *, repo_type: str = "dataset", private: bool = False,
         revision: str | None = None, tag: str | None = None, commit_message: str | None = None,
         token: str | None = None, endpoint: str | None = None,
         progress: bool | None = None) -> PushResult:
    """Push a packed cube as exactly one commit (or none when nothing changed).

    The cube is verified first: an unpacked or failing cube is refused before any network
    call. Only files whose content differs from the branch head are uploaded; files the cube
    no longer has are deleted in the same commit.

    Raises:
        VerificationFailed: the cube does not verify.
        HubError: the endpoint refused or failed (one sentence: unknown repo, no token...).
    """
    if repo_type not in REPO_TYPES:
        raise CubepackError(f"--repo-type must be one of {', '.join(REPO_TYPES)}, not {repo_type!r}.")
    cube = Path(cube_dir)
    report = verify(cube, progress=progress)
    local = _local_files(cube, report)
    branch = revision or "main"
    api = _api(endpoint, token)
    with _translated(repo_id, repo_type, branch, endpoint):
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        if branch != "main":
            api.create_branch(repo_id, repo_type=repo_type, branch=branch, exist_ok=True)
        info = api.repo_info(repo_id, repo_type=repo_type, revision=branch, files_metadata=True)
        head = info.sha
        remote = {sibling.rfilename: sibling for sibling in info.siblings or []}
        additions, deletions = _plan(cube, local, remote)
        if additions or deletions:
            commit = _commit(api, repo_id, repo_type, branch, head, additions, deletions,
                             commit_message or f"cubepack push (lock {report.lock['digest'][:12]})",
                             endpoint)
            sha, url = commit.oid, commit.commit_url
        else:
            sha, url = head, None
        if tag:
            _tag(api, repo_id, repo_type, tag, sha)
    return PushResult(repo_id=repo_id, repo_type=repo_type, branch=branch, commit_sha=sha,
                      commit_url=url, changed=bool(additions or deletions),
                      uploaded=sorted(p for p, _ in additions), deleted=sorted(deletions), tag=tag)


def _local_files(cube: Path, report: VerifyReport) -> dict[str, str]:
    """path -> sha256 of everything a push sends: the locked files, the lock, a signature."""
    from .hashing import sha256_file

    files = {path: entry["sha256"] for path, entry in report.lock["files"].items()}
    for extra in (constants.LOCK_FILENAME, constants.SIGNATURE_FILENAME):
        if (cube / extra).is_file():
            files[extra] = sha256_file(cube / extra)
    return files


def _plan(cube: Path, local: dict[str, str], remote: dict[str, Any]) -> tuple[list[tuple[str, Path]], list[str]]:
    additions = []
    for path, sha256 in sorted(local.items()):
        sibling = remote.get(path)
        if sibling is not None and _same_content(cube / path, sha256, sibling):
            continue
        additions.append((path, cube / path))
    deletions = sorted(p for p in remote if p not in local and p != ".gitattributes")
    return additions, deletions


def _same_content(path: Path, sha256: str, sibling: Any) -> bool:
    lfs = getattr(sibling, "lfs", None)
    if lfs is not None:
        remote_sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        return remote_sha == sha256
    blob_id = getattr(sibling, "blob_id", None)
    if blob_id is None or sibling.size != path.stat().st_size:
        return False
    return blob_id == git_blob_oid(path.read_bytes())


def _commit(api: Any, repo_id: str, repo_type: str, branch: str, head: str,
            additions: list[tuple[str, Path]], deletions: list[str], message: str,
            endpoint: str | None) -> Any:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local))
                  for path, local in additions]
    operations += [CommitOperationDelete(path_in_repo=path) for path in deletions]
    with _client_settings(endpoint or api.endpoint,
                          xet=_xet_supported(api, repo_id, repo_type, branch)):
        return api.create_commit(repo_id, operations=operations, commit_message=message,
                                 repo_type=repo_type, revision=branch, parent_commit=head)


def _tag(api: Any, repo_id: str, repo_type: str, tag: str, sha: str) -> None:
    refs = api.list_repo_refs(repo_id, repo_type=repo_type)
    existing = {ref.name: ref.target_commit for ref in refs.tags}
    if tag in existing:
        if existing[tag] != sha:
            raise HubError(f"Tag {tag!r} of {repo_id} already points at {existing[tag]}, not "
                           f"{sha}; tags are immutable pins, choose a new tag.")
        return
    api.create_tag(repo_id, tag=tag, revision=sha, repo_type=repo_type)


# --- pull ---------------------------------------------------------------------------------------

@dataclass
class PullResult:
    repo_id: str
    repo_type: str
    revision: str | None
    commit_sha: str
    local_dir: Path
    report: VerifyReport | None

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "repo_type": self.repo_type, "revision": self.revision,
                "commit_sha": self.commit_sha, "local_dir": str(self.local_dir),
                "verified": self.report is not None and self.report.ok,
                "report": self.report.to_dict() if self.report else None}


def pull(repo: str, *, revision: str | None = None, repo_type: str = "dataset",
         local_dir: str | Path | None = None, verify_cube: bool = True, model: Any = None,
         offline: bool | None = None, token: str | None = None, endpoint: str | None = None,
         cache_dir: str | Path | None = None, progress: bool | None = None,
         trusted_keys: list[Any] | None = None, require_signature: bool = False) -> PullResult:
    """Pull exactly one commit of a cube repo, verify it, then place it at ``local_dir``.

    ``repo`` may carry the revision (``owner/name@rev``). The revision is resolved to its
    40-hex commit first; that commit is downloaded (offline: served from the HF cache) and
    verified against its lock, with the pinned model checked too (the given ``model``, the
    pinned revision in the HF cache, or the Hub's file metadata). ``local_dir`` changes only
    when everything passed: a failed or interrupted pull leaves it as it was.

    Raises:
        HubError: unknown repo or revision, no token, download failure, offline cache miss.
        VerificationFailed: the downloaded commit does not match its lock or pins.
    """
    from huggingface_hub import constants as hub_constants

    repo_id, wanted = parse_repo_spec(repo, revision)
    offline = bool(offline or constants.hub_offline() or hub_constants.HF_HUB_OFFLINE)
    sha = resolve_revision(repo_id, wanted, repo_type=repo_type, offline=offline, token=token,
                           endpoint=endpoint, cache_dir=cache_dir)
    snapshot, hashed = _download(repo_id, sha, repo_type=repo_type, offline=offline, token=token,
                                 endpoint=endpoint, cache_dir=cache_dir)
    target = Path(local_dir) if local_dir else Path.cwd() / repo_id.split("/")[1]
    staging = _atomic.staging_dir(target, "pull")
    try:
        _materialize(snapshot, staging)
        report = None
        if not verify_cube and (trusted_keys or require_signature):
            raise CubepackError("--no-verify cannot be combined with a signature requirement.")
        if verify_cube:
            report = verify(staging, model=model, progress=progress, raise_on_failure=False,
                            hashed=hashed, trusted_keys=trusted_keys,
                            require_signature=require_signature)
            if not offline and model is None:
                _add_remote_model_checks(report, endpoint=endpoint, token=token)
            report.cube_dir = Path(f"{repo_id}@{sha}")
            if not report.ok:
                raise VerificationFailed(report)
            report.cube_dir = target
        _atomic.replace_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PullResult(repo_id=repo_id, repo_type=repo_type, revision=wanted, commit_sha=sha,
                      local_dir=target, report=report)


def resolve_revision(repo_id: str, revision: str | None, *, repo_type: str = "dataset",
                     offline: bool = False, token: str | None = None, endpoint: str | None = None,
                     cache_dir: str | Path | None = None) -> str:
    """A branch, tag or commit -> the 40-hex commit it names now (offline: from the cache)."""
    wanted = revision or "main"
    if offline:
        if _COMMIT.match(wanted):
            return wanted
        ref = _cache_repo_dir(repo_id, repo_type, cache_dir) / "refs" / wanted
        if ref.is_file():
            return ref.read_text().strip()
        raise HubError(f"Offline, {repo_id}@{wanted} cannot be resolved: the HF cache has no ref "
                       f"named {wanted!r} for this {repo_type} repo (it was never pulled by that "
                       "name). Pull by commit SHA, or go online.")
    api = _api(endpoint, token)
    with _translated(repo_id, repo_type, wanted, endpoint):
        return api.repo_info(repo_id, repo_type=repo_type, revision=wanted).sha


def _cache_repo_dir(repo_id: str, repo_type: str, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import constants as hub_constants

    root = Path(cache_dir or hub_constants.HF_HUB_CACHE)
    return root / f"{repo_type}s--{repo_id.replace('/', '--')}"


def _download(repo_id: str, sha: str, *, repo_type: str, offline: bool, token: str | None,
              endpoint: str | None, cache_dir: str | Path | None) -> tuple[Path, dict[str, str]]:
    """Download commit ``sha`` into the HF cache; return (snapshot folder, {path: sha256}).

    Online, each file is hashed by the worker that downloaded it, right after its download
    completes (the bytes are still in the page cache), so verification overlaps the network
    instead of following it. Offline, the snapshot is served from the cache (zero requests)
    and hashed later by verify.
    """
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import hf_hub_download, snapshot_download

    from .hashing import sha256_file

    if offline:
        try:
            return Path(snapshot_download(repo_id, repo_type=repo_type, revision=sha,
                                          cache_dir=cache_dir, local_files_only=True)), {}
        except Exception as exc:  # noqa: BLE001 - see _translated
            raise HubError(f"Offline, commit {sha} of the {repo_type} repo {repo_id} is not in "
                           f"the HF cache ({_cache_repo_dir(repo_id, repo_type, cache_dir)}); "
                           "pull it once online.") from exc

    def fetch(path: str) -> tuple[str, Path, str]:
        local = Path(hf_hub_download(repo_id, path, repo_type=repo_type, revision=sha, token=token,
                                     endpoint=endpoint, cache_dir=cache_dir))
        return path, local, sha256_file(local)

    with _translated(repo_id, repo_type, sha, endpoint):
        tree = _api(endpoint, token).list_repo_tree(repo_id, repo_type=repo_type, revision=sha,
                                                     recursive=True)
        paths = sorted(entry.path for entry in tree if hasattr(entry, "size") and
                       not hasattr(entry, "tree_id"))
        with ThreadPoolExecutor(_DOWNLOAD_WORKERS, thread_name_prefix="cubepack-pull") as pool:
            results = list(pool.map(fetch, paths))
    if not results:
        raise HubError(f"Commit {sha} of {repo_id} holds no files.")
    first_path, first_local, _ = results[0]
    snapshot = first_local
    for _ in first_path.split("/"):
        snapshot = snapshot.parent
    return snapshot, {path: digest for path, _, digest in results}


def _materialize(snapshot: Path, staging: Path) -> None:
    """Copy a cache snapshot (symlinks into blobs) to real files: hard links where possible."""
    for directory, _, files in os.walk(snapshot):
        for name in files:
            source = Path(directory) / name
            relative = source.relative_to(snapshot)
            real = Path(os.path.realpath(source))
            _atomic.link_or_copy(real, staging / relative)


# --- pinned models checked against Hub metadata -------------------------------------------------

def remote_model_checks(lock: dict[str, Any], *, endpoint: str | None = None,
                        token: str | None = None) -> list[tuple[str, str, bool, str, Any, Any]]:
    """Check each strict pin against the Hub's metadata at its pinned revision, downloading no
    weights: the weights digest from the per-file LFS sha256, and tokenizer and geometry from
    the (small) ``tokenizer.json`` and ``config.json``. Returns (check, subject, ok, detail,
    expected, found) rows."""
    from huggingface_hub import hf_hub_download

    from .fingerprints import (digest_of_file_hashes, geometry_from_config,
                               select_weight_names, tokenizer_digest_from_json)

    rows = []
    api = _api(endpoint, token)
    for role, pin in sorted(lock["models"].items()):
        if not pin.get("strict") or not pin.get("identity"):
            continue
        subject = f"{role} ({pin.get('repo_id') or 'local folder'}@{pin.get('revision')})"
        if not pin.get("repo_id") or not pin.get("revision"):
            rows.append(("remote model", subject, None, "skipped: pinned by weights digest only "
                         "(no Hub revision to check)", None, None))
            continue
        pinned = ModelIdentity.from_dict(pin["identity"])
        repo_id, sha = pin["repo_id"], pin["revision"]
        try:
            info = api.model_info(repo_id, revision=sha, files_metadata=True)
        except Exception as exc:  # noqa: BLE001 - see _translated
            error = _hub_error(exc, repo_id, "model", sha, endpoint)
            from huggingface_hub.errors import RevisionNotFoundError

            if isinstance(exc, RevisionNotFoundError):
                error = HubError(f"The pinned revision {sha} of {repo_id} no longer exists on the "
                                 "Hub (was its history rewritten or squashed?); the cube cannot be "
                                 "checked against its producer.")
            rows.append(("remote model", subject, False, str(error), sha, None))
            continue
        siblings = {s.rfilename: s for s in info.siblings or []}
        entries, missing = [], []
        for name in select_weight_names(list(siblings)):
            lfs = siblings[name].lfs
            sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) \
                if lfs is not None else None
            if sha256 is None:
                missing.append(name)
            else:
                entries.append((name, sha256))
        if missing:
            rows.append(("remote model", subject, False, "weight files without an LFS sha256 on "
                         f"the Hub cannot be checked without downloading them: {missing}", None, None))
            continue
        problems = []
        found_digest = digest_of_file_hashes(entries)
        if found_digest != pinned.weights_digest:
            problems.append(("weights_digest", pinned.weights_digest, found_digest))
        try:
            if "tokenizer.json" in siblings:
                text = Path(hf_hub_download(repo_id, "tokenizer.json", revision=sha, token=token,
                                            endpoint=endpoint)).read_text(encoding="utf-8")
                found = tokenizer_digest_from_json(text)
                if found != pinned.tokenizer_digest:
                    problems.append(("tokenizer_digest", pinned.tokenizer_digest, found))
            config = json.loads(Path(hf_hub_download(repo_id, "config.json", revision=sha,
                                                     token=token, endpoint=endpoint)).read_text())
        except Exception as exc:  # noqa: BLE001 - see _translated
            rows.append(("remote model", subject, False,
                         str(_hub_error(exc, repo_id, "model", sha, endpoint)), None, None))
            continue
        problems += [(m.field, m.expected, m.found)
                     for m in compare_geometry(pinned.geometry, geometry_from_config(config))]
        for key, expected, found in problems:
            rows.append(("remote model", f"{subject} {key}", False,
                         "the Hub's files at the pinned revision differ from the pin", expected, found))
        if not problems:
            rows.append(("remote model", subject, True, "weights (LFS sha256), tokenizer and "
                         "geometry at the pinned revision match the pin", None, None))
    return rows


def _add_remote_model_checks(report: VerifyReport, *, endpoint: str | None,
                             token: str | None) -> None:
    """Check against Hub metadata the pins whose local model check was skipped (not cached)."""
    if report.lock is None:
        return
    skipped = {c.subject.split(" ")[0] for c in report.checks
               if c.name == "model identity" and c.ok is None}
    models = {role: pin for role, pin in report.lock["models"].items() if role in skipped}
    for row in remote_model_checks({**report.lock, "models": models}, endpoint=endpoint,
                                   token=token):
        report.add(*row)
