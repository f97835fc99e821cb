"""On-disk storage for the local Hub: repos, immutable commits, refs and content-addressed blobs.

Layout under the root folder::

    server.lock                                      held by the one process serving the root
    blobs/<sha256>                                   file contents, stored once for all repos
    repos/<models|datasets>/<ns>/<name>/repo.json    {"private": bool}
    repos/.../uploads/<sha256>                       an object uploaded for this repo
    repos/.../refs.json                              {"branches": {...}, "tags": {...},
                                                      "pulls": {"<N>": commit}}
    repos/.../commits/<40-hex>.json                  parents, title, message, date, tree
    repos/.../discussions.json                       discussions and pull requests, by number

A repo reads only the blobs it holds (its commits name them, or they were uploaded for it);
:mod:`._objects` owns that rule and the removal of blobs no repo holds.

A commit's tree maps each path to {sha256, size, git_oid, lfs}. Commits are never rewritten;
a branch move is a new ``refs.json``. Every write is a temp file renamed into place, under a
per-repo lock, so concurrent requests never see half a commit.

Reads stay O(1) in the size of a repo: parsed commits are kept in a per-process LRU keyed by
repo and commit id (commits are immutable, so an entry never goes stale), and repo names are
matched case-insensitively through an index built once and kept by the writes of this process.
One process serves a root: the per-repo locks are threads' locks.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.utils.sha import git_hash

from .._util import atomic, canonical
from .._util.revision import is_commit, new_ref_problem
from ._errors import StoreError, shown
from ._ids import (
    PR_REF,
    REPO_TYPES,
    RepoRef,
    Revision,
    is_sha256,
    parse_revision,
    repo_path,
    repo_ref,
)
from ._listing import MAX_CARD_BYTES, Listed, card_metadata
from ._objects import (
    UPLOAD_GRACE,
    Collected,
    Objects,
    ServeLock,
    collect_garbage,
    repo_folders,
    unserved_folders,
)

# Re-exported: callers and tests have imported these from the store since before _ids.
__all__ = ["PR_REF", "REPO_TYPES", "HubStore", "RepoRef", "StoreError", "repo_ref"]
#: Tree entries of parsed commits kept in memory, over every repo of the store (a 10,000-file
#: commit is 2.6 MB of JSON; parsing it for every download made a pull quadratic).
COMMIT_CACHE_ENTRIES = 250_000
#: Cards' parsed front matter kept in memory, by the sha256 of the README's blob (content
#: addressed: an entry never goes stale), for the list API, which reads every repo's card.
CARD_CACHE_ENTRIES = 10_000
#: The card the Hub reads a repo's metadata and tags from.
CARD_PATH = "README.md"
GITATTRIBUTES = (b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.bin filter=lfs diff=lfs merge=lfs -text\n")


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores for an LFS file (its git oid is the entry's oid)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class AddFile:
    """Commit operation: a regular (git) file with its bytes."""

    path: str
    content: bytes


@dataclass(frozen=True)
class AddLfsFile:
    """Commit operation: a file whose blob was uploaded through LFS (``size`` None: a copy,
    which names the oid only)."""

    path: str
    oid: str
    size: int | None = None


@dataclass(frozen=True)
class DeleteFile:
    """Commit operation: delete a file (or, named without its slash, a folder)."""

    path: str


@dataclass(frozen=True)
class DeleteFolder:
    """Commit operation: delete everything below a folder."""

    path: str


Operation = AddFile | AddLfsFile | DeleteFile | DeleteFolder


class _Node:
    """A folder (or file) of :class:`_Changing`'s index: its children by name, the file of its
    own path if there is one, and how many files are at or below it."""

    __slots__ = ("children", "file", "files")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.file = False
        self.files = 0


class _Changing:
    """A commit's tree while its operations apply: each costs what it changes. A folder delete
    once scanned every path of the tree (40,000 of them on 5,000 files: 2 x 10^8 prefix tests,
    under the repo's lock and the root's); the files below each folder are found through an
    index by path segment, built on the first operation that names a folder (linear in the
    tree's size, as the copy of the tree is) and kept by every later one."""

    def __init__(self, tree: dict[str, Any]):
        self.tree = tree
        self._root: _Node | None = None

    def _index(self) -> _Node:
        if self._root is None:
            self._root = _Node()
            for path in self.tree:
                self._mark(path)
        return self._root

    def _mark(self, path: str) -> None:
        node = self._root
        assert node is not None
        walked = [node]
        for part in path.split("/"):
            node = node.children.setdefault(part, _Node())
            walked.append(node)
        if not node.file:
            node.file = True
            for step in walked:
                step.files += 1

    def add(self, path: str, entry: dict[str, Any]) -> None:
        if path not in self.tree and self._root is not None:
            self._mark(path)
        self.tree[path] = entry

    def delete_file(self, path: str) -> bool:
        """Delete the file ``path``; False when there is none."""
        if self.tree.pop(path, None) is None:
            return False
        if self._root is not None:
            walked, node = [self._root], self._root
            for part in path.split("/"):
                node = node.children[part]
                walked.append(node)
            node.file = False
            for step in walked:
                step.files -= 1
        return True

    def delete_folder(self, path: str) -> int:
        """Delete every file below folder ``path``; how many there were."""
        walked, node = [self._index()], self._index()
        for part in path.split("/"):
            found = node.children.get(part)
            if found is None:
                return 0
            node = found
            walked.append(node)
        below = node.files - int(node.file)
        if not below:
            return 0
        todo = [(path, child, name) for name, child in node.children.items()]
        while todo:
            prefix, child, name = todo.pop()
            full = f"{prefix}/{name}"
            if child.file:
                del self.tree[full]
            todo.extend((full, grandchild, part) for part, grandchild in child.children.items())
        node.children = {}
        for step in walked:
            step.files -= below
        return below


def _folded(repo: RepoRef) -> tuple[str, str, str]:
    """The key the Hub matches repo ids by: ``NS/Cube`` is ``ns/cube``."""
    return repo.kind, repo.namespace.lower(), repo.name.lower()


class _CommitCache:
    """Parsed commits by (repo, commit id), least recently used first out, bounded by their
    tree entries in all. Entries are shared between requests: callers never mutate them."""

    def __init__(self, capacity: int):
        self._capacity, self._size = capacity, 0
        self._entries: OrderedDict[tuple[RepoRef, str], dict[str, Any]] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, key: tuple[RepoRef, str]) -> dict[str, Any] | None:
        with self._guard:
            record = self._entries.get(key)
            if record is not None:
                self._entries.move_to_end(key)
            return record

    def put(self, key: tuple[RepoRef, str], record: dict[str, Any]) -> None:
        weight = len(record["tree"]) + 1
        with self._guard:
            if key in self._entries:
                return
            self._entries[key] = record
            self._size += weight
            while self._size > self._capacity and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._size -= len(dropped["tree"]) + 1

    def forget(self, repo: RepoRef) -> None:
        """Drop a deleted or moved repo's commits."""
        with self._guard:
            for key in [key for key in self._entries if key[0] == repo]:
                self._size -= len(self._entries.pop(key)["tree"]) + 1


class HubStore:
    """Thread-safe repository storage under ``root``."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._commits = _CommitCache(COMMIT_CACHE_ENTRIES)
        self._index: dict[tuple[str, str, str], RepoRef] | None = None
        self._index_guard = threading.Lock()
        self._objects = Objects(self.root)
        self._moves_guard = threading.Lock()
        self._serving = ServeLock(self.root)
        self._cards: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._cards_guard = threading.Lock()

    def serve(self) -> None:
        """Claim the root for this process (:class:`._objects.ServeLock`: a second server on it
        is refused, naming the first), then remove the temp files of uploads a killed server
        left: nothing refers to them, and no other server is writing them."""
        self._serving.acquire()
        for leftover in (self.root / "blobs").glob(".*.tmp"):
            leftover.unlink(missing_ok=True)

    def close(self) -> None:
        """Give up the claim :meth:`serve` made (the next server may start); blobs a delete
        left to collect stay for ``hub gc`` (this process's holdings would soon be stale)."""
        self._objects.close()
        self._serving.release()

    def find(self, repo: RepoRef) -> RepoRef:
        """``repo`` as stored, matched case-insensitively as on the Hub (``NS/Cube`` is
        ``ns/cube``); ``repo`` itself when no such repo exists. One dictionary look-up: the
        folders are listed once, and this process's creates, moves and deletes keep the index."""
        with self._index_guard:
            if self._index is None:
                self._index = self._scan()
            return self._index.get(_folded(repo), repo)

    def repos(self, kind: str) -> list[RepoRef]:
        """Every repo of ``kind`` (``models`` or ``datasets``) served from the root."""
        with self._index_guard:
            if self._index is None:
                self._index = self._scan()
            return [repo for repo in self._index.values() if repo.kind == kind]

    def card(self, repo: RepoRef, commit_id: str) -> dict[str, Any]:
        """The YAML front matter of ``README.md`` at ``commit_id`` ({} without one): what the
        Hub reads a repo's tags and card data from."""
        entry = self.commit(repo, commit_id)["tree"].get(CARD_PATH)
        if entry is None or entry["size"] > MAX_CARD_BYTES:
            return {}
        with self._cards_guard:
            cached = self._cards.get(entry["sha256"])
            if cached is not None:
                self._cards.move_to_end(entry["sha256"])
                return cached
        metadata = card_metadata(self.blob_path(entry["sha256"]).read_bytes())
        with self._cards_guard:
            self._cards[entry["sha256"]] = metadata
            while len(self._cards) > CARD_CACHE_ENTRIES:
                self._cards.popitem(last=False)
        return metadata

    def listed(self, repo: RepoRef) -> Listed:
        """``repo`` as the list API answers it, at the head of ``main``."""
        head = self.resolve(repo, "main")
        commit = self.commit(repo, head)

        def created() -> str:
            return self.history(repo, head)[-1]["date"]

        def siblings() -> list[dict[str, Any]]:
            return [{"rfilename": path} for path in sorted(commit["tree"])]

        return Listed(repo=repo, private=self.is_private(repo), sha=head,
                      last_modified=commit["date"], created_at=created, siblings=siblings,
                      metadata=self.card(repo, head))

    def _scan(self) -> dict[tuple[str, str, str], RepoRef]:
        index = {}
        for repo, _ in repo_folders(self.root):  # never a stray folder
            index.setdefault(_folded(repo), repo)
        return index

    def _indexed(self, repo: RepoRef, present: bool) -> None:
        with self._index_guard:
            if self._index is None:
                return  # built from the folders on first use
            if present:
                self._index[_folded(repo)] = repo
            else:
                self._index.pop(_folded(repo), None)

    def delete(self, repo: RepoRef) -> None:
        """Delete ``repo`` (its commits, refs and upload records), then the blobs it held that
        no other repo holds."""
        with self._lock(repo):
            self._require(repo)
            self._objects.ready()  # its holdings are read before its folder goes
            shutil.rmtree(self._dir(repo))
            self._indexed(repo, False)
            self._commits.forget(repo)
            held = self._objects.forget(repo)
        self._objects.collect(held, self.blob_path)

    def collect_garbage(self, upload_grace: float = UPLOAD_GRACE) -> Collected:
        """Remove the blobs no repo holds (see :func:`._objects.collect_garbage`), safely while
        requests are served."""
        return collect_garbage(self.root, lock=self._objects.lock, upload_grace=upload_grace)

    def move(self, repo: RepoRef, target: RepoRef) -> None:
        """Rename ``repo`` to ``target``; 409 when ``target`` exists. Under the root's lock
        held shared, as a commit: a collection (``hub gc``) lists the repo folders under it held
        exclusively, and would otherwise list neither the old folder nor the new one."""
        with self._locked(repo, target), self._objects.lock.shared():
            self._require(repo)
            existing = self.find(target)
            if self.exists(existing) and existing != repo:
                raise StoreError(409, f"A {target.repo_type} repository called "
                                      f"{target.repo_id} already exists.")
            self._dir(target).parent.mkdir(parents=True, exist_ok=True)
            with self._objects.moving(repo, target):  # never during the holdings' first read
                os.replace(self._dir(repo), self._dir(target))
            self._indexed(repo, False)
            self._indexed(target, True)
            self._commits.forget(repo)
            self._record_move(repo, target)

    def moved_to(self, repo: RepoRef) -> RepoRef | None:
        """Where ``repo`` (no repo now) was moved, when a repo is there: its old id leads to
        it, as on the Hub."""
        with self._moves_guard:
            moves = self._moves()
        key = "/".join(_folded(repo))
        if key not in moves:
            return None
        target = self.find(RepoRef(*moves[key].split("/")))
        return target if self.exists(target) else None

    def _moves(self) -> dict[str, str]:
        path = self.root / "repos" / "moved.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def _forget_move(self, repo: RepoRef) -> None:
        """``repo``'s id is a repo now (created there): it leads nowhere else, then or later."""
        with self._moves_guard:
            moves = self._moves()
            if moves.pop("/".join(_folded(repo)), None) is not None:
                atomic.write_text(self.root / "repos" / "moved.json", canonical.dumps(moves))

    def _record_move(self, repo: RepoRef, target: RepoRef) -> None:
        """Caller holds both repos' locks: ``repo``'s old id now leads to ``target``, and so
        does every id that led to ``repo``; ``target``'s own id is a repo again."""
        new = "/".join((target.kind, target.namespace, target.name))
        with self._moves_guard:
            moves = self._moves()
            old = "/".join(_folded(repo))
            moves = {key: new if "/".join(_folded(RepoRef(*value.split("/")))) == old
                     else value for key, value in moves.items()}
            moves[old] = new
            moves.pop("/".join(_folded(target)), None)
            atomic.write_text(self.root / "repos" / "moved.json", canonical.dumps(moves))

    def set_private(self, repo: RepoRef, private: bool) -> None:
        with self._lock(repo):
            self._require(repo)
            atomic.write_text(self._dir(repo) / "repo.json", canonical.dumps({"private": private}))

    def last_commits(self, repo: RepoRef, revision: Revision | str) -> dict[str, dict[str, Any]]:
        """path -> the last commit (of ``revision``'s history) that changed that path; a folder
        (``a/b``) -> the last that changed anything below it."""
        history = self.history(repo, revision)
        found: dict[str, dict[str, Any]] = {}
        for record, parent in zip(history, history[1:] + [None]):
            before = parent["tree"] if parent else {}
            for path, entry in record["tree"].items():
                if path not in found and before.get(path) != entry:
                    found[path] = record
                    folder = path.rpartition("/")[0]
                    while folder and folder not in found:
                        found[folder] = record
                        folder = folder.rpartition("/")[0]
        return found

    # --- repos and refs --------------------------------------------------------------------------
    def _dir(self, repo: RepoRef) -> Path:
        return self.root / "repos" / repo.kind / repo.namespace / repo.name

    def _lock(self, repo: RepoRef) -> threading.Lock:
        """The repo's write lock, by its case-folded id: two creates of ``NS/Cube`` and
        ``ns/cube`` take the same lock, so only one repo is made."""
        with self._locks_guard:
            return self._locks.setdefault(_folded(repo), threading.Lock())

    @contextlib.contextmanager
    def _locked(self, *repos: RepoRef):
        """Several repos' locks, always taken in one order (no two moves deadlock)."""
        with contextlib.ExitStack() as stack:
            for key in sorted({_folded(repo) for repo in repos}):
                with self._locks_guard:
                    lock = self._locks.setdefault(key, threading.Lock())
                stack.enter_context(lock)
            yield

    def exists(self, repo: RepoRef) -> bool:
        return (self._dir(repo) / "repo.json").is_file()

    def is_private(self, repo: RepoRef) -> bool:
        return bool(json.loads((self._dir(repo) / "repo.json").read_text()).get("private"))

    def private_repos(self) -> list[RepoRef]:
        """Every private repo of the root."""
        return [repo for repo, _ in repo_folders(self.root) if self.is_private(repo)]

    def unserved(self) -> list[Path]:
        """Repo folders whose id the client refuses (made before the endpoint followed its
        rule): not served; ``cubepack hub gc`` keeps what they hold."""
        return unserved_folders(self.root)

    def create(self, repo: RepoRef, private: bool) -> bool:
        """Create ``repo`` with an initial commit holding ``.gitattributes``; False if it exists."""
        with self._lock(repo), self._objects.lock.shared():
            if self.exists(repo) or self.exists(self.find(repo)):
                return False
            folder = self._dir(repo)
            (folder / "commits").mkdir(parents=True, exist_ok=True)
            entry = self._store_blob(GITATTRIBUTES, lfs=False)
            commit = self._write_commit(repo, parents=[], tree={".gitattributes": entry},
                                        title="initial commit", message="")
            atomic.write_text(folder / "refs.json", canonical.dumps(
                {"branches": {"main": commit}, "tags": {}}))
            atomic.write_text(folder / "repo.json", canonical.dumps({"private": private}))
            self._indexed(repo, True)
            self._forget_move(repo)
            return True

    def refs(self, repo: RepoRef) -> dict[str, dict[str, str]]:
        """``branches``, ``tags`` and ``pulls`` (pull request number -> its head commit)."""
        self._require(repo)
        refs = json.loads((self._dir(repo) / "refs.json").read_text())
        refs.setdefault("pulls", {})  # stores written before pull requests
        return refs

    def resolve(self, repo: RepoRef, revision: Revision | str) -> str:
        """A branch, tag, pull request (``refs/pr/N``) or commit id of ``repo`` -> the 40-hex
        commit id. Names are looked up in the refs, never joined into a path; only a parsed
        commit id (or a hex prefix of one) reaches the commits folder."""
        revision = parse_revision(revision)
        refs = self.refs(repo)
        for group, name in revision.lookups:
            if name in refs[group]:
                return refs[group][name]
        if revision.pull is not None and str(revision.pull) in refs["pulls"]:
            return refs["pulls"][str(revision.pull)]
        if revision.commit is not None and self._commit_file(repo, revision.commit).is_file():
            return revision.commit
        if (prefix := revision.prefix) is not None:  # a unique prefix names a commit, as on the Hub
            matches = [entry.name[:-5] for entry in (self._dir(repo) / "commits").iterdir()
                       if entry.name.startswith(prefix) and entry.name.endswith(".json")]
            if len(matches) == 1:
                return matches[0]
        raise StoreError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def commit(self, repo: RepoRef, commit_id: str) -> dict[str, Any]:
        """The commit's record (parents, tree, title, message, date, id), parsed once per
        process: shared between requests, so never to be mutated."""
        record = self._commits.get((repo, commit_id))
        if record is None:
            record = self._load_commit(repo, commit_id)
            self._commits.put((repo, commit_id), record)
        return record

    def _load_commit(self, repo: RepoRef, commit_id: str) -> dict[str, Any]:
        return json.loads(self._commit_file(repo, commit_id).read_text())

    def _commit_file(self, repo: RepoRef, commit_id: str) -> Path:
        """Where commit ``commit_id`` of ``repo`` is stored. The one place a commit id becomes a
        path: anything but 40 lower-case hex is refused here, whoever passed it (a parent named
        ``../../../victim/secret/commits/<sha>`` once read another repo's commit)."""
        if not is_commit(commit_id):
            raise StoreError(400, f"Invalid commit id {shown(commit_id)}: a commit id is 40 "
                                  "lower-case hex digits.")
        return self._dir(repo) / "commits" / f"{commit_id}.json"

    def history(self, repo: RepoRef, revision: Revision | str) -> list[dict[str, Any]]:
        """The first-parent history of ``revision``, newest first."""
        commits, current = [], self.resolve(repo, revision)
        while current:
            record = self.commit(repo, current)
            commits.append(record)
            current = record["parents"][0] if record["parents"] else None
        return commits

    def create_ref(self, repo: RepoRef, kind: str, name: str, revision: Revision | str) -> None:
        """Create tag or branch ``name`` at ``revision``; 404 when the revision is not there
        (the Hub's first answer), 400 for a name git refuses, 409 when it exists."""
        with self._lock(repo):
            refs = self.refs(repo)
            target = self.resolve(repo, revision)
            if problem := new_ref_problem(name):  # git's rules, as the client checks them
                raise StoreError(400, f"Invalid {kind} name {shown(name)}: {problem}.")
            group = "tags" if kind == "tag" else "branches"
            if name in refs[group]:
                where = "tags" if kind == "tag" else "heads"
                raise StoreError(409, f"Reference refs/{where}/{name} already exists.")
            refs[group][name] = target
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))

    def delete_ref(self, repo: RepoRef, kind: str, name: str) -> None:
        if kind == "branch" and name == "main":
            raise StoreError(403, "Cannot delete refs/heads/main: it is the default branch.")
        with self._lock(repo):
            refs = self.refs(repo)
            group = "tags" if kind == "tag" else "branches"
            if refs[group].pop(name, None) is None:
                raise StoreError(404, f"Invalid rev id: {name}", "RevisionNotFound")
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))

    def _require(self, repo: RepoRef) -> None:
        if not self.exists(repo):
            raise StoreError(404, f"Repository {repo.repo_id} not found.", "RepoNotFound")

    # --- blobs -----------------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        """Where blob ``sha256`` is stored; anything but 64 lower-case hex is refused (400)."""
        if not is_sha256(sha256):
            raise StoreError(400, f"Invalid oid {shown(sha256)}: a sha256 is 64 lower-case hex "
                                  "digits.")
        return self.root / "blobs" / sha256

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.blob_path(sha256)
        return path.is_file() and (size is None or path.stat().st_size == size)

    def holds(self, repo: RepoRef, sha256: str, size: int) -> bool:
        """Whether ``repo`` holds blob ``sha256`` of ``size`` bytes (the LFS batch's question:
        another repo's blob is not this one's)."""
        with self._objects.lock.shared():
            return self.has_blob(sha256, size) and \
                self._objects.holds(repo, self._dir(repo), sha256)

    def put_blob(self, repo: RepoRef, sha256: str, size: int, chunks) -> None:
        """Store a blob uploaded for ``repo`` after checking its sha256 and size, and record
        that it was uploaded for ``repo``. The bytes go to a temp file of their own (kept even
        when the blob is stored already: a collection may remove that one meanwhile); it is
        placed, or dropped, under the root's lock."""
        target = self.blob_path(sha256)
        fd, name = tempfile.mkstemp(prefix=f".{sha256}.", suffix=".tmp", dir=target.parent)
        tmp = Path(name)
        try:
            digest, received = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as handle:
                for chunk in chunks:
                    digest.update(chunk)
                    received += len(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            if received != size or digest.hexdigest() != sha256:
                raise StoreError(400, f"Upload does not match its oid/size (got {received} "
                                      "bytes).")
            with self._lock(repo), self._objects.lock.shared():
                self._require(repo)  # deleted while the bytes arrived: recorded for nobody
                if not self.has_blob(sha256, size):
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, target)
                self._objects.uploaded(repo, self._dir(repo), sha256)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _store_blob(self, data: bytes, *, lfs: bool) -> dict[str, Any]:
        sha256 = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha256, len(data)):
            atomic.write_bytes(self.blob_path(sha256), data)
        return {"sha256": sha256, "size": len(data), "git_oid": git_hash(data), "lfs": lfs}

    # --- commits ---------------------------------------------------------------------------------
    def apply_commit(self, repo: RepoRef, revision: Revision | str, *, title: str, message: str,
                     parent: str | None, operations: list[Operation],
                     author: str = "", may_read: Callable[[RepoRef], bool] | None = None) -> str:
        """Create a commit on branch ``revision``, or on open pull request ``refs/pr/N``, from
        ``operations``; return its id. An LFS operation may name only an object ``repo`` holds
        or one a repo that ``may_read`` admits holds in its history (None: no other repo).

        Raises 412 if ``parent`` is given and is not the head (someone pushed first).
        """
        revision = parse_revision(revision)
        if parent is not None and not is_commit(parent):
            raise StoreError(400, f"Invalid parent commit {shown(parent)}: a commit id is 40 "
                                  "lower-case hex digits.")
        with self._lock(repo), self._objects.lock.shared():
            refs = self.refs(repo)
            group, name = self._moving_ref(repo, refs, revision)
            head = refs[group][name]
            if parent and parent != head:
                raise StoreError(412, "The branch was updated since you opened this page. Please "
                                 f"refresh and try again. (parent {parent} is not the head of "
                                 f"{revision}, {head})")
            tree = dict(self.commit(repo, head)["tree"])
            changing = _Changing(tree)
            for operation in operations:
                self._apply(repo, changing, operation, may_read)
            commit = self._write_commit(repo, parents=[head], tree=tree, title=title, message=message)
            refs[group][name] = commit
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))
            if group == "pulls":
                self._add_event(repo, int(name), "commit", author,
                                {"subject": title, "oid": commit})
            return commit

    def _moving_ref(self, repo: RepoRef, refs: dict[str, Any],
                    revision: Revision) -> tuple[str, str]:
        """Where a commit to ``revision`` goes: ("branches", name) or ("pulls", "N") for an open
        pull request (a closed or merged one takes no commits, as on the Hub)."""
        if revision.pull is not None:
            number = str(revision.pull)
            if number not in refs["pulls"]:
                raise StoreError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            status = self.discussion(repo, int(number))["status"]
            if status != "open":
                raise StoreError(403, f"Pull request #{number} is {status}: it takes no commits "
                                      "(reopen it, or open a new one).")
            return "pulls", number
        branch = revision.branch
        if branch is None or branch not in refs["branches"]:
            raise StoreError(404, f"Branch {revision} not found.", "RevisionNotFound")
        return "branches", branch

    def open_pull_request(self, repo: RepoRef, base: Revision | str, *, title: str,
                          message: str, parent: str | None, operations: list[Operation],
                          author: str, may_read: Callable[[RepoRef], bool] | None = None
                          ) -> tuple[str, int]:
        """Propose ``operations`` to branch ``base``: a commit on top of ``parent`` (default:
        the head of ``base``), the new ref ``refs/pr/N`` pointing at it, and discussion N (its
        first comment is ``message``). ``base`` does not move until the request is merged.
        Returns (commit id, N); ``may_read`` as for :meth:`apply_commit`."""
        base = parse_revision(base)
        with self._lock(repo), self._objects.lock.shared():
            refs = self.refs(repo)
            branch = base.branch
            if branch is None or branch not in refs["branches"]:
                raise StoreError(404, f"A pull request targets a branch; {shown(str(base))} is "
                                      "none.", "RevisionNotFound")
            start = parent or refs["branches"][branch]
            # _commit_file refuses a parent that is not 40 hex: it names a file of this repo only.
            if not self._commit_file(repo, start).is_file():
                raise StoreError(404, f"Invalid rev id: {start}", "RevisionNotFound")
            tree = dict(self.commit(repo, start)["tree"])
            changing = _Changing(tree)
            for operation in operations:
                self._apply(repo, changing, operation, may_read)
            commit = self._write_commit(repo, parents=[start], tree=tree, title=title,
                                        message=message)
            number = self._new_discussion(repo, refs, title=title, description=message,
                                          author=author, base=branch, head=commit)
            self._add_event(repo, number, "commit", author, {"subject": title, "oid": commit})
            return commit, number

    # --- discussions and pull requests -----------------------------------------------------------
    def discussions(self, repo: RepoRef) -> list[dict[str, Any]]:
        """Every discussion and pull request of ``repo``, by number."""
        self._require(repo)
        path = self._dir(repo) / "discussions.json"
        return json.loads(path.read_text())["discussions"] if path.is_file() else []

    def discussion(self, repo: RepoRef, number: int) -> dict[str, Any]:
        found = [d for d in self.discussions(repo) if d["num"] == number]
        if not found:
            raise StoreError(404, f"Discussion #{number} of {repo.repo_id} not found.")
        return found[0]

    def create_discussion(self, repo: RepoRef, *, title: str, description: str, author: str,
                          pull_request: bool) -> int:
        """Open discussion N; a pull request gets ``refs/pr/N`` at the head of main."""
        with self._lock(repo):
            refs = self.refs(repo)
            return self._new_discussion(repo, refs, title=title, description=description,
                                        author=author, base="main" if pull_request else None,
                                        head=refs["branches"]["main"] if pull_request else None)

    def _new_discussion(self, repo: RepoRef, refs: dict[str, Any], *, title: str,
                        description: str, author: str, base: str | None,
                        head: str | None) -> int:
        """Caller holds the repo's lock. Pull requests and discussions share one numbering."""
        items = self.discussions(repo)
        number = max((d["num"] for d in items), default=0) + 1
        record: dict[str, Any] = {"num": number, "title": title, "author": author,
                                  "createdAt": _now(), "status": "open",
                                  "isPullRequest": base is not None, "events": []}
        if base is not None:
            record.update(base=base, mergeCommitId=None)
            refs["pulls"][str(number)] = head
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))
        record["events"].append(_event("comment", author, _comment(description)))
        self._save_discussions(repo, [*items, record])
        return number

    def _save_discussions(self, repo: RepoRef, items: list[dict[str, Any]]) -> None:
        atomic.write_text(self._dir(repo) / "discussions.json",
                          canonical.dumps({"discussions": items}))

    def _add_event(self, repo: RepoRef, number: int, kind: str, author: str,
                   data: dict[str, Any], change: dict[str, Any] | None = None) -> dict[str, Any]:
        """Caller holds the repo's lock: append an event to discussion ``number`` (and apply
        ``change`` to its record); return the event."""
        items = self.discussions(repo)
        record = next((d for d in items if d["num"] == number), None)
        if record is None:
            raise StoreError(404, f"Discussion #{number} of {repo.repo_id} not found.")
        event = _event(kind, author, data)
        record["events"].append(event)
        record.update(change or {})
        self._save_discussions(repo, items)
        return event

    def comment(self, repo: RepoRef, number: int, text: str, author: str) -> dict[str, Any]:
        with self._lock(repo):
            return self._add_event(repo, number, "comment", author, _comment(text))

    def rename(self, repo: RepoRef, number: int, title: str, author: str) -> dict[str, Any]:
        with self._lock(repo):
            old = self.discussion(repo, number)["title"]
            return self._add_event(repo, number, "title-change", author,
                                   {"from": old, "to": title}, {"title": title})

    def set_status(self, repo: RepoRef, number: int, status: str, author: str,
                   comment: str | None = None) -> dict[str, Any]:
        """Close or reopen discussion ``number`` (a merged pull request stays merged)."""
        if status not in ("open", "closed"):
            raise StoreError(400, f"A discussion is open or closed, not {status!r}.")
        with self._lock(repo):
            if self.discussion(repo, number)["status"] == "merged":
                raise StoreError(403, f"Pull request #{number} is merged.")
            if comment:
                self._add_event(repo, number, "comment", author, _comment(comment))
            return self._add_event(repo, number, "status-change", author, {"status": status},
                                   {"status": status})

    def edit_comment(self, repo: RepoRef, number: int, event_id: str, text: str) -> dict[str, Any]:
        with self._lock(repo):
            items = self.discussions(repo)
            for record in items:
                for event in record["events"] if record["num"] == number else ():
                    if event["id"] == event_id and event["type"] == "comment":
                        event["data"].update(edited=True, numEdits=event["data"]["numEdits"] + 1,
                                             latest={"raw": text, "html": text,
                                                     "updatedAt": _now()})
                        self._save_discussions(repo, items)
                        return event
        raise StoreError(404, f"Comment {event_id} of discussion #{number} not found.")

    def conflicts(self, repo: RepoRef, number: int) -> list[str]:
        """Files both an open pull request and its base branch changed since they parted."""
        record = self.discussion(repo, number)
        if not record["isPullRequest"] or record["status"] != "open":
            return []
        return self._merge(repo, record, self.refs(repo))[1]

    def merge(self, repo: RepoRef, number: int, author: str,
              comment: str | None = None) -> str:
        """Merge open pull request ``number`` into its base branch: a merge commit (parents:
        the branch head, the request's head) whose tree is the branch with the request's
        changes; 409 naming the files both sides changed. Returns the merge commit's id."""
        with self._lock(repo):
            record = self.discussion(repo, number)
            if not record["isPullRequest"]:
                raise StoreError(400, f"Discussion #{number} is not a pull request.")
            if record["status"] != "open":
                raise StoreError(403, f"Pull request #{number} is {record['status']}.")
            refs = self.refs(repo)
            tree, conflicting = self._merge(repo, record, refs)
            if conflicting:
                raise StoreError(409, f"Pull request #{number} conflicts with "
                                      f"{record['base']} in {', '.join(conflicting[:5])}.")
            base_head, head = refs["branches"][record["base"]], refs["pulls"][str(number)]
            commit = self._write_commit(repo, parents=[base_head, head], tree=tree,
                                        title=f"Merge pull request #{number}: {record['title']}",
                                        message=comment or "")
            refs["branches"][record["base"]] = commit
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))
            if comment:
                self._add_event(repo, number, "comment", author, _comment(comment))
            self._add_event(repo, number, "status-change", author, {"status": "merged"},
                            {"status": "merged", "mergeCommitId": commit})
            return commit

    def _merge(self, repo: RepoRef, record: dict[str, Any],
               refs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """(the base branch's tree with the request's changes, the conflicting paths): a
        three-way merge of trees from the last commit the two share."""
        if record["base"] not in refs["branches"]:
            raise StoreError(409, f"The base branch {record['base']} of pull request "
                                  f"#{record['num']} no longer exists.")
        ours = refs["branches"][record["base"]]
        shared = self._ancestors(repo, ours)
        fork = refs["pulls"][str(record["num"])]
        while fork not in shared:  # first-parent walk from the request's head
            parents = self.commit(repo, fork)["parents"]
            if not parents:
                break
            fork = parents[0]
        before = self.commit(repo, fork)["tree"] if fork in shared else {}
        theirs = self.commit(repo, refs["pulls"][str(record["num"])])["tree"]
        merged = dict(self.commit(repo, ours)["tree"])
        conflicting = []
        for path in sorted(set(before) | set(theirs)):
            if before.get(path) == theirs.get(path):
                continue  # the request left it alone
            if merged.get(path) not in (before.get(path), theirs.get(path)):
                conflicting.append(path)
            elif path in theirs:
                merged[path] = theirs[path]
            else:
                merged.pop(path, None)
        return merged, conflicting

    def _ancestors(self, repo: RepoRef, commit_id: str) -> set[str]:
        seen, todo = set(), [commit_id]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.commit(repo, current)["parents"])
        return seen

    def _apply(self, repo: RepoRef, tree: _Changing, operation: Operation,
               may_read: Callable[[RepoRef], bool] | None) -> None:
        """Caller holds the repo's lock and the root's lock shared."""
        path = operation.path
        if isinstance(operation, DeleteFolder):
            path = path.rstrip("/")  # the client names folders with a trailing slash
        repo_path(path)  # the edge checked it too; the store never trusts a caller with a path
        if isinstance(operation, AddFile):
            tree.add(path, self._store_blob(operation.content, lfs=False))
        elif isinstance(operation, AddLfsFile):
            oid = operation.oid
            # Never uploaded, or held only by repos the committer cannot read: one answer for
            # both, so a refusal tells nothing of other repos' objects.
            if not self.has_blob(oid, operation.size) or not self._objects.linkable(
                    repo, self._dir(repo), oid, may_read or (lambda other: False)):
                raise StoreError(400, f"LFS object {oid} for {path} was never uploaded.")
            size = self.blob_path(oid).stat().st_size  # a copy names the oid only
            pointer = lfs_pointer(oid, size)
            tree.add(path, {"sha256": oid, "size": size, "git_oid": git_hash(pointer),
                            "lfs": True, "pointer_size": len(pointer)})
        elif isinstance(operation, DeleteFile):
            if tree.delete_file(path):
                return  # a file (never also a folder), found in O(1)
            # A folder named without its slash: the Hub deletes it too.
            if not tree.delete_folder(path):
                raise StoreError(404, f"File {path} does not exist.", "EntryNotFound")
        elif isinstance(operation, DeleteFolder):
            tree.delete_folder(path)
        else:
            raise StoreError(400, f"Unknown commit operation {type(operation).__name__}.")

    def _write_commit(self, repo: RepoRef, *, parents: list[str], tree: dict[str, Any], title: str,
                      message: str) -> str:
        record = {"parents": parents, "tree": tree, "title": title, "message": message,
                  "date": _now(), "nonce": os.urandom(8).hex()}
        commit_id = hashlib.sha1(canonical.dumps(record, compact=True).encode()).hexdigest()
        record["id"] = commit_id
        atomic.write_text(self._commit_file(repo, commit_id), canonical.dumps(record))
        self._commits.put((repo, commit_id), record)  # the next requests ask for the new head
        self._objects.committed(repo, tree)
        return commit_id


def _now() -> str:
    """The time as the Hub writes it (milliseconds, UTC)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _event(kind: str, author: str, data: dict[str, Any]) -> dict[str, Any]:
    """A discussion event as the Hub serves it."""
    return {"id": os.urandom(12).hex(), "type": kind, "createdAt": _now(),
            "author": {"name": author}, "data": data}


def _comment(text: str) -> dict[str, Any]:
    return {"edited": False, "hidden": False, "numEdits": 0,
            "latest": {"raw": text, "html": text, "updatedAt": _now()}}
