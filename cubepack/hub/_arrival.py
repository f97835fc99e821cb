"""Hashing each file of a pull as its bytes arrive.

huggingface_hub writes a download through one function, ``file_download.http_get(url,
temp_file, ...)`` (0.36 and 2.x alike), into a fresh temporary file it then renames into the
HF cache's ``blobs/``. While a pull runs, that function is wrapped: a download made inside
:func:`arrivals` (in the pull's own thread) writes through a
:class:`~cubepack._util.hashing.HashingWriter`, so its sha256 is complete when its last byte
is written; the client's own retries (which resume with a ``Range`` request into the same
file) go on through the same writer. Any other download passes through untouched.

:func:`arrived_digest` hands the digest out only when it provably covers the file the client
placed: one stream, whole from byte 0 (no seek, no truncate), of exactly the file's size, into
the very inode now at the cache path. Anything else (a download resumed from an earlier
process's partial file, a rewound one, bytes written by Xet or hf_transfer rather than
through the file object, a blob that was already cached) gets None, and the caller hashes the
file from disk: every file is hashed by this process either way. The wrapper is installed
while a pull downloads and removed when the last one ends.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .._util.hashing import HashingWriter


@dataclass
class Arrival:
    """One stream huggingface_hub wrote while a file downloaded, and the file it wrote to."""

    writer: HashingWriter
    device: int
    inode: int


_SLOT: contextvars.ContextVar[list[Arrival] | None] = contextvars.ContextVar(
    "cubepack_arrivals", default=None)
_USERS = 0
_INSTALLED: list[tuple[Any, Callable[..., Any], Callable[..., Any]]] = []  # (module, old, ours)
_LOCK = threading.Lock()


@contextmanager
def arrivals() -> Iterator[list[Arrival]]:
    """Record (and hash) the streams huggingface_hub writes in this thread meanwhile."""
    found: list[Arrival] = []
    token = _SLOT.set(found)
    try:
        yield found
    finally:
        _SLOT.reset(token)


def arrived_digest(found: list[Arrival], local: str | os.PathLike[str]) -> str | None:
    """The sha256 of ``local`` as it arrived, when one whole stream wrote exactly that file;
    else None (hash the file instead)."""
    if len(found) != 1:
        return None
    arrival = found[0]
    digest = arrival.writer.hexdigest()
    try:
        placed = os.stat(local)  # follows the snapshot link to its blob
    except OSError:
        return None
    if digest is None or (placed.st_dev, placed.st_ino) != (arrival.device, arrival.inode) \
            or placed.st_size != arrival.writer.size:
        return None
    return digest


@contextmanager
def hashing_downloads() -> Iterator[None]:
    """Wrap huggingface_hub's ``http_get`` while this block runs (and any other that overlaps
    it); the last to end puts the original back."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            _install()
        _USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _USERS -= 1
            if _USERS == 0:
                _uninstall()


def _install() -> None:
    from huggingface_hub import file_download

    original = file_download.http_get

    def http_get(url: str, temp_file: Any, *args: Any, **kwargs: Any) -> Any:
        found = _SLOT.get()
        if found is None or isinstance(temp_file, HashingWriter):  # not ours, or a retry
            return original(url, temp_file, *args, **kwargs)
        writer = HashingWriter(temp_file)
        try:
            info = os.fstat(temp_file.fileno())
            found.append(Arrival(writer, info.st_dev, info.st_ino))
        except (AttributeError, OSError, ValueError):
            return original(url, temp_file, *args, **kwargs)  # no file to vouch for: hash later
        return original(url, writer, *args, **kwargs)

    file_download.http_get = http_get
    _INSTALLED.append((file_download, original, http_get))


def _uninstall() -> None:
    module, original, ours = _INSTALLED.pop()
    if module.http_get is ours:  # someone wrapped it since: theirs stays, ours passes through
        module.http_get = original

