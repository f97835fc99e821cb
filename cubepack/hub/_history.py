"""A private cube compared with the signed revisions in its repo's history on the endpoint.

The replay rule is :mod:`cubepack.trust._generation`'s; this module walks what only the Hub
holds: every commit of every branch of the repo (``list_repo_refs``, ``list_repo_commits``),
and for each its ``cubepack.lock`` and ``cubepack.intoto.json`` (two small files, through the
HF cache), so a revision signed by a trusted key with a higher generation than the one at hand
is found wherever it sits in the history. ``pull`` runs it on the commit it pulled, ``verify
--remote`` on a folder a pull placed (its origin record names the repo). A writer who rewrites
or squashes the history takes the newer revisions out of it: the check says so, and only what
this user has seen (the records the walk and every verify keep) still catches that.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._util import canonical, constants
from .._util.checks import Catalogue
from ..errors import HubError
from ..format import _lock as lockfile
from ..format._fileset import ORIGIN_FILE
from ..format.sections import Lock
from ..ops._seam import is_private
from ..trust import _generation as generations
from ..trust._evidence import PROVED
from ..trust._lineage import pulled_from
from ..trust._report import Check, VerifyReport
from ._client import REPO_TYPES, HubClient

#: Parallel downloads of the history's small files (as pull's, on 2 cores).
_WORKERS = 4


def add_history_check(report: VerifyReport, client: HubClient, repo_id: str, repo_type: str,
                      trusted: tuple[str, ...], *, cache_dir: str | Path | None = None) -> None:
    """Add the ``replay`` check against the history of ``repo_id`` on the endpoint to the
    report of a private cube (a clear cube: nothing), beside its check against what this user
    has seen. Nothing is downloaded when no generation of this cube can be compared."""
    lock = report.lock
    if lock is None or not is_private(lock) or not report.intact:
        return
    key = report.signed_by
    if generations.skip_reason(lock, key) is not None:
        check = generations.history_check(lock, key, [], walked=0, where=repo_id)
    else:
        check = client.run(_walk, client, repo_id, repo_type, lock, key, trusted, cache_dir)
    add_beside(report, check)


def add_skipped(report: VerifyReport, why: str) -> None:
    """The history check of a private cube that could not be walked, and why."""
    if report.lock is not None and is_private(report.lock) and report.intact:
        add_beside(report, Check(Catalogue.REPLAY, "history on the endpoint", None,
                                 f"skipped: {why}; {generations.SQUASH}"))


def add_beside(report: VerifyReport, check: Check) -> None:
    """``check`` among the public checks, after the other replay check."""
    check.scope = "public"
    names = [c.name for c in report.checks]
    at = len(names) - names[::-1].index(check.name) if check.name in names else len(names)
    report.checks.insert(at, check)


def _walk(client: HubClient, repo_id: str, repo_type: str, lock: Lock, key: str,
          trusted: tuple[str, ...], cache_dir: str | Path | None) -> Check:
    try:
        return _walked(client, repo_id, repo_type, lock, key, trusted, cache_dir)
    except HubError as exc:  # the deadline is client.run's, raised past this
        # A history that cannot be read hides what it holds: refused, never a pass.
        return Check(Catalogue.REPLAY, f"history of {repo_id} on {client.endpoint}", False,
                     f"the branches' history could not be walked: {exc} A folder pulled from "
                     "another endpoint is walked there: set HF_ENDPOINT to it.", basis=PROVED)


def _walked(client: HubClient, repo_id: str, repo_type: str, lock: Lock, key: str,
            trusted: tuple[str, ...], cache_dir: str | Path | None) -> Check:
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    api = client.api
    with client.translated(repo_id, repo_type, None):
        branches = sorted(ref.name for ref in api.list_repo_refs(repo_id,
                                                                 repo_type=repo_type).branches)
        commits: dict[str, None] = {}
        for branch in branches:
            for commit in api.list_repo_commits(repo_id, repo_type=repo_type, revision=branch):
                commits.setdefault(commit.commit_id)

        current, series = lockfile.generation(lock), lockfile.series(lock)

        def read(sha: str, name: str) -> bytes | None:
            try:
                return client.download(repo_id, name, repo_type=repo_type, revision=sha,
                                       cache_dir=cache_dir).read_bytes()
            except EntryNotFoundError as exc:  # not there: nothing signed in that commit
                if isinstance(exc, LocalEntryNotFoundError):  # 2.x: a failed download too
                    raise
                return None

        def fetch(sha: str) -> tuple[str, tuple[int, str] | None]:
            # The lock first: only a revision claiming a higher generation is worth its
            # attestation (two requests a commit, four for a candidate).
            lock_bytes = read(sha, constants.LOCK_FILENAME)
            claimed = generations.claimed_generation(lock_bytes or b"", series)
            if claimed is None or claimed <= current:
                return sha, None
            envelope = read(sha, constants.ATTESTATION_FILENAME)
            return sha, None if envelope is None else generations.signed_generation(
                lock_bytes, envelope, list(trusted), series)

        with ThreadPoolExecutor(_WORKERS, thread_name_prefix="cubepack-history") as pool:
            signed = list(pool.map(client.bind(fetch), commits))
    found = [(found[0], sha, found[1]) for sha, found in signed if found is not None]
    where = f"{repo_id} (branch{'es' if len(branches) != 1 else ''} {', '.join(branches)}) " \
            f"on {client.endpoint}"
    return generations.history_check(lock, key, found, walked=len(commits), where=where)


def pulled_repo(cube: Path) -> tuple[str, str] | None:
    """(repo id, repo type) a pull placed ``cube`` from, by its origin record, when this
    user's pull wrote that record and it names the lock the folder holds (a re-packed folder
    is not that commit's cube); else None (:func:`~cubepack.trust._lineage.pulled_from`)."""
    lock = cube / constants.LOCK_FILENAME
    if not lock.is_file():
        return None
    repo_id, _ = pulled_from(cube, lock.read_bytes())
    if repo_id is None:
        return None
    origin = canonical.loads_strict((cube / ORIGIN_FILE).read_bytes())
    repo_type = origin.get("repo_type")
    return repo_id, repo_type if repo_type in REPO_TYPES else "dataset"
