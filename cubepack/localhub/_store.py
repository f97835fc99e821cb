"""On-disk storage for the local Hub: repos, immutable commits, refs and content-addressed blobs.

Layout under the root folder::

    blobs/<sha256>                                   file contents, shared by all repos
    repos/<models|datasets>/<ns>/<name>/repo.json    {"private": bool}
    repos/.../refs.json                              {"branches": {...}, "tags": {...}}
    repos/.../commits/<40-hex>.json                  parents, title, message, date, tree

A commit's tree maps each path to {sha256, size, git_oid, lfs}. Commits are never rewritten;
a branch move is a new ``refs.json``. Every write is a temp file renamed into place, under a
per-repo lock, so concurrent requests never see half a commit.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.utils.sha import git_hash

from .._util import atomic, canonical
from .._util.paths import check_relpath
from .._util.revision import is_commit

REPO_TYPES = {"models": "model", "datasets": "dataset"}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,95}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHORT_SHA = re.compile(r"[0-9a-f]{7,39}")
GITATTRIBUTES = (b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.bin filter=lfs diff=lfs merge=lfs -text\n")


class StoreError(Exception):
    """A request the store refuses; carries the HTTP status and the Hub's X-Error-Code."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores for an LFS file (its git oid is the entry's oid)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class RepoRef:
    kind: str  # "models" or "datasets"
    namespace: str
    name: str

    @property
    def repo_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def repo_type(self) -> str:
        return REPO_TYPES[self.kind]


def _listing(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []


def repo_ref(kind: str, namespace: str, name: str) -> RepoRef:
    if kind not in REPO_TYPES or not _NAME.fullmatch(namespace or "") or not _NAME.fullmatch(name or ""):
        raise StoreError(404, f"Repository {namespace}/{name} not found.", "RepoNotFound")
    return RepoRef(kind, namespace, name)


class HubStore:
    """Thread-safe repository storage under ``root``."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self._locks: dict[RepoRef, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # Uploads interrupted by a killed server left their temp files: nothing refers to them.
        for leftover in (self.root / "blobs").glob(".*.tmp"):
            leftover.unlink(missing_ok=True)

    def find(self, repo: RepoRef) -> RepoRef:
        """``repo`` as stored, matched case-insensitively as on the Hub (``NS/Cube`` is
        ``ns/cube``); ``repo`` itself when no such repo exists."""
        base = self.root / "repos" / repo.kind
        for namespace in _listing(base):
            if namespace.lower() == repo.namespace.lower():
                for name in _listing(base / namespace):
                    if name.lower() == repo.name.lower():
                        return RepoRef(repo.kind, namespace, name)
        return repo

    def delete(self, repo: RepoRef) -> None:
        """Delete ``repo`` (its commits and refs; blobs stay, shared and content-addressed)."""
        with self._lock(repo):
            self._require(repo)
            shutil.rmtree(self._dir(repo))

    def move(self, repo: RepoRef, target: RepoRef) -> None:
        """Rename ``repo`` to ``target``; 409 when ``target`` exists."""
        with self._lock(repo):
            self._require(repo)
            if self.exists(self.find(target)):
                raise StoreError(409, f"A {target.repo_type} repository called "
                                      f"{target.repo_id} already exists.")
            self._dir(target).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._dir(repo), self._dir(target))

    def set_private(self, repo: RepoRef, private: bool) -> None:
        with self._lock(repo):
            self._require(repo)
            atomic.write_text(self._dir(repo) / "repo.json", canonical.dumps({"private": private}))

    def last_commits(self, repo: RepoRef, revision: str) -> dict[str, dict[str, Any]]:
        """path -> the last commit (of ``revision``'s history) that changed that path."""
        history = self.history(repo, revision)
        found: dict[str, dict[str, Any]] = {}
        for record, parent in zip(history, history[1:] + [None]):
            before = parent["tree"] if parent else {}
            for path, entry in record["tree"].items():
                if path not in found and before.get(path) != entry:
                    found[path] = record
        return found

    # --- repos and refs --------------------------------------------------------------------------
    def _dir(self, repo: RepoRef) -> Path:
        return self.root / "repos" / repo.kind / repo.namespace / repo.name

    def _lock(self, repo: RepoRef) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(repo, threading.Lock())

    def exists(self, repo: RepoRef) -> bool:
        return (self._dir(repo) / "repo.json").is_file()

    def is_private(self, repo: RepoRef) -> bool:
        return bool(json.loads((self._dir(repo) / "repo.json").read_text()).get("private"))

    def create(self, repo: RepoRef, private: bool) -> bool:
        """Create ``repo`` with an initial commit holding ``.gitattributes``; False if it exists."""
        with self._lock(repo):
            if self.exists(repo):
                return False
            folder = self._dir(repo)
            (folder / "commits").mkdir(parents=True, exist_ok=True)
            entry = self._store_blob(GITATTRIBUTES, lfs=False)
            commit = self._write_commit(repo, parents=[], tree={".gitattributes": entry},
                                        title="initial commit", message="")
            atomic.write_text(folder / "refs.json", canonical.dumps(
                {"branches": {"main": commit}, "tags": {}}))
            atomic.write_text(folder / "repo.json", canonical.dumps({"private": private}))
            return True

    def refs(self, repo: RepoRef) -> dict[str, dict[str, str]]:
        self._require(repo)
        return json.loads((self._dir(repo) / "refs.json").read_text())

    def resolve(self, repo: RepoRef, revision: str) -> str:
        """A branch, tag or commit id of ``repo`` -> the 40-hex commit id."""
        refs = self.refs(repo)
        for name in (revision, revision.removeprefix("refs/heads/"), revision.removeprefix("refs/tags/")):
            if name in refs["branches"]:
                return refs["branches"][name]
            if name in refs["tags"]:
                return refs["tags"][name]
        if is_commit(revision) and (self._dir(repo) / "commits" / f"{revision}.json").is_file():
            return revision
        if _SHORT_SHA.fullmatch(revision):  # a unique prefix names a commit, as on the Hub
            matches = [p.stem for p in (self._dir(repo) / "commits").glob(f"{revision}*.json")]
            if len(matches) == 1:
                return matches[0]
        raise StoreError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def commit(self, repo: RepoRef, commit_id: str) -> dict[str, Any]:
        return json.loads((self._dir(repo) / "commits" / f"{commit_id}.json").read_text())

    def history(self, repo: RepoRef, revision: str) -> list[dict[str, Any]]:
        commits, current = [], self.resolve(repo, revision)
        while current:
            record = self.commit(repo, current)
            commits.append(record)
            current = record["parents"][0] if record["parents"] else None
        return commits

    def create_ref(self, repo: RepoRef, kind: str, name: str, revision: str) -> None:
        """Create tag or branch ``name`` at ``revision``; 409 when it exists."""
        if not name or name.startswith("refs/") or any(c in name for c in " ~^:?*[\\"):
            raise StoreError(400, f"Invalid {kind} name {name!r}.")
        with self._lock(repo):
            refs = self.refs(repo)
            target = self.resolve(repo, revision)
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
        if not _SHA256.fullmatch(sha256):
            raise StoreError(400, "Invalid oid.")
        return self.root / "blobs" / sha256

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.blob_path(sha256)
        return path.is_file() and (size is None or path.stat().st_size == size)

    def put_blob(self, sha256: str, size: int, chunks) -> None:
        """Store an uploaded blob after checking its sha256 and size."""
        digest, received = hashlib.sha256(), 0
        with atomic.atomic_path(self.blob_path(sha256)) as tmp, open(tmp, "wb") as handle:
            for chunk in chunks:
                digest.update(chunk)
                received += len(chunk)
                handle.write(chunk)
            handle.flush()
            if received != size or digest.hexdigest() != sha256:
                raise StoreError(400, f"Upload does not match its oid/size (got {received} bytes).")

    def _store_blob(self, data: bytes, *, lfs: bool) -> dict[str, Any]:
        sha256 = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha256, len(data)):
            atomic.write_bytes(self.blob_path(sha256), data)
        return {"sha256": sha256, "size": len(data), "git_oid": git_hash(data), "lfs": lfs}

    # --- commits ---------------------------------------------------------------------------------
    def apply_commit(self, repo: RepoRef, branch: str, *, title: str, message: str,
                     parent: str | None, operations: list[dict[str, Any]]) -> str:
        """Create a commit on ``branch`` from NDJSON operations; return its id.

        Raises 412 if ``parent`` is given and is not the branch head (someone pushed first).
        """
        with self._lock(repo):
            refs = self.refs(repo)
            if branch not in refs["branches"]:
                raise StoreError(404, f"Branch {branch} not found.", "RevisionNotFound")
            head = refs["branches"][branch]
            if parent and parent != head:
                raise StoreError(412, "The branch was updated since you opened this page. Please "
                                 f"refresh and try again. (parent {parent} is not the head of "
                                 f"{branch}, {head})")
            tree = dict(self.commit(repo, head)["tree"])
            for operation in operations:
                self._apply(tree, operation)
            commit = self._write_commit(repo, parents=[head], tree=tree, title=title, message=message)
            refs["branches"][branch] = commit
            atomic.write_text(self._dir(repo) / "refs.json", canonical.dumps(refs))
            return commit

    def _apply(self, tree: dict[str, Any], operation: dict[str, Any]) -> None:
        key, value = operation.get("key"), operation.get("value") or {}
        path = value.get("path")
        if key == "deletedFolder" and isinstance(path, str):
            path = path.rstrip("/")  # the client names folders with a trailing slash
        try:
            check_relpath(path)
        except Exception as exc:
            raise StoreError(400, f"Invalid path {path!r}: {exc}") from exc
        if key == "file":
            data = base64.b64decode(value.get("content", ""))
            tree[path] = self._store_blob(data, lfs=False)
        elif key == "lfsFile":
            oid, size = value.get("oid"), value.get("size")
            if not self.has_blob(oid, size):
                raise StoreError(400, f"LFS object {oid} for {path} was never uploaded.")
            size = self.blob_path(oid).stat().st_size  # a copy names the oid only
            pointer = lfs_pointer(oid, size)
            tree[path] = {"sha256": oid, "size": size, "git_oid": git_hash(pointer), "lfs": True,
                          "pointer_size": len(pointer)}
        elif key == "deletedFile":
            inside = [name for name in tree if name.startswith(path + "/")]
            if tree.pop(path, None) is None and not inside:
                raise StoreError(404, f"File {path} does not exist.", "EntryNotFound")
            for name in inside:  # a folder named without its slash: the Hub deletes it too
                del tree[name]
        elif key == "deletedFolder":
            prefix = path.rstrip("/") + "/"
            for name in [name for name in tree if name.startswith(prefix)]:
                del tree[name]
        else:
            raise StoreError(400, f"Unknown commit operation {key!r}.")

    def _write_commit(self, repo: RepoRef, *, parents: list[str], tree: dict[str, Any], title: str,
                      message: str) -> str:
        now = datetime.datetime.now(datetime.timezone.utc)
        date = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"  # Hub format
        record = {"parents": parents, "tree": tree, "title": title, "message": message,
                  "date": date, "nonce": os.urandom(8).hex()}
        commit_id = hashlib.sha1(canonical.dumps(record, compact=True).encode()).hexdigest()
        record["id"] = commit_id
        atomic.write_text(self._dir(repo) / "commits" / f"{commit_id}.json", canonical.dumps(record))
        return commit_id
