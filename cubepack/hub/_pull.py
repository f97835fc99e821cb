"""``cubepack pull``: one exact commit, downloaded, verified, then placed.

A branch or tag is resolved to its 40-hex commit first; that commit is downloaded into a
staging folder beside the target, each byte once, as ``hf download --local-dir`` does
(huggingface_hub's local-dir mode; nothing goes into the HF cache), each file hashed there as
it arrives, verified against its lock, and only then swapped into the target folder. An
earlier pull at the target is updated: its unchanged files are linked into the staging folder
and hashed, not downloaded (:mod:`._localdir`); offline, the commit comes from the target's
own earlier pull of it, or the HF cache. The pulled folder is its user's to edit: it shares no
inode with the cache or another pull. A pull never replaces files it would lose.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from .._util import atomic, budget, canonical, constants
from .._util.checks import Catalogue
from .._util.hashing import hash_files, sha256_file
from .._util.options import Options
from .._util.paths import check_no_collisions, check_relpath, resolve_inside
from .._util.quiet import terminal_bars
from .._util.revision import check_ref_name, is_commit, looks_like_commit
from ..errors import CubepackError, HubError, UnsafeInputError, UsageError, VerificationFailed
from ..format import _lock as lockfile
from ..format._fileset import ORIGIN_FILE, is_bookkeeping, is_hf_record, is_tolerated
from ..ops import verify
from ..ops._seam import is_private, require_checked_models
from ..trust._lineage import record_pull
from ..trust._policy import TrustPolicy
from ..trust._report import VerifyReport
from . import _localdir, _partial
from ._client import HubClient, cache_repo_dir, lfs_sha256, offline_requested, parse_repo_spec
from ._history import add_history_check, add_skipped
from ._remote import remote_model_checks

logger = logging.getLogger("cubepack")

#: Parallel downloads in ``pull``. Four, not snapshot_download's 8: on 2 cores bench/pull.py
#: measured less CPU, and less time, with 4.
_DOWNLOAD_WORKERS = 4
#: Threads hashing what arrived (or what an earlier pull left), apart from the downloads: a
#: download thread that hashed its own file would leave the link idle meanwhile.
_HASH_WORKERS = min(4, os.cpu_count() or 2)


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
                "partial": self.report.partial if self.report is not None else None,
                "report": self.report.to_dict() if self.report else None}


@dataclass(frozen=True)
class PullOptions(Options):
    """Which commit ``pull`` takes, from where, and where it places it (``cubepack.pull``'s
    keyword arguments besides a trust policy's fields; see its docstring for each)."""

    VERB: ClassVar[str] = "pull"

    revision: str | None = None
    repo_type: str = "dataset"
    local_dir: str | Path | None = None
    verify_cube: bool = True
    offline: bool | None = None
    token: str | None = None
    endpoint: str | None = None
    cache_dir: str | Path | None = None
    progress: bool | None = None
    force: bool = False
    timeout: float | None = None
    decrypt_with: str | os.PathLike[str] | None = None
    #: memory ids, cube paths or fnmatch patterns of either: a partial cube of those memories
    #: (:mod:`._partial`); empty: the whole cube
    include: tuple[str, ...] = ()


@terminal_bars
def pull(repo: str, policy: TrustPolicy | None = None, options: PullOptions | None = None,
         **fields: Any) -> PullResult:
    """Pull exactly one commit of a cube repo, verify it, then place it at ``local_dir``.

    ``options`` (a ``PullOptions``: ``revision``, ``local_dir``, ``force``, ``timeout``...)
    may be given as ``fields`` too, set over it. ``repo`` may carry the revision
    (``owner/name@rev``). The revision is resolved to its
    40-hex commit first; that commit is downloaded (offline: served from the HF cache) and
    verified against its lock and ``policy`` (a :class:`~cubepack.trust.TrustPolicy`, or its
    fields among ``fields``), with the pinned model checked too (the policy's ``model``, the
    pinned revision in the HF cache, or the Hub's file metadata; a pinned model the endpoint
    does not host is reported as unverified unless ``strict_models``). ``local_dir`` changes
    only when everything passed: a failed or interrupted pull leaves it as it was.

    ``local_dir`` (default ``./<repo name>``; a link to a folder: the folder it names, the link
    left as it is) must be absent, empty, or an earlier pull of this repo in which no file was
    changed or added since (its origin record lists each file it placed); anything else is
    refused before any download, and again before placing, naming the files that would be
    lost, unless ``force``. Even with ``force``, a folder that holds
    the current directory or the home folder, or that is, holds or sits inside the HF cache or
    ``$CUBEPACK_CACHE``, is never replaced.

    ``decrypt_with``: an identity file opening a private cube: after its ciphertexts verify,
    it is decrypted in memory (never the target, the HF cache or TMPDIR, which hold only
    ciphertexts) and verified as the clear cube it is.

    ``timeout`` (seconds; default ``CUBEPACK_HUB_TIMEOUT`` or 3600) bounds everything the pull
    asks of the endpoint, however slowly it answers; on expiry nothing is placed, the requests
    in flight are aborted and the error names what was slow.

    Raises:
        HubError: unknown repo or revision, no token, download failure, offline cache miss, the
            deadline passed.
        VerificationFailed: the downloaded commit does not match its lock or pins.
        UsageError: a folder the pull would lose files from, a bad repo id, revision or timeout.

    Returns:
        a ``PullResult``: the repo, the revision asked and the commit it resolved to, the
        folder it placed, and the verification report of what was placed.

    Example:
        ```python
        result = cubepack.pull("org/my-cube", revision="v1", model="org/model-a")
        print(result.commit_sha, result.local_dir)
        ```
    """
    options, rest = PullOptions.take(options, fields)
    return _pull(repo, TrustPolicy.build(policy, **rest), options)


def _pull(repo: str, policy: TrustPolicy, options: PullOptions) -> PullResult:
    revision, repo_type, local_dir = options.revision, options.repo_type, options.local_dir
    verify_cube, offline, token = options.verify_cube, options.offline, options.token
    endpoint, cache_dir, progress = options.endpoint, options.cache_dir, options.progress
    force, timeout, decrypt_with = options.force, options.timeout, options.decrypt_with
    include = (options.include,) if isinstance(options.include, str) else tuple(options.include)
    if include and offline:
        raise UsageError("--include fetches the memories asked for from the endpoint; offline, "
                         "pull the whole cube (drop --include).")
    policy.require_honoured("pull")
    repo_id, wanted = parse_repo_spec(repo, revision)
    policy.require_pinned(wanted, f"{repo_id}@{wanted or 'main'}", "Name the 40-hex commit "
                          f"(cubepack pull {repo_id}@<commit>), as `cubepack push` prints it.")
    if not verify_cube and policy.asked():
        raise UsageError(f"--no-verify cannot be combined with what must be verified "
                         f"({', '.join(sorted(policy.asked()))}); drop one or the other.")
    offline = offline_requested(offline)
    seconds = constants.hub_timeout(timeout)
    given = Path(local_dir) if local_dir else Path.cwd() / repo_id.split("/")[1]
    # A link to a folder is the folder it names: staged beside that one (on its file system)
    # and swapped there, the link left naming it. Swapping the link itself would put the cube
    # on the link's disk and leave the link beside it, named as a staging folder.
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    check_target(target, repo_id, repo_type, force=force, cache_dir=cache_dir)
    client = HubClient(endpoint, token, timeout=seconds, action=f"pull of {repo_id}",
                       outcome=f"Nothing was placed: {target} is as it was.",
                       cached=f"{target} or the HF cache")
    sha = resolve_revision(repo_id, wanted, repo_type=repo_type, offline=offline, client=client,
                           cache_dir=cache_dir)
    with atomic.placing(target, elsewhere="pass another --local-dir", cache_dir=cache_dir):
        staging = atomic.staging_dir(target, "pull")
        try:
            # Each file is downloaded into the staging folder (or linked there from an earlier
            # pull at the target) and hashed there: the digests verify trusts are of the very
            # bytes placed, and each byte is on disk once.
            snapshot, placed, hashed, reused = _download(
                client, repo_id, sha, repo_type=repo_type, offline=offline, cache_dir=cache_dir,
                lock_first=verify_cube, staging=staging, target=target, include=include)
            # The download took a while: what the target holds now is what must not be lost.
            # The files linked from it were hashed just now: their digests stand while their
            # stat keys do.
            check_target(target, repo_id, repo_type, force=force, cache_dir=cache_dir,
                          fresh={name: (key, hashed[name]) for name, key in reused.items()})
            report = None
            if verify_cube:
                # The deadline covers the checks too: a cube slow to check cannot outlive it.
                with budget.bounded(client.deadline.check if client.deadline
                                    else lambda step: None):
                    # The pin was applied above; strict models below, once the Hub's
                    # metadata has checked what the HF cache did not hold.
                    report = verify(staging, policy.without(Catalogue.MODEL_IDENTITY)
                                    .honoured_by("verify"),
                                    progress=progress, raise_on_failure=False, hashed=hashed,
                                    decrypt_with=decrypt_with)
                strict = policy.asks(Catalogue.MODEL_IDENTITY)
                if not offline and policy.model_given() is None:
                    _add_remote_model_checks(report, client, strict)
                if offline:
                    add_skipped(report, "offline, the endpoint's history was not walked")
                else:
                    add_history_check(report, client, repo_id, repo_type,
                                      policy.trusted(), cache_dir=cache_dir)
                if strict and report.intact:
                    require_checked_models(report)
                if report.lock is not None and is_private(report.lock):
                    report.group_scopes()
                report.cube_dir = Path(f"{repo_id}@{sha}")
                if not report.ok:
                    # A fix a check wrote names the folder verify was given: pull's staging
                    # folder, removed with this refusal. Name what the user can act on.
                    for check in report.failures:
                        if str(staging) in check.detail:
                            check.detail = (check.detail.replace(str(staging), str(target))
                                            + f" (nothing was placed at {target}: pull it "
                                            "first without the requirement that failed)")
                    _evict_corrupt_files(report, snapshot)
                    raise VerificationFailed(report)
                report.cube_dir = target
            placed += _localdir.bookkeeping_files(staging)
            _write_origin(staging, repo_id, repo_type, sha,
                          _placed_digests(staging, placed, hashed, report))
            _record_pull(staging, repo_id, repo_type, sha)
            if wanted and not is_commit(wanted) and not offline:
                # The one thing a pull writes in the HF cache: what a later offline pull by
                # this name resolves. Before placing: a cache that cannot take it fails the
                # pull whole, naming the setting that moves the cache.
                _record_ref(repo_id, repo_type, wanted, sha, cache_dir)
            atomic.replace_dir(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return PullResult(repo_id=repo_id, repo_type=repo_type, revision=wanted, commit_sha=sha,
                      local_dir=given, report=report)


def check_target(target: Path, repo_id: str, repo_type: str, *, force: bool,
                 cache_dir: str | Path | None = None,
                 fresh: dict[str, tuple[list[str], str]] | None = None) -> None:
    """Refuse a ``--local-dir`` whose files a pull would lose (see :func:`pull`).

    Never (not even with ``force``): a folder that is or holds the current directory or the
    home folder, nor one that is, holds or sits inside the HF cache or ``$CUBEPACK_CACHE``.
    Without ``force``: anything but an absent or empty folder, or an earlier pull of this repo
    whose every file is as that pull placed it (files removed since lose nothing: allowed).
    ``fresh``: {path: (stat key, sha256)} of files this process hashed just now, which stand
    for a file whose stat key is still that one.
    """
    resolved = target.resolve()
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"--local-dir {target} exists and is not a folder.")
    for path, what in ((Path.cwd().resolve(), "the current directory"),
                       (Path.home().resolve(), "your home folder")):
        if path == resolved or resolved in path.parents:
            raise UsageError(f"Refusing to replace {target}: it holds {what}. Pull into a new "
                             "folder (--local-dir).")
    managed = constants.cubes_dir().expanduser().resolve()
    for path, what in _caches(cache_dir):
        if managed in resolved.parents and (path == managed or path in managed.parents):
            continue  # cubepack's own folder of pulled cubes (the MemOS hook's)
        if path == resolved or resolved in path.parents or path in resolved.parents:
            where = "holds" if resolved in path.parents else "is" if path == resolved else \
                "is inside"
            raise UsageError(f"Refusing to pull into {target}: it {where} {what} ({path}), "
                             "whose files other pulls and models rely on. Pull into a new "
                             "folder (--local-dir).")
    if not resolved.exists() or force or not any(resolved.iterdir()):
        return
    kept, why = _files_a_pull_would_lose(resolved, repo_id, repo_type, fresh or {})
    if kept:
        shown = ", ".join(kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
        raise UsageError(f"--local-dir {target} {why} ({shown}); pulling would replace them. "
                         "Pull into an empty or new folder, or pass --force to replace them.")


def _caches(cache_dir: str | Path | None) -> list[tuple[Path, str]]:
    """The caches a pull must never replace or write into: the HF cache (the one this pull uses
    and huggingface_hub's own, with its HF_HOME holding the token) and cubepack's."""
    from huggingface_hub import constants as hub_constants

    caches = [(Path(hub_constants.HF_HUB_CACHE), "HF_HUB_CACHE, the Hugging Face cache"),
              (Path(hub_constants.HF_HOME), "HF_HOME, the Hugging Face home"),
              (constants.cache_dir(), "CUBEPACK_CACHE, cubepack's cache")]
    if cache_dir is not None:
        caches.insert(0, (Path(cache_dir), "the Hugging Face cache this pull uses"))
    return [(path.expanduser().resolve(), what) for path, what in caches]


def _files_a_pull_would_lose(folder: Path, repo_id: str, repo_type: str,
                             fresh: dict[str, tuple[list[str], str]]) -> tuple[list[str], str]:
    """The files of ``folder`` a pull would lose, and why (for the message): everything, when
    it is not an earlier pull of this repo or its record cannot prove its files unchanged;
    else each file changed or added since that pull (its record is the one exempt file)."""
    names, empty_folders, unreadable = _entries(folder)
    everything = sorted((set(names) - {ORIGIN_FILE}) | set(empty_folders) | set(unreadable),
                        key=_shown_first)
    try:
        origin = _read_origin(folder / ORIGIN_FILE)
    except (OSError, ValueError):
        origin = None
    if not isinstance(origin, dict) or (origin.get("repo_id"), origin.get("repo_type")) != \
            (repo_id, repo_type):
        return everything, f"already holds files that are not an earlier pull of {repo_id}"
    record = _placed_files(origin)
    if record is None:
        return everything, ("was pulled by an older cubepack, whose record cannot prove its "
                            "files unchanged")
    changed = [f"{name} (unreadable)" for name in unreadable]
    to_hash: list[str] = []
    for name in names:
        if name == ORIGIN_FILE or is_hf_record(name):
            continue  # huggingface_hub's records (hf download on the folder): ours replace them
        entry = record.get(name)
        if entry is None:
            changed.append(f"{name} (added)")
            continue
        try:
            st = os.lstat(folder / name)
        except OSError:
            changed.append(f"{name} (unreadable)")
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
            changed.append(f"{name} (changed)")
        elif name in fresh and fresh[name][0] == _stat_key(st):
            if fresh[name][1] != entry["sha256"]:  # hashed by this pull, as it is now
                changed.append(f"{name} (changed)")
        elif _stat_key(st) != entry["stat"]:
            to_hash.append(name)  # touched, maybe edited: only its bytes can tell
    if to_hash:
        digests = hash_files([folder / name for name in to_hash], progress=False)
        changed += [f"{name} (changed)" for name in to_hash
                    if digests[folder / name] != record[name]["sha256"]]
    expected = {str(parent) for name in (*record, ORIGIN_FILE)
                for parent in PurePosixPath(name).parents}
    changed += [f"{name} (added)" for name in empty_folders if name.rstrip("/") not in expected]
    return sorted(changed, key=_shown_first), \
        f"holds files changed or added since it was pulled from {repo_id}"


def _shown_first(name: str) -> tuple[bool, str]:
    """A refusal names the cube's files before a download's bookkeeping."""
    return is_bookkeeping(name), name


def _entries(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """(every entry that is not a folder, every empty folder, every unreadable folder) below
    ``folder``, as relative POSIX paths; links are entries, never followed."""
    names: list[str] = []
    empty: list[str] = []
    unreadable: list[str] = []

    def failed(error: OSError) -> None:
        unreadable.append(Path(error.filename).relative_to(folder).as_posix() + "/")

    for directory, folders, files in os.walk(folder, onerror=failed):
        here = Path(directory)
        links = [name for name in folders if (here / name).is_symlink()]
        folders[:] = [name for name in folders if name not in links]
        entries = [*files, *links]
        relative = here.relative_to(folder)
        names += [(relative / name).as_posix() for name in entries]
        if not folders and not entries and here != folder:
            empty.append(relative.as_posix() + "/")
    return names, empty, unreadable


def _placed_files(origin: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The record of what a pull placed, or None when the origin holds none (older cubepack)
    or a malformed one: either way, nothing it says can prove a file unchanged."""
    placed = origin.get("files")  # the origin record's (what a pull placed), not the lock's
    if not isinstance(placed, dict):
        return None
    for record in placed.values():
        if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                and isinstance(record.get("size"), int)
                and isinstance(record.get("stat"), (list, type(None)))):
            return None
    return placed


def _stat_key(st: os.stat_result) -> list[str]:
    """(device, inode, size, mtime_ns, ctime_ns): a file with the same key has the same bytes
    (a user can set mtime back after an edit, but not ctime), as in the file-hash cache.
    Written as strings: nanosecond times exceed the +-2**53 integers strict JSON allows."""
    return [str(value) for value in (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                     st.st_ctime_ns)]


#: How long a record waits, at most, for the file system's clock to pass the files' ctimes.
_CLOCK_TICK_WAIT = 0.5


def _stat_keys(folder: Path, names: list[str]) -> dict[str, list[str] | None]:
    """Each file's stat key, recorded only once the file system's clock (one tick: a few ms)
    has moved past its ctime: an edit within the tick of the record would keep the same ctime
    (git's "racy clean" problem). A key that cannot be settled is None: always hashed."""
    keys = {name: _stat_key(os.lstat(resolve_inside(folder, name))) for name in names}
    newest = max((int(key[4]) for key in keys.values()), default=0)
    waited = 0.0
    while (now := _file_system_now(folder)) <= newest and waited < _CLOCK_TICK_WAIT:
        time.sleep(0.002)
        waited += 0.002
    return {name: key if int(key[4]) < now else None for name, key in keys.items()}


def _file_system_now(folder: Path) -> int:
    """The time the file system stamps a change with now (coarser than the system clock)."""
    with tempfile.TemporaryFile(dir=folder) as probe:
        return os.fstat(probe.fileno()).st_ctime_ns


def _write_origin(staging: Path, repo_id: str, repo_type: str, sha: str,
                  digests: dict[str, str]) -> None:
    """Record where a pulled folder came from and every file it placed (sha256, size, stat
    key), so a later pull can prove each file unchanged before replacing it."""
    keys = _stat_keys(staging, sorted(digests))
    files = {name: {"sha256": digests[name], "size": os.lstat(staging / name).st_size,
                    "stat": keys[name]} for name in sorted(digests)}
    atomic.write_text(staging / ORIGIN_FILE, canonical.dumps(
        {"repo_id": repo_id, "repo_type": repo_type, "commit_sha": sha, "files": files}))


def _record_pull(staging: Path, repo_id: str, repo_type: str, sha: str) -> None:
    """Record the pulled lock in cubepack's cache (:func:`~cubepack.trust._lineage.record_pull`),
    without which the folder's origin record never names a migrated cube's parent. A cache that
    cannot take it costs that link only, not the pull: said as a warning."""
    lock = staging / constants.LOCK_FILENAME
    if lock.is_symlink() or not lock.is_file():
        return  # not a cube (pulled unverified): no parent to name
    try:
        record_pull(repo_id, repo_type, sha, lock.read_bytes())
    except (CubepackError, OSError) as exc:
        logger.warning("cubepack: this pull of %s@%s could not be recorded in CUBEPACK_CACHE "
                       "(%s): a cube migrated from it will not name it as its parent.",
                       repo_id, sha, exc)


def _read_origin(path: Path) -> Any:
    return canonical.loads_strict(path.read_bytes())  # a cube may ship one: read it strictly


def _placed_digests(staging: Path, names: list[str], hashed: dict[str, str],
                    report: VerifyReport | None) -> dict[str, str]:
    """sha256 of every placed file: hashed as downloaded, else as verified against the lock,
    else hashed now (offline without verification, or files the lock does not list)."""
    locked = report.lock.files if report is not None and report.ok and report.lock else {}
    digests = {name: hashed.get(name) or (locked[name].sha256 if name in locked else None)
               for name in names if name != ORIGIN_FILE}
    missing = [name for name, digest in digests.items() if not digest]
    if missing:
        found = hash_files([resolve_inside(staging, name) for name in missing], progress=False)
        digests.update({name: found[resolve_inside(staging, name)] for name in missing})
    return digests


def _record_ref(repo_id: str, repo_type: str, name: str, sha: str,
                cache_dir: str | Path | None) -> None:
    """Remember ``name -> sha`` in the HF cache as huggingface_hub does (``refs/<name>``), so
    an offline pull by that name works afterwards."""
    check_ref_name(name)
    atomic.write_text(cache_repo_dir(repo_id, repo_type, cache_dir) / "refs" / name, sha)


def resolve_revision(repo_id: str, revision: str | None, *, repo_type: str = "dataset",
                     offline: bool = False, client: HubClient | None = None,
                     cache_dir: str | Path | None = None) -> str:
    """A branch, tag or commit -> the 40-hex commit it names now (offline: from the cache).

    A 40-hex revision must resolve to itself: a branch or tag *named* like a commit cannot
    stand in for it. Ref names are validated before they touch the file system.

    Raises:
        HubError: unknown revision, a shadowed commit id, an offline cache miss.
        UsageError: an upper-case commit id, an invalid ref name.
    """
    wanted = revision or "main"
    if looks_like_commit(wanted) and not is_commit(wanted):
        raise UsageError(f"Revision {wanted} looks like a commit id but is not lower-case hex; "
                       f"commit ids are written in lower case: use {wanted.lower()}.")
    if offline:
        if is_commit(wanted):
            return wanted
        return _cached_ref(repo_id, wanted, repo_type, cache_dir)
    client = client or HubClient(cached=True)
    with client.translated(repo_id, repo_type, wanted):
        sha = client.run(client.api.repo_info, repo_id, repo_type=repo_type, revision=wanted).sha
    if not is_commit(sha):
        raise HubError(f"{client.endpoint} answered {repo_id}@{wanted} with {sha!r}, which is not "
                       "a commit id.")
    if is_commit(wanted) and sha != wanted:
        raise HubError(f"{repo_id}@{wanted} resolved to commit {sha}: a branch or tag named like "
                       f"the commit {wanted} shadows it. Refusing to pull another commit than "
                       "the one asked for; ask the repo's owner to delete that ref.")
    return sha


def _cached_ref(repo_id: str, name: str, repo_type: str, cache_dir: str | Path | None) -> str:
    """The commit the HF cache recorded for branch or tag ``name`` (offline resolution)."""
    check_ref_name(name)
    ref = cache_repo_dir(repo_id, repo_type, cache_dir) / "refs" / name
    if not ref.is_file():
        raise HubError(f"Offline, {repo_id}@{name} cannot be resolved: the HF cache has no ref "
                       f"named {name!r} for this {repo_type} repo (it was never pulled by that "
                       "name). Pull by commit SHA, or go online.")
    with open(ref, "rb") as handle:
        sha = handle.read(64).decode("ascii", errors="replace").strip()
    if not is_commit(sha):  # never echo the file: it is not ours to print
        raise HubError(f"The HF cache's ref file {ref} does not hold a commit id; delete it and "
                       "pull online once.")
    return sha


def _download(client: HubClient, repo_id: str, sha: str, *, repo_type: str, offline: bool,
              cache_dir: str | Path | None, lock_first: bool, staging: Path,
              target: Path, include: tuple[str, ...] = ()
              ) -> tuple[Path, list[str], dict[str, str], dict[str, list[str]]]:
    """Put commit ``sha`` in ``staging``, each file once, as ``hf download --local-dir`` does.

    Returns (``<cache>/<repo>/snapshots/<sha>``, the paths placed, {path: sha256 of the
    placed file}, {path: stat key} of the files taken from ``target``). Every remote path is
    checked before anything is downloaded; with ``lock_first`` the lock is fetched and parsed
    first and files it does not list are refused before they are downloaded. A file an earlier
    pull at ``target`` claims to hold with the bytes wanted (the lock's sha256, else the Hub's
    LFS sha256) is linked into ``staging`` and hashed (:func:`._localdir.reuse`); any other is
    downloaded into ``staging`` in huggingface_hub's local-dir mode (never into the HF cache;
    it copies a file the HF cache already holds) and hashed there, overlapping the other
    downloads. Offline, see :func:`_from_disk`.
    """
    snapshot = cache_repo_dir(repo_id, repo_type, cache_dir) / "snapshots" / sha
    if offline:
        return _from_disk(repo_id, repo_type, sha, snapshot, staging, target, cache_dir)
    claimed = _localdir.claims(target, repo_id, repo_type)
    reused: dict[str, list[str]] = {}

    def fetch(path: str) -> str:
        local = client.download(repo_id, path, repo_type=repo_type, revision=sha,
                                cache_dir=cache_dir, local_dir=staging)
        _localdir.require_commit(staging, path, sha, local)
        return path

    def digest_of(path: str) -> str:
        return sha256_file(resolve_inside(staging, path))

    def fetch_all() -> tuple[list[str], dict[str, str]]:
        tree = client.api.list_repo_tree(repo_id, repo_type=repo_type, revision=sha,
                                         recursive=True)
        entries = {entry.path: entry for entry in tree if not hasattr(entry, "tree_id")}
        paths = sorted(entries)
        for path in paths:  # a hostile listing is refused before any download
            check_relpath(path)
        check_no_collisions(paths)
        if not paths:
            raise HubError(f"Commit {sha} of {repo_id} holds no files.")
        _refuse_bookkeeping(repo_id, sha, paths)
        hashed: dict[str, str] = {}
        lock = None
        if lock_first or include:
            if constants.LOCK_FILENAME in paths:
                hashed[constants.LOCK_FILENAME] = digest_of(fetch(constants.LOCK_FILENAME))
            lock = _refuse_unlisted(repo_id, sha, staging, paths)
        if include:  # a partial cube: the memories asked for, and what loading them needs
            return _partial.place(client, repo_id, repo_type, sha, lock, paths, include,
                                  staging, hashed), hashed

        def wanted(path: str) -> str | None:
            if lock is not None and path in lock.files:
                return lock.files[path].sha256
            return lfs_sha256(entries[path])

        todo = [path for path in paths if path not in hashed]
        with ThreadPoolExecutor(_DOWNLOAD_WORKERS, thread_name_prefix="cubepack-pull") as pool, \
                ThreadPoolExecutor(_HASH_WORKERS, thread_name_prefix="cubepack-hash") as hasher:
            # Each answer is a digest, or the future of one (a file handed on to be hashed, or
            # to be downloaded after all): followed to its digest below.
            # Hashing is bound to the deadline too: once it passed, no new file is started
            # (nor linked into the staging folder the failed pull removes).
            def download(path: str) -> Future[str]:
                return hasher.submit(client.bind(digest_of), fetch(path))

            def reuse(path: str) -> str | Future[Any]:
                found = _localdir.reuse(target, path, staging, wanted(path))
                if found is None:
                    return pool.submit(client.bind(download), path)
                entry = entries[path]
                _localdir.record(staging, path, sha, lfs_sha256(entry) or entry.blob_id)
                reused[path] = _stat_key(found[1])
                return found[0]

            answers = {path: hasher.submit(client.bind(reuse), path)
                       if wanted(path) is not None and claimed.get(path) == wanted(path)
                       else pool.submit(client.bind(download), path) for path in todo}
            try:
                for path, answer in answers.items():
                    while isinstance(answer, Future):
                        answer = answer.result()
                    hashed[path] = answer
            except BaseException:  # the pull failed: start nothing more
                pool.shutdown(wait=False, cancel_futures=True)
                hasher.shutdown(wait=False, cancel_futures=True)
                raise
        return paths, hashed

    with client.translated(repo_id, repo_type, sha):
        paths, hashed = client.run(fetch_all)
    return snapshot, paths, hashed, reused


def _from_disk(repo_id: str, repo_type: str, sha: str, snapshot: Path, staging: Path,
               target: Path, cache_dir: str | Path | None
               ) -> tuple[Path, list[str], dict[str, str], dict[str, list[str]]]:
    """Offline: commit ``sha`` from what is on disk, with zero requests. ``target`` first,
    when it is an earlier pull of that very commit (each file linked into ``staging`` and
    hashed); else, or for a file it no longer has, the HF cache (a copy of the cached file,
    hashed: what ``hf download`` without ``--local-dir`` put there). Verification decides."""
    from huggingface_hub import snapshot_download

    in_folder = _localdir.held(target, repo_id, repo_type, sha)
    try:
        found = Path(snapshot_download(repo_id, repo_type=repo_type, revision=sha,
                                       cache_dir=cache_dir, local_files_only=True))
        _require_snapshot(found, snapshot, ".")
        cached = list_cube_files_following_links(snapshot)
    except CubepackError:
        raise
    except Exception:  # noqa: BLE001 - a cache miss: the folder may still hold the commit
        cached = []
    fixes = (f"pull it online into {target} once (an offline pull into that folder is then "
             f"served from it), or put it in the HF cache with `hf download {repo_id} "
             f"--repo-type {repo_type} --revision {sha}`.")
    if not in_folder and not cached:
        raise HubError(f"Offline, commit {sha} of the {repo_type} repo {repo_id} is neither "
                       f"at {target} (an earlier pull of that commit) nor in the HF cache "
                       f"({snapshot.parent.parent}): {fixes}")
    reused: dict[str, list[str]] = {}

    def place(name: str) -> tuple[str, str | None]:
        if name in in_folder:
            found = _localdir.reuse(target, name, staging, None)
            if found is not None:
                reused[name] = _stat_key(found[1])
                return name, found[0]
        if name in cached:
            return name, _place(snapshot, name, staging)
        return name, None  # gone from both: verification names it

    if in_folder:
        _localdir.carry_records(target, staging, sha)
    names = sorted(set(in_folder) | set(cached))
    with ThreadPoolExecutor(_DOWNLOAD_WORKERS, thread_name_prefix="cubepack-place") as pool:
        placed = dict(pool.map(place, names))
    hashed = {name: digest for name, digest in placed.items() if digest is not None}
    _require_whole(staging, hashed, f"Offline, commit {sha} of the {repo_type} repo {repo_id} "
                   f"is only partly on disk (a file of it fetched alone, as search fetches its "
                   f"lock): {{}} neither at {target} nor in the HF cache "
                   f"({snapshot.parent.parent}): {fixes}")
    return snapshot, sorted(hashed), hashed, reused


def _require_whole(staging: Path, placed: dict[str, str], message: str) -> None:
    """Offline: the files the placed lock lists that nothing on disk held are a cache miss
    (``message``, its ``{}`` the files), not a cube that fails verification. A lock that does
    not parse is left to verification, which says so."""
    if constants.LOCK_FILENAME not in placed:
        return
    try:
        lock = lockfile.parse((staging / constants.LOCK_FILENAME).read_bytes())
    except (CubepackError, OSError):
        return
    missing = sorted(set(lock.files) - set(placed))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                          if len(missing) > 3 else "")
        raise HubError(message.format(f"{shown} {'is' if len(missing) == 1 else 'are'}"))


def _refuse_bookkeeping(repo_id: str, sha: str, paths: list[str]) -> None:
    """A commit holding a download's bookkeeping (``.cache/huggingface/``,
    ``.cache/cubepack/``) is refused before any download: its files would land where the
    pull keeps its own records, which nothing a cube holds may be."""
    planted = [path for path in paths if is_bookkeeping(path)]
    if planted:
        shown = ", ".join(planted[:3]) + (f" and {len(planted) - 3} more"
                                          if len(planted) > 3 else "")
        raise UnsafeInputError(f"Commit {sha} of {repo_id} holds {shown}: a download's own "
                               "bookkeeping, where this pull keeps its records. Refusing it "
                               "before any download; no cube holds such paths (push never "
                               "uploads them).")


def _require_snapshot(local: Path, snapshot: Path, path: str) -> None:
    """A snapshot served from the HF cache must be ``snapshots/<sha>``: the client names the
    snapshot folder after the commit the server said it served."""
    expected = snapshot / path if path != "." else snapshot
    if os.path.abspath(local) != os.path.abspath(expected):
        raise HubError(f"The HF cache served {path} from another commit than {snapshot.name} "
                       f"(it is in {local}); refusing it.")


def _refuse_unlisted(repo_id: str, sha: str, staging: Path, paths: list[str]) -> lockfile.Lock:
    """With the lock downloaded, refuse (before downloading them) files it does not list.
    Returns the parsed lock."""
    report = VerifyReport(Path(f"{repo_id}@{sha}"))
    lock_path = staging / constants.LOCK_FILENAME
    if constants.LOCK_FILENAME not in paths:
        report.add(Catalogue.LOCK, constants.LOCK_FILENAME, False,
                   "missing: this commit was not packed by cubepack (run `cubepack pack`)")
        raise VerificationFailed(report)
    try:
        lock = lockfile.parse(lock_path.read_bytes())
    except CubepackError as exc:
        report.add(Catalogue.LOCK, constants.LOCK_FILENAME, False, str(exc))
        raise VerificationFailed(report) from None
    unlisted = sorted(name for name in set(paths) - set(lock.files) if not is_tolerated(name))
    for name in unlisted:
        report.add(Catalogue.FILE_SET, name, False,
                   "not listed in the lock; refused before download",
                   "absent", "present")
    if unlisted:
        raise VerificationFailed(report)
    return lock


def _place(snapshot: Path, name: str, staging: Path) -> str:
    """Copy the cached file ``name`` of ``snapshot`` (a symlink into the repo's blobs) to
    ``staging`` as a file of its own, and return the sha256 of the copy (read back from the
    copy just written: the digest is of the bytes placed, whatever the cache holds later)."""
    blobs = os.path.realpath(snapshot.parent.parent / "blobs")
    real = os.path.realpath(resolve_inside(snapshot, name))
    if os.path.commonpath([real, blobs]) != blobs:
        raise UnsafeInputError(f"{snapshot / name} resolves outside its repo's blobs "
                               f"({real}); refusing it.")
    destination = resolve_inside(staging, name)
    atomic.clone_file(Path(real), destination)
    return sha256_file(destination)


def list_cube_files_following_links(snapshot: Path) -> list[str]:
    """The relative file paths of an HF-cache snapshot (whose files are symlinks)."""
    names = []
    for directory, _, files in os.walk(snapshot):
        for name in files:
            names.append(check_relpath((Path(directory) / name).relative_to(snapshot).as_posix()))
    return sorted(names)


def _evict_corrupt_files(report: VerifyReport, snapshot: Path) -> None:
    """Remove from the HF cache the blobs whose bytes failed the lock, so a retry downloads
    them again (the client would otherwise copy them again: it checks only sizes)."""
    for check in report.failures:
        if check.name not in (Catalogue.SHA256, Catalogue.SIZE):
            continue
        link = snapshot / check.subject
        if not os.path.lexists(link):
            continue  # downloaded, not copied from the HF cache: gone with the staging folder
        try:
            blob = Path(os.path.realpath(link))
            if blob.parent.name == "blobs":
                blob.unlink(missing_ok=True)
            link.unlink(missing_ok=True)
        except OSError:
            continue
        check.detail += "; removed from the HF cache, so a retry downloads it again"


def _add_remote_model_checks(report: VerifyReport, client: HubClient, strict: bool) -> None:
    """Check against Hub metadata the pins whose local model check was skipped (not cached)."""
    if report.lock is None:
        return
    skipped = {c.role for c in report.checks if c.name == Catalogue.MODEL_IDENTITY and c.ok is None}
    models = {role: pin for role, pin in report.lock.models.items() if role in skipped}
    report.extend(client.run(remote_model_checks, models, client, strict=strict))
