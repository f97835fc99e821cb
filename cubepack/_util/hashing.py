"""sha256 of files: the one hashing mechanism used by fingerprint, pack and verify.

Files are hashed in parallel on all cores, largest first (``hashlib`` releases the GIL on large
updates, so threads saturate the cores without copying data between processes), with an
optional progress bar in bytes. A file of a few MiB or more is hashed straight from a read-only
memory map of it (no copy into a buffer: bench/verify.py measured about a tenth less CPU than
reads into a buffer), read ahead sequentially by the kernel; smaller files, and any bytes past
the size the file had when it was opened, are read into a reused per-thread buffer. A mapped
file another process truncates while it is being hashed ends this process (SIGBUS), as for any
memory map; nothing is accepted either way.

``HashCache`` remembers digests of files we do not control (model weights) keyed by
(device, inode, size, mtime_ns, ctime_ns) of the file a path resolves to, so re-fingerprinting
an unchanged 1 GB model costs a ``stat``. ctime is in the key because a user can set mtime back
after editing a file in place, but not ctime. Verification of cube files never uses it: a
verifier must read the bytes.
"""

from __future__ import annotations

import atexit
import hashlib
import mmap
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import constants

#: Reads into a buffer this size (it stays in the core's cache while it is hashed).
_READ_SIZE = 1024 * 1024
#: Files at least this large are hashed from a memory map ...
_MAP_FROM = 4 * 1024 * 1024
#: ... one window of it per ``update`` (the progress bar's step).
_MAP_WINDOW = 8 * 1024 * 1024
_BUFFERS = threading.local()


def sha256_file(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None) -> str:
    """Return the sha256 hex digest of one file: every byte it holds when it is read."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        info = os.fstat(handle.fileno())
        mapped = 0
        if stat.S_ISREG(info.st_mode) and info.st_size >= _MAP_FROM:
            mapped = _hash_mapped(digest, handle, info.st_size, on_bytes)
            handle.seek(mapped)
        _hash_read(digest, handle, on_bytes)  # the rest: a small file, or bytes it gained
    return digest.hexdigest()


def _hash_mapped(digest: Any, handle: Any, size: int,
                 on_bytes: Callable[[int], None] | None) -> int:
    """Hash the first ``size`` bytes of ``handle`` from a read-only map; return how many were
    hashed (0 where the file cannot be mapped: it is then read instead)."""
    try:
        mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return 0
    with mapping:
        if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mapping.madvise(mmap.MADV_SEQUENTIAL)  # read ahead of the hash on a cold cache
        with memoryview(mapping) as view:
            for start in range(0, size, _MAP_WINDOW):
                window = view[start:start + _MAP_WINDOW]
                digest.update(window)
                window.release()
                if on_bytes is not None:
                    on_bytes(min(_MAP_WINDOW, size - start))
    return size


def _hash_read(digest: Any, handle: Any, on_bytes: Callable[[int], None] | None) -> None:
    """Hash what ``handle`` holds from its position to its end, read into this thread's
    buffer."""
    buffer = getattr(_BUFFERS, "buffer", None)
    if buffer is None:
        buffer = _BUFFERS.buffer = bytearray(_READ_SIZE)
    with memoryview(buffer) as view:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            if on_bytes is not None:
                on_bytes(count)


class HashCache:
    """Persistent sha256 cache for files keyed by (device, inode, size, mtime_ns, ctime_ns)."""

    def __init__(self, db_path: str | os.PathLike[str] | None = None):
        self.db_path = Path(db_path or constants.hash_cache_path())
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is None:
            try:
                self.db_path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.db_path, timeout=30, check_same_thread=False)
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS file_sha256 (device INTEGER, inode INTEGER, "
                    "size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT, "
                    "PRIMARY KEY (device, inode, size, mtime_ns, ctime_ns))"
                )
                conn.commit()
                self._conn = conn
            except (OSError, sqlite3.Error):
                return None  # a read-only home must not stop hashing, only its caching
        return self._conn

    @staticmethod
    def key(path: Path) -> tuple[int, int, int, int, int]:
        st = os.stat(path)  # follows links: the key is the file's, whatever names it
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def get(self, key: tuple[int, int, int, int, int]) -> str | None:
        with self._lock:
            conn = self._connection()
            if conn is None:
                return None
            row = conn.execute(
                "SELECT sha256 FROM file_sha256 WHERE device=? AND inode=? AND size=? AND "
                "mtime_ns=? AND ctime_ns=?", key
            ).fetchone()
        return row[0] if row else None

    def put(self, key: tuple[int, int, int, int, int], sha256: str) -> None:
        with self._lock:
            conn = self._connection()
            if conn is None:
                return
            try:
                conn.execute("INSERT OR REPLACE INTO file_sha256 VALUES (?,?,?,?,?,?)",
                             (*key, sha256))
                conn.commit()
            except sqlite3.Error:
                pass


_SHARED: dict[Path, HashCache] = {}
_SHARED_GUARD = threading.Lock()


def shared_cache() -> HashCache:
    """The process's one :class:`HashCache` for the configured ``CUBEPACK_CACHE`` (opened once,
    closed at exit), so repeated fingerprints share one SQLite connection."""
    path = constants.hash_cache_path()
    with _SHARED_GUARD:
        if path not in _SHARED:
            _SHARED[path] = HashCache(path)
        return _SHARED[path]


@atexit.register
def _close_shared() -> None:
    with _SHARED_GUARD:
        for cache in _SHARED.values():
            cache.close()
        _SHARED.clear()


def hash_files(
    paths: Iterable[str | os.PathLike[str]],
    *,
    cache: HashCache | None = None,
    progress: bool | None = None,
    description: str = "hashing",
    workers: int | None = None,
) -> dict[Path, str]:
    """sha256 every file in ``paths`` in parallel; return ``{path: hexdigest}``.

    Args:
        cache: when given, digests are looked up and stored there (for model weights only).
        progress: show a byte progress bar; ``None`` means "when stderr is a terminal".
        workers: threads to use; defaults to the number of cores.
    """
    files = [Path(p) for p in paths]
    results: dict[Path, str] = {}
    todo: list[tuple[Path, tuple | None]] = []
    for path in files:
        key = HashCache.key(path) if cache is not None else None
        known = cache.get(key) if cache is not None and key is not None else None
        if known:
            results[path] = known
        else:
            todo.append((path, key))
    if not todo:
        return results

    total = sum(path.stat().st_size for path, _ in todo)
    bar = _progress_bar(total, description, progress)
    bar_lock = threading.Lock()

    def advance(count: int) -> None:
        if bar is not None:
            with bar_lock:
                bar.update(count)

    def work(item: tuple[Path, tuple | None]) -> tuple[Path, str]:
        path, key = item
        digest = sha256_file(path, advance)
        # Remember it only if the file did not change while it was read.
        if cache is not None and key is not None and HashCache.key(path) == key:
            cache.put(key, digest)
        return path, digest

    try:
        # Largest first, so one big file does not start last and leave a core idle.
        todo.sort(key=lambda item: item[0].stat().st_size, reverse=True)
        pool_size = max(1, min(workers or os.cpu_count() or 1, len(todo)))
        if pool_size == 1:
            results.update(work(item) for item in todo)
        else:
            with ThreadPoolExecutor(pool_size, thread_name_prefix="cubepack-hash") as pool:
                results.update(pool.map(work, todo))
    finally:
        if bar is not None:
            bar.close()
    return results


def _progress_bar(total: int, description: str, progress: bool | None):
    if progress is None:
        progress = constants.progress_enabled() and total >= 64 * 1024 * 1024
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=description,
                leave=False)
