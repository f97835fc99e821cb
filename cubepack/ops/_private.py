"""Private cubes (issue #32): encrypted to their readers, verified by anyone, decrypted only in
memory.

A private cube is a packed cube whose every file (memories, KV caches, prompts, adapters,
MemOS's files, and its own lock, ``cubepack.yaml`` and card) is an age file encrypted to the
cube's recipients, one file key per file, each file's plaintext the clear file byte for byte.
Beside them, in clear: a public lock (version 5, its ``encryption`` section naming the
ciphertexts; producer pins without vectors records; counts; the cube id), a public
``cubepack.yaml`` and card, and the private manifest ``cubepack.manifest.age``: the clear
cube's lock (every plaintext digest, item id and label), the ciphertext -> clear name map and
the recipients, encrypted like the rest. No digest of a plaintext is public.

- :func:`write_private`: the private cube's files, written whole and swapped in (``encrypt``
  and ``rekey``, in ``_encrypt``, call it);
- :func:`open_private`: the clear cube of a private one, in memory (a RAM folder), with its
  manifest; every reader that needs the plaintext goes through it (one file alone:
  ``decrypted_memory``, a buffer, or ``decrypted_file``, an anonymous memory file).

Signatures sign the public lock, which lists every ciphertext's sha256: encrypt-then-sign. age
does not authenticate senders: anyone who can push can replace an unsigned private cube.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import resolve_inside
from .._util.ramdir import (anonymous_memory, empty_memory_file, ram_folder, readable_map,
                            writable_map)
from .._util.safetensors_header import open_regular
from .._version import __version__
from ..errors import CubepackError, FormatError, IntegrityError, UsageError
from ..format import _card as card
from ..format import _cubeconfig as cubeconfig
from ..format import _fileset as fileset
from ..format import _lock as lockfile
from ..format.sections import Lock
from ..kinds import KINDS, counted
from ..trust import _age as age
from ..trust._age_range import head_digest

__all__ = ["EncryptResult", "PrivateCube", "decrypted_file", "decrypted_memory", "is_private",
           "mapped_plaintext", "open_private", "read_manifest", "recipient_stanzas",
           "write_private"]


@dataclass
class EncryptResult:
    """What ``encrypt`` (or ``rekey``) wrote: the public lock's digest, the recipients, how
    many files are ciphertexts, whether names are hidden and whether the cube is signed."""

    cube_dir: Path
    digest: str
    recipients: list[str]
    ciphertexts: int
    hidden_names: bool
    #: the private key the cube was signed with, or None: left unsigned
    signed_with: str | None
    rotated: bool = True
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    #: the private cube's series (encrypt draws one, or continues one; rekey keeps it)
    series: str | None = None
    #: its generation now (encrypt starts it, each rekey adds one)
    generation: int | None = None
    #: recipients a rekey added back after a generation removed them:
    #: ``[{"recipient", "removed_at"}]`` (``removed_at``: that generation, or None when only
    #: a newer generation this user saw records the removal)
    readded: list[dict[str, Any]] = field(default_factory=list)
    #: why the generation this process signed is not recorded as seen (a read-only cache), or
    #: None: recorded, or not signed
    unrecorded: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cube_dir": str(self.cube_dir), "digest": self.digest,
                "recipients": self.recipients, "ciphertexts": self.ciphertexts,
                "hidden_names": self.hidden_names, "signed_with": self.signed_with,
                "rotated": self.rotated, "added": self.added, "removed": self.removed,
                "series": self.series, "generation": self.generation,
                "readded": self.readded,
                "unrecorded": self.unrecorded}


def is_private(lock: Lock | None) -> bool:
    """Is ``lock`` (a parsed lock) a private cube's?"""
    return lock is not None and lock.private


def write_private(cube: Path, lock: Lock, lock_text: str, names: dict[str, str],
                   read: Any, recipients: list[age.Recipient], *, hidden: bool,
                   series: str, generation: int,
                   history: list[dict[str, Any]]) -> EncryptResult:
    """Write the private cube (ciphertexts, manifest, public lock, cubepack.yaml and card) in a
    staging folder beside ``cube`` and swap it in. ``read(clear name)`` gives each plaintext.
    ``series``, ``generation`` and the recipient ``history`` (ending at it) go into the
    manifest; the series and generation into the public lock too."""
    staging = atomic.staging_dir(cube, "encrypt")
    try:
        placeholder = {cipher: [1, "0" * 64] for cipher in names}
        age.manifest_bytes(lock_text, names, recipients, series=series, generation=generation,
                           history=history,
                           headers=placeholder)  # checked before any file is written
        headers = {}
        for cipher, name in sorted(names.items()):
            data = age.encrypt(read(name), recipients)
            headers[cipher] = list(head_digest(data))
            atomic.write_bytes(resolve_inside(staging, cipher), data)
            del data
        manifest = age.manifest_bytes(lock_text, names, recipients, series=series,
                                      generation=generation, history=history, headers=headers)
        atomic.write_bytes(staging / fileset.PRIVATE_MANIFEST, age.encrypt(manifest,
                                                                           recipients))
        public = _public_lock(staging, lock, names, recipients, hidden=hidden,
                              series=series, generation=generation)
        atomic.replace_dir(staging, cube)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return EncryptResult(cube_dir=cube, digest=public["digest"],
                         recipients=sorted(r.text for r in recipients),
                         ciphertexts=len(names), hidden_names=hidden, signed_with=None,
                         series=series, generation=generation)


def _public_lock(staging: Path, lock: Lock, names: dict[str, str],
                 recipients: list[age.Recipient], *, hidden: bool, series: str,
                 generation: int) -> dict[str, Any]:
    """The public files of a private cube: cubepack.yaml (pins, and which ciphertext holds
    which kind of memory), the card and the version-5 lock. Nothing here is a plaintext's
    digest, text, id (beyond the names when they are not hidden) or vector."""
    cipher_of = {clear: cipher for cipher, clear in names.items()}
    models = {role: pin.to_dict(vectors=False) for role, pin in lock.models.items()}
    memories = _memory_kinds(lock, cipher_of)
    config_text = cubeconfig.dumps(cubeconfig.build(cube_id=lock.cube_id, models=models,
                                                    memories=memories))
    atomic.write_text(staging / constants.CONFIG_FILENAME, config_text)
    files = {name: _entry(staging / name) for name in
             [*sorted(names), fileset.PRIVATE_MANIFEST, constants.CONFIG_FILENAME]}
    encryption = {"version": lockfile.ENCRYPTION_VERSION, "scheme": lockfile.ENCRYPTION_SCHEME,
                  "manifest": fileset.PRIVATE_MANIFEST, "ciphertexts": sorted(names),
                  "counts": _counts(lock, len(recipients)),
                  "hidden_names": hidden, "series": series, "generation": generation}
    draft = lockfile.build_lock(cube_id=lock.cube_id, files=files, models=models,
                                cubepack_version=__version__,
                                encryption=encryption)
    title = lock.cube_id or "private cube"
    text = card.render(lock=draft, memories=memories, pretty_name=title, license=None,
                       repo_id=title if "/" in title else "OWNER/CUBE",
                       cubepack_version=__version__, memos=True)
    text += PRIVATE_CARD.format(counted=counted(len(lock.files), _counts(lock, 0)),
                                recipients=len(recipients))
    atomic.write_text(staging / constants.CARD_FILENAME, text)
    files[constants.CARD_FILENAME] = _entry(staging / constants.CARD_FILENAME)
    public = lockfile.build_lock(cube_id=lock.cube_id, files=files, models=models,
                                 cubepack_version=__version__,
                                 encryption=encryption)
    atomic.write_text(staging / constants.LOCK_FILENAME, lockfile.dumps(public))
    return public


#: What the public card of a private cube says of it.
PRIVATE_CARD = """
## Private cube

Every file of this cube ({counted}) is encrypted with
[age](https://age-encryption.org) to {recipients} recipient(s); its lock lists the
ciphertexts. Anyone can check it without a key (`cubepack verify`); a recipient opens it in
memory only: `cubepack pull REPO --identity KEY` (or `CUBEPACK_IDENTITY`).
"""


def _counts(lock: Lock, recipients: int) -> dict[str, int]:
    """What a private cube's public lock counts of its clear lock (and its readers)."""
    counts = {"files": len(lock.files)}
    for kind in KINDS:
        counts.update(kind.counts(lock))
    return {**counts, "recipients": recipients}


def _memory_kinds(lock: Lock, cipher_of: dict[str, str]) -> dict[str, list[str]]:
    """Which ciphertexts hold each kind's memories (activations, parametric memory...), and
    the rest, by the clear lock's own sections (the clear cubepack.yaml is itself encrypted)."""
    held = [(kind.memory, kind.files(lock)) for kind in KINDS if kind.memory is not None]
    kinds: dict[str, list[str]] = {memory: [] for memory, _ in held}
    kinds["other"] = []
    for clear, cipher in sorted(cipher_of.items()):
        memory = next((memory for memory, files in held if clear in files), "other")
        kinds[memory].append(cipher)
    # Listed in the ciphertext names' own order: with hidden names, the clear names' order
    # would tell how the hidden item ids sort (and which file is the lock or the config).
    return {kind: sorted(names) for kind, names in kinds.items() if names}


def _entry(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


@contextlib.contextmanager
def _mapped_ciphertext(source: Path) -> Iterator[Any]:
    """The bytes of the age file ``source``, mapped read-only (an empty file: empty bytes,
    which the age reader refuses as such; there is no empty map)."""
    # As a clear KV file is opened: a missing path or a folder is a FormatError naming it, and
    # a FIFO is refused before a read could wait on it forever.
    with open_regular(source) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            yield b""
            return
        # Populated at once: the file is in the page cache after a pull, and one call maps it.
        with mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ,
                       flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) as mapped:
            yield mapped


def decrypted_memory(path: str | os.PathLike[str], identity: str | os.PathLike[str]) -> Any:
    """The plaintext of the age file at ``path`` in private anonymous memory (see
    :func:`~cubepack._util.ramdir.anonymous_memory`: no file, no name, out of core dumps),
    decrypted straight into it on one thread per core: a writable buffer for readers that
    take one (``load_kv_cache``: its tensors view it, no second copy), freed with the last
    reference to it. The fastest destination bench/private.py measured (huge pages, faulted
    in by the decrypting threads); readers that need a path take :func:`decrypted_file`.

    Raises:
        RefusedError: the identity is not a recipient, or the ciphertext fails age's checks.
        FormatError: not an age file, or a malformed one.
    """
    identities = age.load_identities(identity)
    source = Path(path)
    found: list[Any] = []

    def allocate(size: int) -> Any:
        found.append(anonymous_memory(size))
        return found[0]

    try:
        with _mapped_ciphertext(source) as ciphertext:  # named as given: two cubes share names
            age.decrypt_to(ciphertext, identities, os.fspath(path), allocate)
    except BaseException:
        _release(found)
        raise
    return found[0]


def _release(memories: list[Any]) -> None:
    """Free what a refused decryption allocated: every chunk before the damaged one was
    decrypted into it, and the refusal's traceback (kept by whoever logs or stores the error)
    would otherwise keep that plaintext alive."""
    for memory in memories:
        if isinstance(memory, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still out: freed with it instead
                memory.close()
    memories.clear()


@contextlib.contextmanager
def decrypted_file(path: str | os.PathLike[str],
                   identity: str | os.PathLike[str]) -> Iterator[Path]:
    """The plaintext of the age file at ``path``, as an anonymous memory file (no name in any
    file system), for the block's duration: a path readers can open or map (MLX, a
    safetensors reader). A map made of it outlives the block (the memory is freed with the
    last map). Slower to fill than :func:`decrypted_memory` (a memory file's pages are
    4 KiB), so only for readers that need a path."""
    identities = age.load_identities(identity)
    source = Path(path)
    name = source.name.removesuffix(fileset.CIPHER_SUFFIX)
    with _mapped_ciphertext(source) as ciphertext:
        maps: list[Any] = []
        fd = -1

        def allocate(size: int) -> Any:  # the plaintext is decrypted straight into the memfd
            nonlocal fd
            fd = empty_memory_file(name, 0)
            # Not populated up front: the decrypting threads fault their own parts in, in
            # parallel (210 MB decrypted into it in 175 ms against 225 ms with MAP_POPULATE).
            maps.append(writable_map(fd, size))
            return maps[0]

        try:
            age.decrypt_to(ciphertext, identities, os.fspath(path), allocate)
            _release(maps)
        except BaseException:
            _release(maps)
            if fd >= 0:
                os.close(fd)
            raise
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@dataclass
class PrivateCube:
    """A private cube opened in memory: ``folder`` (a RAM folder) holds the clear cube byte
    for byte, ``lock`` its clear lock, ``manifest`` the decrypted manifest."""

    folder: Path
    lock: dict[str, Any]
    manifest: dict[str, Any]
    public_lock: dict[str, Any]
    #: sha256 of each plaintext, taken as it was decrypted (verify does not hash them again)
    digests: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def open_private(cube_dir: str | Path, identity: str | os.PathLike[str],
                 public_lock: Lock | None = None) -> Iterator[PrivateCube]:
    """Decrypt the private cube at ``cube_dir`` with the identity file ``identity`` into a RAM
    folder (never a disk) for the block's duration. Each ciphertext must be the public lock's
    bytes (its sha256) before it is decrypted; each plaintext must be the manifest's (its
    sha256, from the clear lock) before it is written.

    ``public_lock``: the cube's public lock, already parsed and its files already proven
    intact by the caller (verify); without it, it is read and the ciphertexts hashed here.

    Raises:
        RefusedError: the identity is not a recipient, or a ciphertext fails age's check.
        IntegrityError: a ciphertext is not the lock's, or a plaintext not the manifest's.
        FormatError: the manifest, or the clear lock it holds, is malformed.
    """
    cube = Path(cube_dir)
    identities = age.load_identities(identity)
    if public_lock is None:
        public_lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    if not is_private(public_lock):
        raise UsageError(f"{cube} is not a private cube (its lock has no encryption section).")
    files = public_lock.files
    encryption = public_lock.encryption
    assert encryption is not None  # is_private

    def ciphertext(name: str) -> bytes:
        data = resolve_inside(cube, name).read_bytes()
        if hashlib.sha256(data).hexdigest() != files[name].sha256:
            raise IntegrityError(f"{name} is not the ciphertext the cube's lock records (its "
                                 "sha256 differs); refusing to decrypt it. Pull the cube again.")
        return data

    manifest, lock = read_manifest(public_lock, ciphertext(encryption.manifest), identities)
    lock_text, names = manifest["lock"], manifest["names"]
    digests: dict[str, str] = {}
    with ram_folder() as folder:
        for cipher, name in sorted(names.items()):
            target = resolve_inside(folder, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = _decrypt_into_file(ciphertext(cipher), identities, cipher, target)
            wanted = hashlib.sha256(lock_text.encode("utf-8")).hexdigest() \
                if name == constants.LOCK_FILENAME else lock.files[name].sha256
            if digest != wanted:
                raise IntegrityError(f"{cipher} decrypts to other bytes than the manifest "
                                     "records for it; refusing the cube.")
            digests[name] = digest
        yield PrivateCube(folder=folder, lock=lock, manifest=manifest, public_lock=public_lock,
                          digests=digests)


def read_manifest(public_lock: Lock, data: Any, identities: list[Any]) -> tuple[dict[str, Any],
                                                                              Lock]:
    """(the manifest, the clear lock it holds) of the private cube whose public lock is
    ``public_lock``, from ``data``: its manifest's ciphertext, which the caller checked against
    the public lock's sha256. The manifest must map exactly the public lock's ciphertexts to
    its clear lock's files (by their names, unless hidden), and agree with the public lock on
    the cube id, the pins, the counts, the series and the generation.

    Raises:
        RefusedError: the identities open no stanza, or the ciphertext fails age's checks.
        FormatError: the manifest, or the clear lock it holds, is malformed, or names other
            ciphertexts than the public lock.
        IntegrityError: the public lock says other things of the cube than the manifest.
    """
    encryption = public_lock.encryption
    assert encryption is not None  # a private cube's
    plain = age.decrypt(data, identities, encryption.manifest)
    try:
        manifest = age.parse_manifest(plain)
    finally:  # its parsed fields stay (Python objects); the decrypted bytes do not
        plain[:] = bytes(len(plain))
    try:
        lock = lockfile.parse(manifest["lock"].encode("utf-8"))
    except CubepackError as exc:
        raise FormatError(f"The private manifest's lock is refused: {exc}") from None
    names = manifest["names"]
    expected = {fileset.ciphertext_name(name) for name in [*lock.files,
                                                            constants.LOCK_FILENAME]}
    ciphers = set(encryption.ciphertexts)
    clear_names = set(names.values())
    if set(names) != ciphers or clear_names != set(lock.files) | {constants.LOCK_FILENAME} \
            or (not encryption.hidden_names and set(names) != expected):
        raise FormatError("The private manifest and the public lock disagree on the "
                          "ciphertexts (the manifest maps each ciphertext to one clear file of "
                          "its lock, and the lock lists exactly those).")
    _agree(public_lock, lock, manifest)
    return manifest, lock


def recipient_stanzas(cube: Path,
                      public_lock: Lock) -> dict[str, tuple[int, list[str]]]:
    """Each ciphertext of the private cube at ``cube`` (the manifest included) -> how many
    recipient stanzas its age header holds, and the types of any other stanza that is not
    grease (see :func:`cubepack.trust._age.recipient_stanzas`). Read without a key.

    Raises:
        FormatError: a file that is not an age file, or a malformed header.
    """
    section = public_lock.encryption
    assert section is not None
    grease = section.version < 2  # written through the age crate, which adds grease
    return {name: age.recipient_stanzas(_header_bytes(resolve_inside(cube, name)), name,
                                        grease=grease)
            for name in [*section.ciphertexts, section.manifest]}


#: The most of a ciphertext read looking for its age header (~98 bytes a recipient: a
#: header of 170,000 recipients), so a file without one is never read whole into memory.
MAX_HEADER_BYTES = 16 * 1024 * 1024


def _header_bytes(path: Path) -> bytes:
    """The start of the age file at ``path`` up to past its header's MAC line: a header is
    read, never a ciphertext of gigabytes (at most :data:`MAX_HEADER_BYTES`)."""
    with open_regular(path) as handle:
        data = handle.read(64 * 1024)
        while True:
            end = data.find(b"\n--- ")
            if end >= 0 and data.find(b"\n", end + 5) >= 0:
                return data
            more = handle.read(min(len(data), MAX_HEADER_BYTES - len(data)))
            if not more:
                if len(data) >= MAX_HEADER_BYTES:
                    raise FormatError(f"{path.name} has no age header in its first "
                                      f"{MAX_HEADER_BYTES // (1024 * 1024)} MiB.")
                return data
            data += more


def mapped_plaintext(path: Path) -> Any:
    """A RAM folder's file, mapped read-only (its tmpfs pages, not a heap copy; kept out of
    core dumps): what rekey re-encrypts. Unmapped when the last reference goes."""
    with open_regular(path) as handle:
        return readable_map(handle.fileno())


def _decrypt_into_file(data: bytes, identities: list[Any], what: str, target: Path) -> str:
    """Decrypt the age file ``data`` straight into the new file ``target`` (in a RAM folder:
    its pages are tmpfs, never the heap), through a shared map kept out of core dumps; the
    plaintext's sha256, hashed from that map."""
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    maps: list[Any] = []
    try:
        def allocate(size: int) -> Any:
            maps.append(writable_map(fd, size))
            return maps[0]

        age.decrypt_to(data, identities, what, allocate)
        return hashlib.sha256(maps[0]).hexdigest()
    finally:
        _release(maps)
        os.close(fd)


def _agree(public: Lock, lock: Lock, manifest: dict[str, Any]) -> None:
    """The public lock says of the clear cube only what the clear lock says: the cube id, the
    pins (without vectors records), the counts."""
    problems = []
    if public.cube_id != lock.cube_id:
        problems.append("cube_id")
    models = {role: pin.to_dict(vectors=False) for role, pin in lock.models.items()}
    if canonical.dumps(models) != canonical.dumps({role: pin.to_dict()
                                                   for role, pin in public.models.items()}):
        problems.append("models")
    assert public.encryption is not None
    if public.encryption.counts.to_dict() != _counts(lock, len(manifest["recipients"])):
        problems.append("counts")
    # A version-1 manifest has neither, and only a version-1 public lock may say none.
    if lockfile.series(public) != manifest["series"]:
        problems.append("series")
    if lockfile.generation(public) != manifest["generation"]:
        problems.append("generation")
    if problems:
        raise IntegrityError(f"The public lock and the private manifest disagree on "
                             f"{', '.join(problems)}: the public lock was changed. Do not load "
                             "this cube.")
