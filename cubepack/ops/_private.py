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

- :func:`encrypt`: a verified clear cube -> a private one, in place and atomically;
- :func:`open_private`: the clear cube of a private one, in memory (a RAM folder), with its
  manifest; every reader that needs the plaintext goes through it;
- :func:`rekey`: new recipients (every file re-encrypted to new file keys).

Signatures sign the public lock, which lists every ciphertext's sha256: encrypt-then-sign. age
does not authenticate senders: anyone who can push can replace an unsigned private cube.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import resolve_inside
from .._util.ramdir import ram_folder
from .._version import __version__
from ..errors import CubepackError, FormatError, IntegrityError, UsageError
from ..format import _card as card
from ..format import _cubeconfig as cubeconfig
from ..format import _fileset as fileset
from ..format import _lock as lockfile
from ..trust import _age as age
from ..trust._signing import check_key

__all__ = ["EncryptResult", "PrivateCube", "encrypt", "is_private", "open_private", "rekey"]


@dataclass
class EncryptResult:
    """What ``encrypt`` (or ``rekey``) wrote: the public lock's digest, the recipients, how
    many files are ciphertexts, whether names are hidden and whether the cube is signed."""

    cube_dir: Path
    digest: str
    recipients: list[str]
    ciphertexts: int
    hidden_names: bool
    signed: bool
    rotated: bool = True
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cube_dir": str(self.cube_dir), "digest": self.digest,
                "recipients": self.recipients, "ciphertexts": self.ciphertexts,
                "hidden_names": self.hidden_names, "signed": self.signed,
                "rotated": self.rotated, "added": self.added, "removed": self.removed}


def is_private(lock: dict[str, Any] | None) -> bool:
    """Is ``lock`` (a parsed lock) a private cube's?"""
    return bool(lock) and "encryption" in lock


def encrypt(cube_dir: str | Path, recipients: list[str] | tuple[str, ...], *,
            hide_names: bool = False, sign_key: str | Path | None = None,
            sign_password: str | None = None, progress: bool | None = None) -> EncryptResult:
    """Encrypt the packed cube at ``cube_dir`` to ``recipients`` (age X25519 keys, SSH
    ed25519/RSA public keys, or files of them), in place and atomically: the cube is verified
    first (a cube that does not verify is never encrypted), then written whole beside itself and
    swapped in. ``hide_names``: ciphertexts are named ``private/<random>.age``, so file names
    carry no item id. ``sign_key``: sign the private cube (its public lock: encrypt-then-sign).

    Raises:
        VerificationFailed: the clear cube does not verify.
        UsageError: no or an invalid recipient; the cube is already private (use rekey).
    """
    from ._verify import verify

    cube = Path(cube_dir)
    parsed = age.parse_recipients(list(recipients))
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    report = verify(cube, progress=progress)
    lock = report.lock or {}
    if is_private(lock):
        raise UsageError(f"{cube} is already a private cube; change its recipients with "
                         "cubepack rekey.")
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    clear = {name: resolve_inside(cube, name) for name in sorted(lock["files"])}
    clear[constants.LOCK_FILENAME] = cube / constants.LOCK_FILENAME
    names = {fileset.ciphertext_name(name, secrets.token_hex(16) if hide_names else None): name
             for name in clear}

    def read(name: str) -> bytes:
        data = clear[name].read_bytes()
        expected = (lock["files"].get(name) or {}).get("sha256") if name in lock["files"] \
            else hashlib.sha256(lock_bytes).hexdigest()
        if hashlib.sha256(data).hexdigest() != expected:
            raise IntegrityError(f"{name} changed after the cube was verified; nothing was "
                                 "encrypted. Pack the cube again.")
        return data

    result = _write_private(cube, lock, lock_bytes.decode("utf-8"), names, read, parsed,
                            hidden=hide_names)
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed = True
    return result


def _write_private(cube: Path, lock: dict[str, Any], lock_text: str, names: dict[str, str],
                   read: Any, recipients: list[age.Recipient], *, hidden: bool) -> EncryptResult:
    """Write the private cube (ciphertexts, manifest, public lock, cubepack.yaml and card) in a
    staging folder beside ``cube`` and swap it in. ``read(clear name)`` gives each plaintext."""
    staging = atomic.staging_dir(cube, "encrypt")
    try:
        for cipher, name in sorted(names.items()):
            atomic.write_bytes(resolve_inside(staging, cipher), age.encrypt(read(name),
                                                                            recipients))
        manifest = age.encrypt(age.manifest_bytes(lock_text, names, recipients), recipients)
        atomic.write_bytes(staging / fileset.PRIVATE_MANIFEST, manifest)
        public = _public_lock(staging, lock, names, recipients, hidden=hidden)
        atomic.replace_dir(staging, cube)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return EncryptResult(cube_dir=cube, digest=public["digest"],
                         recipients=sorted(r.text for r in recipients),
                         ciphertexts=len(names), hidden_names=hidden, signed=False)


def _public_lock(staging: Path, lock: dict[str, Any], names: dict[str, str],
                 recipients: list[age.Recipient], *, hidden: bool) -> dict[str, Any]:
    """The public files of a private cube: cubepack.yaml (pins, and which ciphertext holds
    which kind of memory), the card and the version-5 lock. Nothing here is a plaintext's
    digest, text, id (beyond the names when they are not hidden) or vector."""
    cipher_of = {clear: cipher for cipher, clear in names.items()}
    models = {role: {key: value for key, value in pin.items() if key != "vectors"}
              for role, pin in lock["models"].items()}
    memories = _memory_kinds(lock, cipher_of)
    config_text = cubeconfig.dumps(cubeconfig.build(cube_id=lock["cube_id"], models=models,
                                                    memories=memories))
    atomic.write_text(staging / constants.CONFIG_FILENAME, config_text)
    files = {name: _entry(staging / name) for name in
             [*sorted(names), fileset.PRIVATE_MANIFEST, constants.CONFIG_FILENAME]}
    encryption = {"version": lockfile.ENCRYPTION_VERSION, "scheme": lockfile.ENCRYPTION_SCHEME,
                  "manifest": fileset.PRIVATE_MANIFEST, "ciphertexts": sorted(names),
                  "counts": {"files": len(lock["files"]),
                             "activations": len(lock["activations"]),
                             "adapters": len(lock.get("adapters") or {}),
                             "recipients": len(recipients)},
                  "hidden_names": hidden}
    draft = lockfile.build_lock(cube_id=lock["cube_id"], files=files, models=models,
                                activations={}, cubepack_version=__version__,
                                encryption=encryption)
    title = lock["cube_id"] if isinstance(lock["cube_id"], str) and lock["cube_id"] else \
        "private cube"
    text = card.render(lock=draft, memories=memories, pretty_name=title, license=None,
                       repo_id=title if "/" in title else "OWNER/CUBE",
                       cubepack_version=__version__, memos=True)
    text += PRIVATE_CARD.format(files=len(lock["files"]), activations=len(lock["activations"]),
                                recipients=len(recipients))
    atomic.write_text(staging / constants.CARD_FILENAME, text)
    files[constants.CARD_FILENAME] = _entry(staging / constants.CARD_FILENAME)
    public = lockfile.build_lock(cube_id=lock["cube_id"], files=files, models=models,
                                 activations={}, cubepack_version=__version__,
                                 encryption=encryption)
    atomic.write_text(staging / constants.LOCK_FILENAME, lockfile.dumps(public))
    return public


#: What the public card of a private cube says of it.
PRIVATE_CARD = """
## Private cube

Every file of this cube ({files} files, {activations} KV caches) is encrypted with
[age](https://age-encryption.org) to {recipients} recipient(s); its lock lists the
ciphertexts. Anyone can check it without a key (`cubepack verify`); a recipient opens it in
memory only: `cubepack pull REPO --identity KEY` (or `CUBEPACK_IDENTITY`).
"""


def _memory_kinds(lock: dict[str, Any], cipher_of: dict[str, str]) -> dict[str, list[str]]:
    """Which ciphertexts hold activations, parametric memory, and the rest, by the clear
    lock's own sections (the clear cubepack.yaml is itself encrypted)."""
    activations = {entry["file"] for entry in lock["activations"].values()}
    adapters = {entry[key] for entry in (lock.get("adapters") or {}).values()
                for key in ("config_file", "weights_file")}
    kinds: dict[str, list[str]] = {"activation": [], "parametric": [], "other": []}
    for clear, cipher in sorted(cipher_of.items()):
        kind = "activation" if clear in activations else "parametric" if clear in adapters \
            else "other"
        kinds[kind].append(cipher)
    return {kind: names for kind, names in kinds.items() if names}


def _entry(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _sign(cube: Path, key: str | Path, password: str | None) -> None:
    from ._sign import sign

    sign(cube, key, password=password)


@dataclass
class PrivateCube:
    """A private cube opened in memory: ``folder`` (a RAM folder) holds the clear cube byte
    for byte, ``lock`` its clear lock, ``manifest`` the decrypted manifest."""

    folder: Path
    lock: dict[str, Any]
    manifest: dict[str, Any]
    public_lock: dict[str, Any]


@contextlib.contextmanager
def open_private(cube_dir: str | Path, identity: str | os.PathLike[str],
                 public_lock: dict[str, Any] | None = None) -> Iterator[PrivateCube]:
    """Decrypt the private cube at ``cube_dir`` with the identity file ``identity`` into a RAM
    folder (never a disk) for the block's duration. Each ciphertext must be the public lock's
    bytes (its sha256) before it is decrypted; each plaintext must be the manifest's (its
    sha256, from the clear lock) before it is written.

    ``public_lock``: the cube's public lock, already parsed and its files already proven
    intact by the caller (verify); without it, it is read and the ciphertexts hashed here.

    Raises:
        DecryptionFailed: the identity is not a recipient, or a ciphertext fails age's check.
        IntegrityError: a ciphertext is not the lock's, or a plaintext not the manifest's.
        FormatError: the manifest, or the clear lock it holds, is malformed.
    """
    cube = Path(cube_dir)
    identities = age.load_identities(identity)
    if public_lock is None:
        public_lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    if not is_private(public_lock):
        raise UsageError(f"{cube} is not a private cube (its lock has no encryption section).")
    files = public_lock["files"]

    def ciphertext(name: str) -> bytes:
        data = resolve_inside(cube, name).read_bytes()
        if hashlib.sha256(data).hexdigest() != files[name]["sha256"]:
            raise IntegrityError(f"{name} is not the ciphertext the cube's lock records (its "
                                 "sha256 differs); refusing to decrypt it. Pull the cube again.")
        return data

    manifest_name = public_lock["encryption"]["manifest"]
    manifest = age.parse_manifest(age.decrypt(ciphertext(manifest_name), identities,
                                              manifest_name))
    lock_text = manifest["lock"]
    try:
        lock = lockfile.parse(lock_text.encode("utf-8"))
    except CubepackError as exc:
        raise FormatError(f"The private manifest's lock is refused: {exc}") from None
    names = manifest["names"]
    expected = {fileset.ciphertext_name(name) for name in [*lock["files"],
                                                            constants.LOCK_FILENAME]}
    ciphers = set(public_lock["encryption"]["ciphertexts"])
    clear_names = set(names.values())
    if set(names) != ciphers or clear_names != set(lock["files"]) | {constants.LOCK_FILENAME} \
            or (not public_lock["encryption"]["hidden_names"] and set(names) != expected):
        raise FormatError("The private manifest and the public lock disagree on the "
                          "ciphertexts (the manifest maps each ciphertext to one clear file of "
                          "its lock, and the lock lists exactly those).")
    _agree(public_lock, lock, manifest)
    with ram_folder() as folder:
        for cipher, name in sorted(names.items()):
            plain = age.decrypt(ciphertext(cipher), identities, cipher)
            digest = hashlib.sha256(plain).hexdigest()
            wanted = hashlib.sha256(lock_text.encode("utf-8")).hexdigest() \
                if name == constants.LOCK_FILENAME else lock["files"][name]["sha256"]
            if digest != wanted:
                raise IntegrityError(f"{cipher} decrypts to other bytes than the manifest "
                                     "records for it; refusing the cube.")
            target = resolve_inside(folder, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(plain)
            del plain
        yield PrivateCube(folder=folder, lock=lock, manifest=manifest, public_lock=public_lock)


def _agree(public: dict[str, Any], lock: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The public lock says of the clear cube only what the clear lock says: the cube id, the
    pins (without vectors records), the counts."""
    problems = []
    if public["cube_id"] != lock["cube_id"]:
        problems.append("cube_id")
    models = {role: {k: v for k, v in pin.items() if k != "vectors"}
              for role, pin in lock["models"].items()}
    if canonical.dumps(models) != canonical.dumps(public["models"]):
        problems.append("models")
    counts = public["encryption"]["counts"]
    if counts != {"files": len(lock["files"]), "activations": len(lock["activations"]),
                  "adapters": len(lock.get("adapters") or {}),
                  "recipients": len(manifest["recipients"])}:
        problems.append("counts")
    if problems:
        raise IntegrityError(f"The public lock and the private manifest disagree on "
                             f"{', '.join(problems)}: the public lock was changed. Do not load "
                             "this cube.")


def rekey(cube_dir: str | Path, identity: str | os.PathLike[str], *,
          add: list[str] | tuple[str, ...] = (), remove: list[str] | tuple[str, ...] = (),
          rotate: bool = False, sign_key: str | Path | None = None,
          sign_password: str | None = None) -> EncryptResult:
    """Change a private cube's recipients: decrypt it in memory with ``identity``, then write
    every file again encrypted to the new set (``add``, minus ``remove``), in place and
    atomically, with the same clear content and the same ciphertext names.

    Every rekey draws new file keys (the age binding used does not expose a file key, so a
    header cannot be rewritten around the old one); ``rotate`` is accepted and states this.
    Removing a recipient does not revoke what they already downloaded. The files change, so
    a push uploads them again; the old signature no longer covers them: ``sign_key`` signs
    the new cube, else it is left unsigned (its signing files removed) and said so.

    Raises:
        UsageError: nothing to change, or no recipient left.
        DecryptionFailed: ``identity`` is not a recipient.
    """
    from ._verify import verify

    cube = Path(cube_dir)
    if not add and not remove:
        raise UsageError("Nothing to change: pass --add RECIPIENT and/or --remove RECIPIENT.")
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    report = verify(cube)  # intact ciphertexts before anything is decrypted
    added = age.parse_recipients(list(add)) if add else []
    removed = {r.text for r in age.parse_recipients(list(remove))} if remove else set()
    with open_private(cube, identity, public_lock=report.lock) as opened:
        current = {text: r for text in opened.manifest["recipients"]
                   for r in age.parse_recipients([text])}
        unknown = sorted(removed - set(current))
        if unknown:
            raise UsageError(f"Cannot remove {unknown[0][:60]}: it is not a recipient of this "
                             f"cube (its recipients: {len(current)}).")
        kept = {text: r for text, r in current.items() if text not in removed}
        for r in added:
            kept.setdefault(r.text, r)
        if not kept:
            raise UsageError("Removing every recipient would leave a cube nobody can open; add "
                             "one (--add) in the same rekey.")
        names = opened.manifest["names"]
        folder = opened.folder
        # The staging folder holds no signing files: the old signature, which cannot cover
        # the new ciphertexts, goes with the swap (and comes back only with sign_key).
        result = _write_private(cube, opened.lock, opened.manifest["lock"], names,
                                lambda name: resolve_inside(folder, name).read_bytes(),
                                list(kept.values()),
                                hidden=opened.public_lock["encryption"]["hidden_names"])
    result.added = sorted(r.text for r in added if r.text not in current)
    result.removed = sorted(removed)
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed = True
    return result
