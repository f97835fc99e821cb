"""Where the plaintext of a private cube may exist: memory, never a disk (issue #32).

Three places:

- :func:`anonymous_memory`: a private anonymous mapping, for a reader that takes a buffer
  (``load_kv_cache``: its tensors view it, zero-copy); the fastest of the three to fill;
- :func:`empty_memory_file`: one anonymous file (``memfd_create``): it has no name in any file
  system, is reached through ``/proc/self/fd/N`` by readers that want a path (safetensors
  maps it, zero-copy), and is freed when the last reference (fd or mapping) goes away, even
  if the process is killed;
- :func:`ram_folder`: a folder of files for checks that read a whole cube (verify, MemOS's
  loaders, PEFT): a private (0700) folder on a RAM file system (tmpfs at ``/dev/shm``, or
  ``CUBEPACK_RAM_DIR`` when that is a tmpfs or ramfs mount too), removed when the block ends.
  SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGINT while it exists raise
  :class:`~cubepack.errors.Terminated` (or KeyboardInterrupt) (see :func:`signals_unwind`), so
  the folder is removed as on any error. A process killed by SIGKILL cannot remove it: it
  stays in RAM until removed or reboot, never on a disk; the next ``ram_folder`` of the same
  user removes it. Liveness is a lock, not a pid: each folder's process holds an exclusive
  ``flock`` on the folder itself for its life (the kernel drops it when the process
  dies, however it dies), and a folder is stale only when that lock can be taken. A pid means
  nothing across PID namespaces (a container sharing ``/dev/shm``), and is reused.

Never ``TMPDIR``: it is usually a disk. Elsewhere (macOS, no tmpfs) a RAM folder is refused
rather than silently written to a disk.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import Terminated, UnsupportedError

#: File systems that keep files in memory only.
_RAM_FILE_SYSTEMS = ("tmpfs", "ramfs")
_PREFIX = "cubepack-private-"


def no_core_dumps() -> bool:
    """Make this process undumpable (``prctl(PR_SET_DUMPABLE, 0)``, as ssh-agent does): a
    crash then writes no core, so no plaintext a private cube's load left in the ordinary heap
    (a KV header's fields, files verify decrypted) reaches a disk through systemd-coredump or
    apport. Process-wide (it also keeps same-user debuggers out), so the CLI calls it when it is
    given an identity; a program using the Python API decides for itself (SECURITY.md). True
    when it took effect (Linux); False elsewhere."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        return False


def _mounts() -> dict[str, str]:
    """Mount point -> file system type. The kernel escapes a mount point's space, tab, newline
    and backslash as octal (``\\040``...): read as written, a disk mounted at ``.../x y``
    would be another path, and the tmpfs around it taken for where it is."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as handle:
            mounts = {}
            for line in handle:  # later lines are mounted over earlier ones: they win
                fields = line.split()
                if len(fields) > 2:
                    mounts[_unescaped(fields[1])] = fields[2]
            return mounts
    except OSError:
        return {}


def _unescaped(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _is_ram(path: Path) -> bool:
    """Is ``path`` on a RAM file system (the mount point holding it is tmpfs or ramfs)?"""
    mounts = _mounts()
    resolved = path.resolve()
    for candidate in (resolved, *resolved.parents):
        if str(candidate) in mounts:
            return mounts[str(candidate)] in _RAM_FILE_SYSTEMS
    return False


def ram_root() -> Path:
    """The RAM file system plaintext folders are made in.

    Raises:
        UnsupportedError: no RAM file system here (or ``CUBEPACK_RAM_DIR`` names a disk).
    """
    chosen = os.environ.get("CUBEPACK_RAM_DIR")
    root = Path(chosen) if chosen else Path("/dev/shm")
    if root.is_dir() and _is_ram(root):
        return root
    where = f"CUBEPACK_RAM_DIR={chosen}" if chosen else "/dev/shm"
    raise UnsupportedError(f"Opening a private cube decrypts it to memory only, and {where} is "
                           "not a RAM file system (tmpfs or ramfs) here; cubepack never writes "
                           "a private cube's plaintext to a disk. Set CUBEPACK_RAM_DIR to a "
                           "tmpfs mount.")


#: In the name of a folder whose liveness is its lock (a flock on the folder itself); a
#: folder named without it was made by a cubepack before the lock, and is judged by its pid.
_HELD = ".held."
#: The signals that end a process by default (SIGINT: Python's KeyboardInterrupt already
#: unwinds) and that a RAM folder's process unwinds on instead, so its folder is removed.
UNWOUND_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGINT")


def _remove_stale(root: Path) -> None:
    """Remove this user's RAM folders that no live process holds: each is locked (flock)
    by its process for its life, so a folder whose lock can be taken is stale, whatever pid
    its name records. A folder made before the lock (no ``.held.`` in its name) falls back
    to its pid, as it was judged then."""
    import fcntl

    for candidate in root.glob(_PREFIX + "*"):
        try:
            if candidate.is_symlink() or candidate.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _HELD not in candidate.name:
            pid = candidate.name[len(_PREFIX):].split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(candidate, ignore_errors=True)
            continue
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its process lives (here or in another PID namespace)
        else:
            shutil.rmtree(candidate, ignore_errors=True)  # removed while we hold its lock
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _terminated(signum: int, frame: object) -> None:
    # A second signal must not break the cleanup the first one started.
    for name in UNWOUND_SIGNALS:
        if signal.getsignal(getattr(signal, name)) is _terminated:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise Terminated(f"terminated ({signal.Signals(signum).name}) before the command "
                     "finished", signum=signum)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """Within the block, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 (and SIGINT, where Python left it
    at the system default) raise :class:`Terminated` instead of ending the process at once:
    their default runs no ``finally`` (SIGQUIT also dumps core), and a RAM folder of plaintext
    would outlive the command (as after a SIGKILL). SIGINT's usual handler already raises
    KeyboardInterrupt, which unwinds. Only where Python may install handlers (the main
    thread) and only over the default disposition: a handler the program set is its own, and
    is left alone. The previous dispositions come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed = []
    for name in UNWOUND_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _terminated)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            signal.signal(signum, signal.SIG_DFL)


@contextlib.contextmanager
def ram_folder() -> Iterator[Path]:
    """A new private folder on a RAM file system, removed (with all it holds) on exit, also
    on the signals :func:`signals_unwind` names; locked (a flock on the folder itself) for
    its life, so no other process's stale removal takes it, whatever its PID namespace."""
    import fcntl

    root = ram_root()
    _remove_stale(root)
    with signals_unwind():
        # Made under a name stale removal does not look at, locked, then renamed to its own:
        # no other process ever sees it unlocked.
        staging = Path(tempfile.mkdtemp(prefix=f".{_PREFIX}new-", dir=root))
        folder = staging
        lock = -1
        try:
            os.chmod(staging, 0o700)  # mkdtemp does; said again because it is the point
            lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(lock, fcntl.LOCK_EX)
            folder = staging.with_name(
                f"{_PREFIX}{os.getpid()}{_HELD}{staging.name.rsplit('-', 1)[1]}")
            os.rename(staging, folder)
            _OPEN.add(folder.resolve())
            yield folder
        finally:
            _OPEN.discard(folder.resolve())
            shutil.rmtree(folder, ignore_errors=True)
            if lock >= 0:
                os.close(lock)


#: The RAM folders this process holds open (:func:`ram_folder`).
_OPEN: set[Path] = set()


def inside_ram_folder(path: str | os.PathLike[str]) -> bool:
    """Is ``path`` inside a RAM folder this process holds open: where cubepack itself may write
    a private cube's plaintext (it is never a disk, and goes with the block)?"""
    resolved = Path(path).absolute().resolve()
    return any(resolved == folder or folder in resolved.parents for folder in list(_OPEN))


def anonymous_memory(size: int) -> mmap.mmap | bytearray:
    """``size`` zero bytes of private anonymous memory (no file, no name), writable, freed when
    the last reference (the map, a buffer or tensor viewing it) goes away; an empty bytearray
    for 0 bytes (there is no empty map).

    Advised as huge pages (2 MiB: one page fault and one zeroing per 2 MiB instead of per
    4 KiB; 210 MB faulted in took 20 ms against 100 ms with 4 KiB pages and 220 ms for a
    memfd, whose shmem pages are not huge by default, on the project's 2-core machine) and
    kept out of core dumps (a crash must not write the plaintext to a disk). Not populated
    up front: the threads that write it fault their own parts in, in parallel. Where
    ``madvise`` or an advice is missing (not Linux, an old kernel), the memory is the same,
    only slower to fill (or, without MADV_DONTDUMP, in a core dump).
    """
    if size == 0:
        return bytearray()
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _remember_region(memory, size)
    return _advised(memory, "MADV_HUGEPAGE", "MADV_DONTDUMP")


#: (start, end) of each live private anonymous map: plaintext of a private cube, which
#: cubepack's writers refuse (:func:`holds_plaintext`). Forgotten when the map is freed.
_REGIONS: dict[int, tuple[int, int]] = {}


def _remember_region(memory: mmap.mmap, size: int) -> None:
    import ctypes
    import weakref

    try:
        start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    except (TypeError, ValueError):  # a read-only map: not one plaintext is decrypted into
        return
    key = id(memory)
    _REGIONS[key] = (start, start + size)
    weakref.finalize(memory, _REGIONS.pop, key, None)


def holds_plaintext(address: int) -> bool:
    """Is the byte at ``address`` (a tensor's ``data_ptr``) a private cube's plaintext that
    cubepack decrypted: in one of its private anonymous maps (:func:`anonymous_memory`), an
    anonymous memory file it named (:func:`empty_memory_file`), or a file of a RAM folder
    (:func:`ram_folder`, mapped by a reader)? A copy the program made elsewhere is not seen."""
    if any(start <= address < end for start, end in list(_REGIONS.values())):
        return True
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, _, end = fields[0].partition("-")
                if int(start, 16) <= address < int(end, 16):
                    return len(fields) > 5 and _PREFIX in fields[5]
    except OSError:  # not Linux: only the maps remembered above are known
        pass
    return False


def _advised(memory: mmap.mmap, *advice: str) -> mmap.mmap:
    """``memory`` given each ``advice`` this system has (out of core dumps: MADV_DONTDUMP)."""
    for name in advice:
        if hasattr(mmap, name) and hasattr(memory, "madvise"):
            with contextlib.suppress(OSError):  # THP off, or an advice this kernel lacks
                memory.madvise(getattr(mmap, name))
    return memory


def writable_map(fd: int, size: int) -> mmap.mmap | bytearray:
    """A shared, writable map of the first ``size`` bytes of the file ``fd`` (grown to
    ``size``), kept out of core dumps while it lives: for a decryption that writes a RAM
    folder's file, or a memory file, in place, so the plaintext never passes through the
    heap. An empty bytearray for 0 bytes (there is no empty map)."""
    os.ftruncate(fd, size)
    if size == 0:
        return bytearray()
    return _advised(mmap.mmap(fd, size, flags=mmap.MAP_SHARED), "MADV_DONTDUMP")


def readable_map(fd: int) -> mmap.mmap | bytes:
    """The whole file ``fd`` (a RAM folder's), mapped read-only and kept out of core dumps:
    its tmpfs pages, read in place, not copied into the heap; unmapped with its last
    reference. Empty bytes for an empty file (there is no empty map)."""
    if os.fstat(fd).st_size == 0:
        return b""
    return _advised(mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ),
                    "MADV_DONTDUMP")


def empty_memory_file(name: str, size: int) -> int:
    """An anonymous in-memory file of ``size`` zero bytes (its fd), for a writer that maps it.

    Raises:
        UnsupportedError: no ``memfd_create`` here (not Linux).
    """
    if not hasattr(os, "memfd_create"):
        raise UnsupportedError("Loading a private file decrypts it to an anonymous memory file "
                               "(memfd_create), which this system lacks; cubepack never writes "
                               "the plaintext to a disk.")
    # Named for what it holds, so a reader of /proc/self/maps (holds_plaintext) knows it.
    fd = os.memfd_create(_PREFIX + name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd
