"""Atomic writes: a file or folder either appears whole under its final name or not at all.

Readers may have a previous version memory-mapped (safetensors does), so a file is never
rewritten in place: we write a sibling temp file, fsync it, then ``os.replace`` it over the
target.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path next to ``target``; on success rename it over ``target``.

    On any exception the temp file is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    """Atomically write ``data`` to ``target``."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text(target: str | os.PathLike[str], text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``target``."""
    write_bytes(target, text.encode("utf-8"))


def replace_dir(staged: Path, target: Path) -> None:
    """Move the fully prepared folder ``staged`` to ``target``, replacing any folder there.

    The old folder is renamed aside first and removed only after the new one is in place, so an
    interruption leaves either the old or the new folder under ``target``, never a mix.
    """
    target = Path(target)
    if not target.exists():
        os.replace(staged, target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.rmdir(aside)
    os.replace(target, aside)
    try:
        os.replace(staged, target)
    except BaseException:
        os.replace(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
