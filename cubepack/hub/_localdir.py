"""A pulled folder's own bookkeeping, the one place ``pull`` reads or writes it.

A pull keeps each byte once, as ``hf download --local-dir`` does: files are downloaded in
huggingface_hub's local-dir mode into the staging folder beside the target (its records in
``.cache/huggingface/download/<path>.metadata``: commit, etag, time), never into the HF cache.
An earlier pull at the target is updated file by file: its records (cubepack's origin record,
huggingface_hub's metadata) say which files may already hold the bytes the new commit wants,
and each such file is linked into the staging folder and hashed by this process before it
counts; a record alone never does (it is a claim, as the folder is the user's).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from .._util import atomic, canonical
from .._util.hashing import sha256_file
from .._util.paths import regular_file, resolve_inside
from .._util.revision import is_commit
from ..errors import HubError, UnsafeInputError
from ..format._fileset import HF_LOCAL_DIR, ORIGIN_FILE, is_bookkeeping, is_hf_record

#: huggingface_hub's local-dir records of downloads (``_local_folder.get_local_download_paths``).
DOWNLOAD_RECORDS = f"{HF_LOCAL_DIR}/download"
#: The most a record of huggingface_hub's may take (commit, etag, time: under 200 bytes).
_RECORD_LIMIT = 4096


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and \
        all(ch in "0123456789abcdef" for ch in value)


def claims(target: Path, repo_id: str, repo_type: str) -> dict[str, str]:
    """``{path: sha256}`` the records at ``target`` claim its files hold: the origin record of
    an earlier pull of this repo, and huggingface_hub's records whose etag is a sha256 (an LFS
    file's). Only a hint of which files to hash; reads, never writes, and any record it cannot
    read claims nothing."""
    found: dict[str, str] = {}
    origin = _origin(target)
    if origin is not None and (origin.get("repo_id"), origin.get("repo_type")) == \
            (repo_id, repo_type):
        files = origin.get("files")
        for name, entry in (files.items() if isinstance(files, dict) else ()):
            if isinstance(entry, dict) and _hex64(entry.get("sha256")):
                found[name] = entry["sha256"]
    records = target / DOWNLOAD_RECORDS
    for directory, _, names in os.walk(records):
        for name in names:
            if not name.endswith(".metadata"):
                continue
            path = Path(directory) / name
            record = _read_record(path)
            repo_path = path.relative_to(records).as_posix()[:-len(".metadata")]
            if record is not None and _hex64(record[1]) and not is_bookkeeping(repo_path):
                found.setdefault(repo_path, record[1])
    return found


def held(target: Path, repo_id: str, repo_type: str, sha: str) -> list[str]:
    """The files an earlier pull of ``repo_id`` at commit ``sha`` placed at ``target`` (its
    origin record's word: what an offline pull of that commit takes from the folder, each
    hashed and verified before it counts), bookkeeping left out."""
    origin = _origin(target)
    if origin is None or (origin.get("repo_id"), origin.get("repo_type"),
                          origin.get("commit_sha")) != (repo_id, repo_type, sha):
        return []
    files = origin.get("files")
    return sorted(name for name in (files if isinstance(files, dict) else ())
                  if isinstance(name, str) and not is_bookkeeping(name))


def _origin(target: Path) -> dict[str, Any] | None:
    try:
        with open(target / ORIGIN_FILE, "rb") as handle:
            origin = canonical.loads_strict(handle.read())
    except (OSError, ValueError):
        return None
    return origin if isinstance(origin, dict) else None


def _read_record(path: Path) -> tuple[str, str] | None:
    """(commit, etag) of one of huggingface_hub's download records, or None."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _RECORD_LIMIT:
            return None
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return (lines[0].strip(), lines[1].strip()) if len(lines) >= 3 else None


def reuse(target: Path, name: str, staging: Path,
          expected: str | None) -> tuple[str, os.stat_result] | None:
    """Put ``target/name`` at ``staging/name`` without copying its bytes (a hard link: the
    earlier folder is removed once the new one is in place, so the placed file is again the
    folder's own) and hash it there. Returns (sha256, its stat) when the bytes are
    ``expected`` (any bytes when None: the lock decides later), else None with nothing left in
    ``staging``: download it instead. A file that changed while it was hashed is not reused.
    """
    destination = resolve_inside(staging, name)
    try:
        source = regular_file(target, name)  # never through a link the user planted
        before = os.lstat(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if before.st_nlink > 1:  # linked elsewhere too: the placed file must be the folder's own
            atomic.clone_file(source, destination)
        else:
            try:
                os.link(source, destination, follow_symlinks=False)
            except OSError:  # no hard links here: a local copy still saves the download
                atomic.clone_file(source, destination)
        linked = os.lstat(destination)
        if not stat.S_ISREG(linked.st_mode):  # swapped for a link since it was looked at
            raise UnsafeInputError(f"{source} changed into a link while it was reused")
        digest = sha256_file(destination)
        after = os.lstat(destination)
    except (OSError, UnsafeInputError):
        with contextlib.suppress(OSError):
            destination.unlink()
        return None
    same = (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == \
        (linked.st_size, linked.st_mtime_ns, linked.st_ctime_ns) and \
        before.st_size == after.st_size
    if not same or (expected is not None and digest != expected):
        with contextlib.suppress(OSError):
            destination.unlink()
        return None
    return digest, after


def record(staging: Path, name: str, sha: str, etag: str) -> None:
    """huggingface_hub's record of ``name`` at commit ``sha``, as its own download would write
    it, so ``hf download --local-dir`` finds the reused file current."""
    from huggingface_hub._local_folder import write_download_metadata

    write_download_metadata(local_dir=staging, filename=name, commit_hash=sha, etag=etag)


def carry_records(target: Path, staging: Path, sha: str) -> None:
    """Link huggingface_hub's records of commit ``sha`` from ``target`` into ``staging``
    (offline: no listing to write them afresh): each file's record naming that commit, that
    commit's tree listing, the folder's .gitignore and CACHEDIR.TAG; never a lock or a partial
    download."""
    root = target / HF_LOCAL_DIR
    for directory, _, names in os.walk(root):
        for name in names:
            relative = (Path(directory) / name).relative_to(target).as_posix()
            if not is_hf_record(relative) or relative.endswith((".lock", ".incomplete")):
                continue
            if relative.startswith(f"{HF_LOCAL_DIR}/upload/"):
                continue
            if relative.startswith(f"{HF_LOCAL_DIR}/trees/") and \
                    relative != f"{HF_LOCAL_DIR}/trees/{sha}.json":
                continue
            try:
                source = regular_file(target, relative)
            except (OSError, UnsafeInputError):
                continue
            if relative.endswith(".metadata"):
                found = _read_record(source)
                if found is None or found[0] != sha:
                    continue
            destination = resolve_inside(staging, relative)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, destination, follow_symlinks=False)
            except OSError:
                atomic.clone_file(source, destination)


def require_commit(staging: Path, name: str, sha: str, local: str | os.PathLike[str]) -> None:
    """A file downloaded into ``staging`` must sit at ``staging/name`` and its record name
    commit ``sha``: the client records the commit the server says it served, so another
    commit means another file than the one asked for."""
    expected = resolve_inside(staging, name)
    if os.path.abspath(local) != os.path.abspath(expected):
        raise HubError(f"The client placed {name} at {local}, not at {expected}; refusing it.")
    found = _read_record(staging / DOWNLOAD_RECORDS / f"{name}.metadata")
    served = found[0] if found is not None else None
    if served != sha or not is_commit(served):
        raise HubError(f"The endpoint served {name} from another commit than {sha} "
                       f"({served or 'none recorded'}); refusing it.")


def bookkeeping_files(staging: Path) -> list[str]:
    """huggingface_hub's files in ``staging`` (its records, locks and tags), as relative paths:
    placed with the cube and recorded like its files, so a file added there later is seen."""
    root = staging / HF_LOCAL_DIR
    return sorted((PurePosixPath(HF_LOCAL_DIR) / Path(directory, name).relative_to(root)
                   .as_posix()).as_posix()
                  for directory, _, names in os.walk(root) for name in names)
