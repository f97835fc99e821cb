"""Atomic writes: a file or folder either appears whole under its final name or not at all.

Readers may have a previous version memory-mapped (safetensors does), so a file is never
rewritten in place: we write a sibling temp file, fsync it, then ``os.replace`` it over the
target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path next to ``target``; on success rename it over ``target``.

    On any exception the temp file is removed and ``target`` is left as it was; a target that
    cannot be written is a :class:`~cubepack.errors.UsageError` naming it (see :func:`placing`).
    """
    target = Path(target)
    with placing(target, elsewhere="write to another path"):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                        dir=target.parent)
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
        except FileNotFoundError:
            continue  # never made, or removed already: its parent may still be ours to remove
        except OSError:
            return


#: What the operating system says when a target cannot take what cubepack places there.
TARGET_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                           errno.EXDEV, errno.EBUSY})

_placing = threading.local()


@contextlib.contextmanager
def placing(target: str | os.PathLike[str], *, elsewhere: str, whole: bool = True,
            cache_dir: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """The one owner of "this target cannot be written": an ``OSError`` raised in the block
    whose errno is one of :data:`TARGET_ERRNOS` (not writable, immutable, read-only file
    system, a mount point that cannot be renamed, disk full) becomes a
    :class:`~cubepack.errors.UsageError` naming ``target`` (the user's folder or file, never
    the staging folder beside it) and what to do; ``elsewhere`` completes the fix ("pass
    another --local-dir"). The folders the block created above ``target`` are removed again
    on any failure (the caller removes its own staging folder), so nothing is left behind.

    ``whole``: the block places ``target`` whole or not at all (a staging folder swapped in,
    a temp file renamed), so the message says it is as it was; False for a block that writes
    file by file in place (MemOS's dump), whose message does not claim it.

    Blocks nest: only the outermost converts (``upgrade`` packs its staging folder, whose name
    the user never gave), so the message names what the user asked to write.

    A path in the Hugging Face cache (``cache_dir``, the one a call was given, or
    huggingface_hub's) is named as such, with the setting that moves it instead of
    ``elsewhere``: another target would meet the same cache.
    """
    target = Path(target).absolute()
    if getattr(_placing, "target", None) is not None:
        yield
        return
    created = missing_parents(target / "_")  # the target folder itself, if the block makes it
    _placing.target = target
    try:
        yield
    except OSError as exc:
        remove_empty(created)
        problem = target_problem(exc, target, elsewhere=elsewhere, whole=whole,
                                 cache_dir=cache_dir)
        if problem is None:
            raise
        raise problem from exc
    except UsageError as exc:
        remove_empty(created)
        cause = getattr(exc, "target_cause", None)  # an inner block's (another thread's)
        problem = None if cause is None else target_problem(cause, target, elsewhere=elsewhere,
                                                            whole=whole, cache_dir=cache_dir)
        if problem is None:
            raise
        raise problem from cause
    except BaseException:
        remove_empty(created)
        raise
    finally:
        _placing.target = None


def target_problem(exc: OSError, target: Path, *, elsewhere: str, whole: bool = True,
                   cache_dir: str | os.PathLike[str] | None = None) -> UsageError | None:
    """The :class:`~cubepack.errors.UsageError` for ``exc`` raised while writing ``target``,
    or None when ``exc`` is not a target problem (another errno, or a path outside it)."""
    if exc.errno not in TARGET_ERRNOS:
        return None
    target = Path(target).absolute()
    where = _user_path(exc, target)
    if where is None:
        return None
    reason, fix = _diagnose(exc.errno, where, target)
    kept = f" Nothing was left behind: {target} is as it was." if whole else ""
    cache = _hf_place(exc, target, cache_dir)
    if cache is not None:  # another target would not help: the setting that moves it does
        root, what, elsewhere = cache
        if where in root.parents:  # the cache is yet to be made: name it, not its parent
            where = root
        where = f"{where} ({what})"
    problem = UsageError(f"Cannot write {where}: {reason} ({os.strerror(exc.errno)}). {fix}, "
                         f"or {elsewhere}.{kept}")
    problem.target_cause = exc  # an outer block re-tells it of its own target
    return problem


def cache_problem(exc: OSError,
                  cache_dir: str | os.PathLike[str] | None = None) -> UsageError | None:
    """The :class:`~cubepack.errors.UsageError` for ``exc`` when it is a write the Hugging Face
    cache (or home) refused outside any target of the user's (a Hub model or a lock downloaded
    to be read), naming the folder and the setting that moves it; else None."""
    if exc.errno not in TARGET_ERRNOS:
        return None
    cache = _hf_place(exc, None, cache_dir)
    if cache is None:
        return None
    root, what, elsewhere = cache
    named = Path(os.fsdecode(exc.filename)).absolute() if exc.filename else root
    where = named if named.is_dir() or not named.parent.exists() else named.parent
    if where in root.parents:  # the cache is yet to be made: name it, not its parent
        where = root
    reason, fix = _diagnose(exc.errno, where, where)
    problem = UsageError(f"Cannot write {where} ({what}): {reason} "
                         f"({os.strerror(exc.errno)}). {fix}, or {elsewhere}.")
    problem.target_cause = exc  # a placing block around it tells it with its target
    return problem


def _user_path(exc: OSError, target: Path) -> Path | None:
    """The path to name: ``target`` for any path of ours beside or inside it (its staging
    folder, its temp file, the folder set aside), a path the user named elsewhere as is, and
    ``target`` when the error names no path (a write that found the disk full)."""
    named = [Path(name).absolute() for name in (exc.filename, exc.filename2)
             if isinstance(name, (str, bytes, os.PathLike)) and name]
    if not named:
        return target
    ours = f".{target.name}."
    for path in named:
        path = Path(os.fsdecode(path))
        if path == target or target in path.parents or path == target.parent:
            return target
        if target.parent in path.parents:
            top = path.relative_to(target.parent).parts[0]
            if top.startswith(ours) or top.startswith("." + ours):  # a staging's own staging
                return target
    first = Path(os.fsdecode(named[0]))
    return first if first.is_dir() or not first.parent.exists() else first.parent


def _hf_place(exc: OSError, target: Path | None,
              cache_dir: str | os.PathLike[str] | None) -> tuple[Path, str, str] | None:
    """(its folder, what it is, the fix's second half) when ``exc`` names a path in the
    Hugging Face cache or home, outside ``target``: the settings that move it, as
    huggingface_hub read them (it is imported whenever something was written there), or the
    ``cache_dir`` a call was given. HF_HOME moves the cache too while HF_HUB_CACHE is its
    default, HF_HOME/hub."""
    places = []
    if cache_dir is not None:
        places.append((Path(cache_dir).expanduser().absolute(),
                       "the Hugging Face cache this call was given", "pass another cache_dir"))
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        home = Path(hub.HF_HOME).expanduser().absolute()
        cache = Path(hub.HF_HUB_CACHE).expanduser().absolute()
        moves = "HF_HUB_CACHE (or HF_HOME, which holds it as hub/)" if cache == home / "hub" \
            else "HF_HUB_CACHE"
        places += [(cache, "the Hugging Face cache, HF_HUB_CACHE",
                    f"set {moves} to a writable folder"),
                   (home, "the Hugging Face home, HF_HOME", "set HF_HOME to a writable folder")]
    for name in (exc.filename, exc.filename2):
        if not isinstance(name, (str, bytes, os.PathLike)) or not name:
            continue
        path = Path(os.fsdecode(name)).absolute()
        if target is not None and (path == target or target in path.parents):
            continue
        for root, what, fix in places:
            if path == root or root in path.parents:
                return root, what, fix
    return None


def _diagnose(code: int, where: Path, target: Path) -> tuple[str, str]:
    """Why ``where`` cannot be written, and the first half of the fix."""
    mount = next((p for p in (target, where) if os.path.ismount(p)), None)
    if code in (errno.EXDEV, errno.EBUSY) or (mount is not None and code != errno.ENOSPC
                                              and code != errno.EROFS):
        if mount is not None:
            return (f"{mount} is a mount point: cubepack places a folder by renaming a complete "
                    "copy over it, and a mount point cannot be renamed",
                    f"Use a new folder inside it (e.g. {mount / (target.name or 'cube')})")
        return ("it is busy or on another file system than the folder holding it, so it "
                "cannot be renamed", "Use a folder on the same file system as its parent")
    if code == errno.EROFS:
        return ("it is on a read-only file system", "Remount it read-write")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return ("the device holding it is full (or the disk quota is used up)",
                "Free space there")
    flagged = next((p for p in (target, where, target.parent) if _immutable(p)), None)
    if flagged is not None:
        return (f"{flagged} is immutable or append-only (lsattr -d shows 'i' or 'a')",
                f"Lift the attribute (chattr -i -a {flagged})")
    if code == errno.EPERM:
        return ("the operation is not permitted there (an immutable or append-only file or "
                "folder, lsattr shows 'i' or 'a'; or a file system that refuses it)",
                "Lift the attribute (chattr -i -a) or make it writable")
    return ("it, or the folder holding it, is not writable by this user",
            "Make it writable (check its owner and mode: ls -ld)")


#: Linux's FS_IOC_GETFLAGS ioctl and its immutable and append-only flags (chattr +i, +a).
_GETFLAGS, _IMMUTABLE, _APPEND = 0x80086601, 0x10, 0x20


def _immutable(path: Path) -> bool:
    """Does ``path`` carry the immutable or append-only attribute? False where unknown."""
    if sys.platform != "linux" or not path.exists():
        return False
    try:
        import array
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            flags = array.array("i", [0])
            fcntl.ioctl(fd, _GETFLAGS, flags, True)
        finally:
            os.close(fd)
    except (OSError, ImportError):
        return False
    return bool(flags[0] & (_IMMUTABLE | _APPEND))
