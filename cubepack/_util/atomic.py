"""Atomic writes: a file or folder either appears whole under its final name or not at all.

Readers may have a previous version memory-mapped (safetensors does), so a file is never
rewritten in place: we write a sibling temp file, fsync it, then ``os.replace`` it over the
target.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
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
    """Put the fully prepared folder ``staged`` at ``target``, replacing any folder there.

    On Linux the two folders are swapped in one ``renameat2(RENAME_EXCHANGE)`` call, so
    ``target`` is at every instant either the old or the new folder. Elsewhere the old folder
    is renamed aside first and restored if the second rename fails. The old content is
    deleted last.
    """
    staged, target = Path(staged), Path(target)
    if not target.exists():
        try:
            os.replace(staged, target)
            return
        except OSError:
            if not target.exists():
                raise  # anything but "someone created it meanwhile" (concurrent pulls)
    if _exchange(staged, target):
        shutil.rmtree(staged, ignore_errors=True)  # ``staged`` now holds the old content
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


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False where unsupported."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    return result == 0


def staging_dir(target: Path, purpose: str) -> Path:
    """A new empty folder beside ``target`` (same file system, so renames are atomic).

    Its name carries this process's id, so staging folders left by a killed process (SIGKILL
    leaves no chance to clean up) are recognised and removed by the next run.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(target, purpose)
    staged = Path(tempfile.mkdtemp(prefix=f".{target.name}.{purpose}.{os.getpid()}.",
                                   dir=target.parent))
    mode = target.stat().st_mode & 0o7777 if target.is_dir() else 0o777 & ~_umask()
    os.chmod(staged, mode)  # the swapped-in folder keeps the permissions a user expects
    return staged


def _remove_stale_staging(target: Path, purpose: str) -> None:
    prefix = f".{target.name}.{purpose}."
    for candidate in target.parent.glob(prefix + "*"):
        pid_text = candidate.name[len(prefix):].split(".", 1)[0]
        if candidate.is_dir() and pid_text.isdigit() and not _process_alive(int(pid_text)):
            shutil.rmtree(candidate, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _read_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


_UMASK = _read_umask()  # read once at import: os.umask is process-wide and not thread-safe


def _umask() -> int:
    return _UMASK


def link_or_copy(source: Path, destination: Path) -> None:
    """Hard-link ``source`` to ``destination`` (cheap for large files), else copy it.

    Safe because cubepack never modifies a file in place: a changed file is always a new file.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


#: Linux's FICLONE ioctl: a reflink (a new inode sharing the source's blocks copy-on-write),
#: where the file system has them (btrfs, XFS, bcachefs); elsewhere it fails at once.
_FICLONE = 0x40049409


def clone_file(source: Path, destination: Path) -> str:
    """A new file (a new inode, mode 0644 under the umask) holding ``source``'s bytes: a
    reflink where the file system makes them, else a copy by the kernel (``sendfile``), never
    a hard link (a pulled folder is its user's to edit: nothing else may change with it).
    Returns how it was made (``"reflink"`` or ``"copy"``)."""
    import fcntl

    destination.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as src, open(destination, "xb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            how = "reflink"
        except (OSError, AttributeError):
            _kernel_copy(src, dst)
            how = "copy"
    os.chmod(destination, 0o666 & ~_umask())
    return how


def _kernel_copy(src: Any, dst: Any) -> None:
    """``src`` to ``dst`` by ``sendfile`` (the kernel copies page to page, no Python buffer),
    else by a buffered loop where the kernel cannot."""
    size, offset = os.fstat(src.fileno()).st_size, 0
    try:
        while offset < size:
            sent = os.sendfile(dst.fileno(), src.fileno(), offset, min(size - offset, 1 << 30))
            if sent == 0:
                break
            offset += sent
    except (OSError, AttributeError):
        if offset:
            raise  # part written: a failure midway is a failure (the caller removes it)
        shutil.copyfileobj(src, dst, 4 << 20)
        return
    if offset != size:
        raise OSError(f"{src.name} shrank while it was copied ({offset} of {size} bytes)")


def copy_file(source: Path, destination: Path) -> None:
    """A new file (a new inode) holding ``source``'s bytes, for a folder handed to someone who
    may edit it in place (MemOS dumps with ``open(path, "w")``): a hard link would change
    ``source`` too."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, destination)


def missing_parents(target: Path) -> list[Path]:
    """The folders above ``target`` that do not exist yet, deepest first: what a failed run
    that created them (``staging_dir`` does) removes again with :func:`remove_empty`."""
    missing = []
    for parent in Path(target).absolute().parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; leave any other alone."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
