"""Which repo holds which blob: the rule that lets a shared blob store serve several users.

Blobs are stored once by sha256 for every repo (``blobs/<sha256>``), but a repo reads only what
it holds. A blob is a repo's when

* a commit of the repo names it (its *history*: every stored commit, reachable or not), or
* it was uploaded for the repo (``repos/.../uploads/<sha256>``, an empty file written once the
  bytes of an upload signed for that repo arrived and hashed to their oid).

A commit may name an LFS object only if it is the repo's, or if the committer can read another
repo whose history holds it (:meth:`Objects.linkable`); anything else is refused in the words
of an object never uploaded, so a refusal says nothing about other repos. The LFS batch answers
by the repo's own objects alone.

Blobs no commit of any repo names, and no upload record, are removed (:meth:`Objects.collect`
when a repo is deleted; :func:`collect_garbage`, ``cubepack hub gc``, for a whole root). An
upload record older than :data:`UPLOAD_GRACE` belongs to a push that was abandoned, and is
removed first. Removal is safe while the server runs, even from another process: it holds the
root's lock exclusively (:class:`RootLock`: ``flock`` on ``blobs/.lock``, and a threads' lock),
while every step that places a blob or a commit naming one, or moves a repo's folder, holds it
shared, so a collection sees either the whole step or none of it (a move between two of its
listings would hide the repo from both). A blob still being uploaded is a temp file, which a
collection never touches.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # POSIX: the lock holds across processes (``cubepack hub gc`` beside a running server)
    import fcntl
except ImportError:  # pragma: no cover - Windows: threads of one process only
    fcntl = None  # type: ignore[assignment]

from ..errors import UsageError
from ._ids import REPO_TYPES, RepoRef, is_repo_id

#: Seconds an upload record keeps its blob without a commit naming it: a push uploads, then
#: commits within minutes; a day later it was abandoned.
UPLOAD_GRACE = 24 * 3600.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
UPLOADS = "uploads"
#: Seconds a delete waits for a moment without commits and uploads to remove the blobs only
#: the deleted repo held; beyond it, a thread removes them at the first such moment.
COLLECT_WAIT = 2.0


class RootLock:
    """Shared for the steps that place blobs and commits, exclusive for a collection: a
    readers-writer lock between the threads of this process, and ``flock`` on
    ``blobs/.lock`` between processes (each holder opens its own descriptor, so the lock also
    orders threads of one process)."""

    def __init__(self, root: Path):
        self._path = root / "blobs" / ".lock"
        self._guard = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._guard:
            self._guard.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            with self._flock(exclusive=False):
                yield
        finally:
            with self._guard:
                self._readers -= 1
                self._guard.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._guard:
            self._guard.wait_for(lambda: not self._writer)
            self._writer = True  # no new reader starts; the ones running finish
            self._guard.wait_for(lambda: self._readers == 0)
        try:
            with self._flock(exclusive=True):
                yield
        finally:
            with self._guard:
                self._writer = False
                self._guard.notify_all()

    @contextlib.contextmanager
    def idle(self, timeout: float | None) -> Iterator[bool]:
        """Exclusive, but taken only once no holder runs, without stopping new ones meanwhile
        (``exclusive`` lets no new holder in while it waits: behind one long commit, every
        commit and upload of the endpoint waited). Yields False, holding nothing, when no
        moment without holders came within ``timeout`` seconds (None: wait for one)."""
        with self._guard:
            if not self._guard.wait_for(lambda: not self._writer and self._readers == 0,
                                        timeout):
                got = False
            else:
                self._writer = got = True
        if not got:
            yield False
            return
        try:
            with self._flock(exclusive=True):
                yield True
        finally:
            with self._guard:
                self._writer = False
                self._guard.notify_all()

    @contextlib.contextmanager
    def _flock(self, exclusive: bool) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            _unlock(fd)


class ServeLock:
    """The claim of the one process that serves a root: ``flock`` held exclusively on
    ``server.lock`` for as long as it serves, the file naming its pid. Each server keeps the
    root's holdings in memory and removes the temp files of uploads at start, so a second one
    would take the first's uploads in progress for a killed server's leftovers; it is refused
    instead, naming the first. The kernel releases the lock when its process ends, however it
    ends, so a killed server never blocks the next."""

    def __init__(self, root: Path):
        self.path = root / "server.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Claim the root, or raise :class:`~cubepack.errors.UsageError` naming the pid that
        serves it."""
        if fcntl is None:  # pragma: no cover - Windows: no claim (one server, by convention)
            return
        try:  # never through a symlink: a planted one once had the pid overwrite its target
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise self._not_ours(f"it cannot be opened as a file of the root ({exc.strerror})") \
                from None
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            os.close(fd)  # a hard link reaches another file as a symlink does
            raise self._not_ours("it is not a regular file of its own (a link count of "
                                 f"{status.st_nlink})" if stat.S_ISREG(status.st_mode)
                                 else "it is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise UsageError(
                f"{self.path.parent} is already served by another `cubepack hub serve` "
                f"({f'pid {holder}' if holder.isdigit() else 'another process'}): one process "
                "serves a root. Stop it first, or serve another folder (--root).") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _not_ours(self, why: str) -> UsageError:
        return UsageError(f"{self.path} is not the endpoint's lock file: {why} (a symlink, a "
                          "hard link or anything but a regular file is refused, never written "
                          "through). "
                          "Remove it, then serve the root again.")

    def release(self) -> None:
        if self._fd is not None:
            _unlock(self._fd)  # the file stays (the next claim reuses it)
            self._fd = None


def _unlock(fd: int) -> None:
    """Release a ``flock`` and close its descriptor. Explicitly: the lock belongs to the open
    file description, which a child forked meanwhile shares (O_CLOEXEC closes it on exec
    only), so closing this process's descriptor alone once left the root claimed by a worker
    that serves nothing."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def repo_folders(root: Path) -> Iterator[tuple[RepoRef, Path]]:
    """Every repo of a root and its folder (a stray folder that names no repo is skipped)."""
    for holder, folder in holding_folders(root):
        if isinstance(holder, RepoRef):
            yield holder, folder


def holding_folders(root: Path) -> Iterator[tuple[RepoRef | Path, Path]]:
    """Every folder of a root whose commits and upload records hold blobs, and who holds them:
    its repo, or the folder itself when the client refuses its id (not served, but what it
    holds is kept: a rule that tightened loses no data). The one list of holders: a
    collection, of a whole root or after a delete, counts every one of them."""
    for kind, namespace, name, folder in _stored(root):
        yield (RepoRef(kind, namespace, name) if is_repo_id(namespace, name) else folder), folder


def unserved_folders(root: Path) -> list[Path]:
    """Repo folders whose id the client refuses (made before the endpoint followed its rule):
    not served, but what they hold is kept."""
    return [folder for holder, folder in holding_folders(root) if isinstance(holder, Path)]


def _stored(root: Path) -> Iterator[tuple[str, str, str, Path]]:
    for kind in REPO_TYPES:
        base = root / "repos" / kind
        for namespace in _listing(base):
            for name in _listing(base / namespace):
                folder = base / namespace / name
                if (folder / "repo.json").is_file():
                    yield kind, namespace, name, folder


def _listing(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []


def commit_oids(folder: Path) -> set[str]:
    """Every blob the stored commits of the repo at ``folder`` name."""
    found: set[str] = set()
    for path in (folder / "commits").glob("*.json"):
        with contextlib.suppress(FileNotFoundError):  # a repo deleted under a collection
            found.update(entry["sha256"] for entry in json.loads(path.read_text())["tree"].values())
    return found


def upload_records(folder: Path) -> list[Path]:
    """The upload records of the repo at ``folder``: one empty file per object, named by it."""
    base = folder / UPLOADS
    return [path for path in base.iterdir() if _SHA256.fullmatch(path.name)] \
        if base.is_dir() else []


@dataclass(frozen=True)
class Collected:
    """What a collection removed: ``removed`` blobs (``freed`` bytes), ``expired_uploads``
    records of abandoned pushes; ``kept`` blobs a repo holds."""

    removed: int
    freed: int
    expired_uploads: int
    kept: int

    def as_dict(self) -> dict[str, int]:
        return {"removed": self.removed, "freed": self.freed,
                "expired_uploads": self.expired_uploads, "kept": self.kept}


def collect_garbage(root: str | os.PathLike[str], *, lock: RootLock | None = None,
                    upload_grace: float = UPLOAD_GRACE) -> Collected:
    """Remove every blob of ``root`` that no commit of any repo names and no upload record
    younger than ``upload_grace`` seconds keeps, after removing the older records. Reads the
    folders themselves (not a server's memory), under the root's lock held exclusively: a
    running server's commits and uploads wait for it, and it for them."""
    root = Path(root)
    if not (root / "blobs").is_dir():
        return Collected(0, 0, 0, 0)
    with (lock or RootLock(root)).exclusive():
        referenced: set[str] = set()
        expired = 0
        now = time.time()
        for _, folder in holding_folders(root):  # served or not: nothing is lost
            referenced |= commit_oids(folder)
            for record in upload_records(folder):
                with contextlib.suppress(FileNotFoundError):
                    if now - record.stat().st_mtime > upload_grace:
                        record.unlink()
                        expired += 1
                    else:
                        referenced.add(record.name)
        removed = freed = kept = 0
        for blob in (root / "blobs").iterdir():
            if not _SHA256.fullmatch(blob.name):
                continue  # the lock, an upload in progress (a temp file)
            if blob.name in referenced:
                kept += 1
                continue
            with contextlib.suppress(FileNotFoundError):
                freed += blob.stat().st_size
                blob.unlink()
                removed += 1
        return Collected(removed, freed, expired, kept)


class Objects:
    """The holdings of a running store's repos: for each blob, the repos whose history names it
    and the repos it was uploaded for, built on first use from every folder that holds blobs
    (:func:`holding_folders`: unserved folders too, keyed by their path) and kept by this
    process's commits, uploads, moves and deletes (one process serves a root)."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = RootLock(root)
        self._guard = threading.Lock()
        self._history: dict[str, set[RepoRef | Path]] | None = None
        self._uploads: dict[str, set[RepoRef | Path]] = {}
        self._by_repo: dict[RepoRef | Path, set[str]] = {}
        self._pending: set[str] = set()  # deleted repos' blobs, not yet collected
        self._collector: threading.Thread | None = None
        self._closed = False

    def _index(self) -> dict[str, set[RepoRef | Path]]:
        """Caller holds ``_guard``."""
        if self._history is None:
            history: dict[str, set[RepoRef | Path]] = {}
            for holder, folder in holding_folders(self.root):
                oids = commit_oids(folder)
                self._by_repo[holder] = set(oids)
                for oid in oids:
                    history.setdefault(oid, set()).add(holder)
                for record in upload_records(folder):
                    self._uploads.setdefault(record.name, set()).add(holder)
            self._history = history
        return self._history

    def committed(self, repo: RepoRef, tree: dict[str, Any]) -> None:
        """A commit of ``repo`` with ``tree`` was written: its blobs are in the repo's history."""
        with self._guard:
            if self._history is None:
                return  # the first use reads the folders, this commit among them
            for entry in tree.values():
                self._history.setdefault(entry["sha256"], set()).add(repo)
                self._by_repo.setdefault(repo, set()).add(entry["sha256"])

    def uploaded(self, repo: RepoRef, folder: Path, oid: str) -> None:
        """Record (or refresh) that ``oid`` was uploaded for ``repo`` (its folder: ``folder``).
        Caller holds the root's lock shared and has checked that the repo exists."""
        record = folder / UPLOADS / oid
        record.parent.mkdir(exist_ok=True)
        record.touch()
        with self._guard:
            self._uploads.setdefault(oid, set()).add(repo)

    def holds(self, repo: RepoRef, folder: Path, oid: str) -> bool:
        """Whether ``oid`` is ``repo``'s: its history names it, or it was uploaded for it (the
        record is refreshed: a push that asked about it is in progress)."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.utime(folder / UPLOADS / oid)  # never creates one: a record or nothing
            return True
        with self._guard:
            return repo in self._index().get(oid, ())

    def linkable(self, repo: RepoRef, folder: Path, oid: str,
                 may_read: Callable[[RepoRef], bool]) -> bool:
        """Whether a commit to ``repo`` may name ``oid``: it is the repo's, or ``may_read``
        (the committer's reach) admits a repo whose history names it."""
        if self.holds(repo, folder, oid):
            return True
        with self._guard:
            others = list(self._index().get(oid, ()))
        return any(may_read(other) for other in others  # an unserved folder: nobody reads it
                   if other != repo and isinstance(other, RepoRef))

    @contextlib.contextmanager
    def moving(self, repo: RepoRef, target: RepoRef) -> Iterator[None]:
        """``repo``'s folder is renamed to ``target``'s in the body: the holdings are read
        first if not yet done, and the rename happens under their guard, then they are
        relabelled. A rename during the first read of the holdings once hid the repo from it
        (listed neither before, in its new namespace, nor after, in its old one), and a later
        delete removed the blobs only the moved repo still held. Caller holds the root's lock
        shared and both repos' locks."""
        with self._guard:
            self._index()
            yield
            self._moved(repo, target)

    def _moved(self, repo: RepoRef, target: RepoRef) -> None:
        """Caller holds ``_guard``, and the holdings are read."""
        self._by_repo[target] = self._by_repo.pop(repo, set())
        for index in (self._history or {}, self._uploads):
            for holders in index.values():
                if repo in holders:
                    holders.discard(repo)
                    holders.add(target)

    def ready(self) -> None:
        """Read the folders now if not yet done (before a repo's folder is removed)."""
        with self._guard:
            self._index()

    def forget(self, repo: RepoRef) -> set[str]:
        """``repo`` was deleted (after :meth:`ready`): drop it; return the blobs it held."""
        with self._guard:
            self._index()
            oids = self._by_repo.pop(repo, set())
            uploads = {oid for oid, holders in self._uploads.items() if repo in holders}
            for oid in oids:
                self._history.get(oid, set()).discard(repo)  # type: ignore[union-attr]
            for oid in uploads:
                self._uploads[oid].discard(repo)
            return oids | uploads

    def collect(self, candidates: Iterable[str], blob_path: Callable[[str], Path],
                wait: float = COLLECT_WAIT) -> int:
        """Remove each of ``candidates`` that no repo holds any more (after a delete), by this
        process's holdings, under the root's lock held exclusively; the number removed. The
        lock is taken only once no commit or upload holds it (:meth:`RootLock.idle`), so a
        delete never stops the endpoint's writes: when no such moment comes within ``wait``
        seconds, the candidates are left to a thread that removes them at the first one
        (returns 0)."""
        with self._guard:
            self._pending.update(candidates)
        with self.lock.idle(wait) as got:
            if got:
                return self._collect_pending(blob_path)
        self._collect_later(blob_path)
        return 0

    def _collect_pending(self, blob_path: Callable[[str], Path]) -> int:
        """Caller holds the root's lock exclusively."""
        removed = 0
        with self._guard:
            index = self._index()
            orphans = [oid for oid in self._pending
                       if not index.get(oid) and not self._uploads.get(oid)]
            self._pending.clear()
        for oid in orphans:
            with contextlib.suppress(FileNotFoundError):
                blob_path(oid).unlink()
                removed += 1
        return removed

    def _collect_later(self, blob_path: Callable[[str], Path]) -> None:
        with self._guard:
            if self._collector is not None and self._collector.is_alive():
                return  # it takes what is pending when it runs
            self._collector = threading.Thread(target=self._collect_when_idle,
                                               args=(blob_path,), daemon=True,
                                               name="cubepack-hub-collect")
            self._collector.start()

    def _collect_when_idle(self, blob_path: Callable[[str], Path]) -> None:
        try:
            while True:
                with self.lock.idle(COLLECT_WAIT) as got:
                    if got and not self._closed:
                        self._collect_pending(blob_path)
                with self._guard:
                    if not self._pending or self._closed:
                        self._collector = None
                        return
        except OSError:  # the root went away under a server being stopped: gc's to do
            with self._guard:
                self._collector = None

    def close(self) -> None:
        """The store stops serving: a collection still waiting never runs (another server may
        hold the root next, with holdings this process does not know)."""
        with self._guard:
            self._closed = True
