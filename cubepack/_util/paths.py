"""Path safety: the one place that decides whether a path inside a cube may be used.

A cube comes from someone else. Its lock and its file tree may name ``../../.ssh/id_rsa``, an
absolute path, a symlink to ``/etc``, or two names that collide on a case-insensitive or
unicode-normalising file system. Everything cubepack reads or writes inside a cube goes
through :func:`check_relpath` and :func:`list_cube_files` first.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path, PurePosixPath

from ..errors import UnsafeInputError
from . import atomic
from .constants import cache_dir

MAX_PATH_LENGTH = 1024
#: Device names Windows reserves in every folder, in any case and with any extension
#: (``aux.txt`` is the AUX device): such a file cannot be created there.
WINDOWS_RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
                             | {f"{port}{n}" for port in ("COM", "LPT") for n in "0123456789¹²³"})
#: Characters Windows forbids in file names (backslash and control characters are refused
#: everywhere, below).
WINDOWS_FORBIDDEN = frozenset('<>:"|?*')


def check_relpath(name: object) -> str:
    """Return ``name`` if it is a safe relative POSIX path inside a cube; else raise.

    Safe means: a non-empty string, relative, ``/``-separated, no ``.``/``..``/empty segments,
    no backslash, NUL or control character, NFC-normalised, at most 1024 characters; and a name
    every common file system can hold, since a cube is meant to be pulled anywhere: none of
    ``<>:"|?*``, no segment ending in a dot or a space (Windows strips them, so ``a.`` would
    be ``a``), no segment that is a Windows device name (CON, PRN, AUX, NUL, COM0-9, LPT0-9,
    in any case, with or without an extension). (A repo on the local endpoint takes what the
    Hub takes: :func:`cubepack.localhub._ids.repo_path`.)
    """
    if not isinstance(name, str) or not name:
        _refuse(name, "is not a non-empty string", "name the file")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.walk gives undecodable bytes as surrogates
        _refuse(name.encode("utf-8", "backslashreplace").decode(), "is not valid UTF-8; the "
                "Hub and other systems cannot hold it")
    if len(name) > MAX_PATH_LENGTH:
        _refuse(name[:60] + "...", f"is longer than {MAX_PATH_LENGTH} characters",
                "shorten it")
    if name.startswith("/") or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        _refuse(name, "is absolute; cube paths must be relative", "name it relative to the cube")
    if "\\" in name or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        _refuse(name, "contains a backslash or control character")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        _refuse(name, "has an empty, '.' or '..' segment; it could escape the cube")
    forbidden = sorted(set(name) & WINDOWS_FORBIDDEN)
    if forbidden:
        _refuse(name, f"contains {''.join(forbidden)!r}, which Windows forbids in file names "
                '(<>:"|?*); cubes are pulled on every system')
    for part in parts:
        whole = part == name  # then the segment is not named again
        if part.endswith((".", " ")):
            _refuse(name, ("is a name" if whole else f"has a segment ({part!r})")
                    + " ending in a dot or a space, which Windows strips, naming another file")
        if part.split(".", 1)[0].rstrip(" ").upper() in WINDOWS_RESERVED:
            _refuse(name, ("is" if whole else f"has the segment {part!r},") + " a device name "
                    "Windows reserves (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with any extension); "
                    "it cannot be a file there")
    if unicodedata.normalize("NFC", name) != name:
        _refuse(name, "is not NFC-normalised; it could alias another file on some file "
                "systems", "rename it (its NFC form is "
                f"{unicodedata.normalize('NFC', name)!r})")
    return name


def _refuse(name: object, reason: str, fix: str = "rename it") -> None:
    """Raise the path rule's refusal: the name once, why, and what to do. ``reason`` (with the
    fix, no name, no closing period) is kept on the error for a list that names each path
    itself (:func:`scan_cube`)."""
    error = UnsafeInputError(f"Path {name!r} {reason}; {fix}.")
    error.reason = f"{reason}; {fix}"
    raise error


def _folded(name: str) -> str:
    """What a case-insensitive, Unicode-normalising file system sees (NFKC after case
    folding the decomposed form: ``Cafe\u0301``, ``CAFÉ`` and ``ｃａｆé`` are one name)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKD", name).casefold())


def check_no_collisions(names: list[str]) -> None:
    """Refuse two paths that name the same file or folder on a case-insensitive or normalising
    file system (Windows, macOS), folder by folder (``Docs/a`` and ``docs/b`` land in one
    folder there), and a path that is both a file and a folder."""
    seen: dict[str, str] = {}
    files = set(names)
    for name in names:
        parts = name.split("/")
        for end in range(1, len(parts) + 1):
            prefix = "/".join(parts[:end])
            other = seen.setdefault(_folded(prefix), prefix)
            if other != prefix:
                raise UnsafeInputError(f"Paths {other!r} and {prefix!r} collide on "
                                       "case-insensitive or Unicode-normalising file systems "
                                       "(Windows, macOS); rename one of them.")
            if end < len(parts) and prefix in files:
                raise UnsafeInputError(f"Path {prefix!r} is both a file and a folder "
                                       f"(holding {name!r}); rename one of them.")


def resolve_inside(root: Path, name: str) -> Path:
    """``root / name`` after checking ``name``; the result never leaves ``root``."""
    check_relpath(name)
    return root / Path(*name.split("/"))


def regular_file(root: Path, name: str) -> Path:
    """``root / name`` once ``name`` passes the path rule and, by ``lstat``, ``root`` and every
    folder on the way are real folders and the file a regular file: the result never leads
    through a symlink, so nothing outside ``root`` is reached."""
    parts = check_relpath(name).split("/")
    path = Path(root)
    for depth in range(len(parts) + 1):
        path = path / parts[depth - 1] if depth else path
        mode = os.lstat(path).st_mode  # a symlink is neither a folder nor a regular file here
        if not (stat.S_ISREG(mode) if depth == len(parts) else stat.S_ISDIR(mode)):
            raise UnsafeInputError(f"{path} is a symlink or not a regular "
                                   f"{'file' if depth == len(parts) else 'folder'}; refusing "
                                   "to follow it.")
    return path


def hf_snapshot_blobs(root: Path) -> Path | None:
    """The blobs folder when ``root`` is an HF-cache snapshot (``<repo>/snapshots/<commit>``),
    whose files are symlinks into that repo's own ``blobs/``; else None."""
    root = Path(os.path.abspath(root))
    blobs = root.parent.parent / "blobs"
    name = root.name
    if (root.parent.name == "snapshots" and len(name) == 40 and all(c in "0123456789abcdef"
                                                                     for c in name)
            and blobs.is_dir() and not blobs.is_symlink()):
        return blobs
    return None


def _link_into(path: Path, blobs: Path | None) -> bool:
    """Is ``path`` a symlink to a regular file directly inside ``blobs``?"""
    if blobs is None:
        return False
    real = Path(os.path.realpath(path))
    return real.parent == Path(os.path.realpath(blobs)) and real.is_file()


def scan_cube(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Walk ``root`` without following links; return (regular files, problems).

    Each problem is (relative path, description): a symlink, a special file or an unsafe
    name. Symlinked folders are reported, never entered. In an HF-cache snapshot folder, a
    symlink to a file in that repo's own ``blobs/`` is a file like any other (that is how the
    cache stores them); any other link is still a problem.
    """
    blobs = hf_snapshot_blobs(root)
    root = Path(root)
    if root.is_symlink():
        return [], [(str(root), "is a symlink, where the cube folder must be a folder; name "
                     "the folder it points to")]
    if not root.is_dir():
        return [], [(str(root), "is not a folder; name the cube's folder")]
    found: list[str] = []
    problems: list[tuple[str, str]] = []
    for directory, subdirs, files in os.walk(root, followlinks=False):
        base = Path(directory)
        for name in sorted(subdirs) + sorted(files):
            full = base / name
            rel = full.relative_to(root).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode) and _link_into(full, blobs):
                mode = stat.S_IFREG  # a cached file: checked below as a regular one
            if stat.S_ISLNK(mode):
                where = ("points outside this HF-cache repo's blobs; remove it" if blobs is not None
                         else "is a symlink; cubes may hold regular files only: replace it "
                         "with a copy of the file it points to (cp -L), or remove it")
                problems.append((rel, where))
            elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                problems.append((rel, "is not a regular file (a device, FIFO or socket); "
                                 "remove it"))
            elif stat.S_ISREG(mode):
                try:
                    found.append(check_relpath(rel))
                except UnsafeInputError as exc:  # its reason: the path is named once, here
                    problems.append((rel, getattr(exc, "reason", str(exc).rstrip("."))))
    found.sort()
    try:
        check_no_collisions(found)
    except UnsafeInputError as exc:
        problems.append(("", str(exc).rstrip(".")))
    return found, problems


def list_cube_files(root: Path) -> list[str]:
    """Every regular file below ``root`` as sorted relative POSIX paths.

    Raises:
        UnsafeInputError: a symlink or a special file (device, FIFO, socket) anywhere inside,
            or a file name that is not a safe cube path.
    """
    found, problems = scan_cube(root)
    if problems:
        where, what = problems[0]
        raise UnsafeInputError(f"Path {where!r} {what}." if where else f"{what}.")
    return found


# --- cubepack's own folders (the MemOS hook's managed cubes) ------------------------------------

#: Symlinks followed while resolving one root path, as the kernel's own limit (ELOOP).
MAX_SYMLINKS = 40


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # POSIX only: elsewhere there is no owner to check
    return getuid() if getuid is not None else None


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def resolve_owned_root(root: Path, what: str) -> Path:
    """``root`` (a folder the user configured, e.g. ``$CUBEPACK_CACHE``) with each symlink on
    its path resolved once, component by component: a symlink is followed only when it is owned
    by this user or by root (system links such as macOS's ``/var``), since anyone else who owns
    one can point it elsewhere at any time. Components that do not exist yet are kept as
    named (cubepack creates them). ``what`` names the setting, for messages.

    Raises:
        UnsafeInputError: a symlink owned by someone else, or a loop, naming it.
    """
    uid = _uid()
    path = Path(os.path.join(os.getcwd(), os.path.expanduser(str(root))))
    pending = list(path.parts[1:])
    current = Path(path.parts[0])
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            return Path(candidate, *pending)
        if not stat.S_ISLNK(info.st_mode):
            current = candidate
            continue
        if uid is not None and info.st_uid not in (uid, 0):
            raise UnsafeInputError(
                f"{candidate}, on the path of {what} ({root}), is a symlink owned by "
                f"{_owner(info.st_uid)}, who can point it anywhere at any time; refusing to place "
                f"or remove cubes through it. Set {what} to a path without it (or whose symlinks "
                "you own).")
        hops += 1
        if hops > MAX_SYMLINKS:
            raise UnsafeInputError(f"The path of {what} ({root}) goes through more than "
                                   f"{MAX_SYMLINKS} symlinks (a loop?) at {candidate}.")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            current = Path(target.parts[0])
            pending = list(target.parts[1:]) + pending
        else:
            pending = list(target.parts) + pending
    return current


def owned_folder(path: Path, *, create: bool, why: str) -> bool:
    """Check (creating it first with ``create``) that ``path`` is a real folder owned by this
    user, by ``lstat`` (a symlink is never followed); False when it is absent (only without
    ``create``). ``why`` ends the refusal: what the folder is for.

    Raises:
        UnsafeInputError: a symlink, not a folder, or someone else's folder, naming it.
    """
    if create:
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeInputError(
            f"{path} is a symlink (to {os.readlink(path)}), where cubepack keeps {why}: whoever "
            "made it could redirect what cubepack places or removes there. Remove the link; "
            "cubepack creates the folder itself.")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeInputError(f"{path} is not a folder, where cubepack keeps {why}. Remove it.")
    uid = _uid()
    if uid is not None and info.st_uid != uid:
        raise UnsafeInputError(
            f"{path} belongs to {_owner(info.st_uid)}, not to you, where cubepack keeps {why}: its "
            "owner could swap its content after cubepack verified it. Remove it (cubepack "
            "creates its own), or set CUBEPACK_CACHE to a folder of yours.")
    return True


def managed_folder(root: Path, parts: tuple[str, ...], *, what: str,
                   create_last: bool = True) -> Path:
    """``root/parts...`` for cubepack's own folders below a configured root: the root resolved
    by :func:`resolve_owned_root` (created if missing; it must be a folder owned by you or root,
    and if group or others may write it, sticky like ``/tmp``, so nobody else can rename what
    cubepack makes in it), then each part a real folder owned by you, never a symlink (created
    when missing; the last one only with ``create_last``, else checked if present). Returns the
    path through the resolved root, for every later use.

    Raises:
        UnsafeInputError: naming the component and what to do.
    """
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\\" in part:
            raise UnsafeInputError(f"{part!r} is not a folder name cubepack may make.")
    with atomic.placing(root, elsewhere=f"set {what} to a writable folder"):
        return _managed_folder(root, parts, what=what, create_last=create_last)


def _managed_folder(root: Path, parts: tuple[str, ...], *, what: str, create_last: bool) -> Path:
    base = resolve_owned_root(root, what)
    os.makedirs(base, exist_ok=True)
    base = resolve_owned_root(base, what)  # what now exists, as it is now
    info = os.stat(base)
    uid = _uid()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeInputError(f"{what} ({base}) is not a folder.")
    if uid is not None and (info.st_uid not in (uid, 0) or (
            info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX)):
        raise UnsafeInputError(
            f"{what} ({base}) can be written by others ({_owner(info.st_uid)}, mode "
            f"{stat.filemode(info.st_mode)}), who could rename what cubepack places there after "
            f"it was verified. Set {what} to a folder only you can write.")
    current = base
    for index, part in enumerate(parts):
        current = current / part
        last = index == len(parts) - 1
        if not owned_folder(current, create=create_last or not last,
                            why=f"the cubes it pulls ({what})"):
            break
    return current


def managed_cube_folder(*parts: str, create_last: bool = True) -> Path:
    """``$CUBEPACK_CACHE/cubes/<parts...>``, where the MemOS hook places the cubes it pulls and
    clones, checked by :func:`managed_folder`: before anything is placed there or removed."""
    return managed_folder(cache_dir(), ("cubes", *parts), what="CUBEPACK_CACHE",
                          create_last=create_last)


# --- model names: a path on this machine, or a Hub id ----------------------------------------

def names_a_path(name: object) -> bool:
    """Does a model name denote a path on this machine rather than a Hub id? The one rule
    (resolving, pinning, renaming at pack, refusing at push): an absolute path; one starting
    with ``~`` or ``.``; one with more than one ``/`` (a Hub id is ``name`` or
    ``owner/name``); or any name that is an existing folder here (transformers loads a folder
    before it asks the Hub, so ``models/llama`` beside the working directory is a path)."""
    if not isinstance(name, str) or not name:
        return False
    return (os.path.isabs(name) or name.startswith(("~", ".")) or name.count("/") > 1
            or os.path.isdir(os.path.expanduser(name)))
