"""The age format (https://age-encryption.org/v1), for private cubes (``pip install
'cubepack[private]'``): recipients, identities, one file encrypted or decrypted, and the
encrypted manifest.

Every identity type decrypts natively on ``cryptography`` (:mod:`._age_stream`: the header,
X25519 and the STREAM payload; :mod:`._age_ssh`: the ssh-ed25519 and ssh-rsa stanzas), each
chunk straight into memory the caller owns (private anonymous memory kept out of core dumps,
a memory file, a RAM folder's file): no plaintext passes through a Python ``bytes`` or a
library's buffers that cubepack cannot clear. (pyrage, the age Rust crate's binding, which
cubepack used before, hands the plaintext back as ``bytes``.) Encryption is native too, for
every recipient type. The tests hold this implementation to C2SP's age test vectors, to
Debian's ``age`` CLI both ways for every identity type, and to pyrage.

An identity file holds age X25519 keys (``AGE-SECRET-KEY-1...`` lines, as ``age-keygen``
writes them) or one OpenSSH/PEM private key (ed25519 or RSA), passphrase-protected or not.
The passphrase of a protected key comes from :func:`unlock_identity` (the Python API), else
``$CUBEPACK_IDENTITY_PASSPHRASE`` (scripts), else a prompt on the terminal (``/dev/tty``,
never echoed, as ssh and age ask); with none of them, the key is refused naming all three.
An SSH key, once read (unlocked), is kept for the process's life (keyed by the file's inode
and mtime: a changed file is read again), so one command asks once.

Every error here names the file, never its bytes; an identity file's content and a
passphrase are never echoed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import canonical
from ..errors import CubepackError, FormatError, RefusedError, UnsafeInputError, UsageError
from ..format._content import AGE_MAGIC
from . import _age_ssh as _ssh
from . import _age_stream as _stream

logger = logging.getLogger("cubepack")

#: The environment variable naming an identity file when none is given.
IDENTITY_ENV = "CUBEPACK_IDENTITY"
#: The environment variable holding a passphrase-protected SSH identity's passphrase.
PASSPHRASE_ENV = "CUBEPACK_IDENTITY_PASSPHRASE"
#: The private manifest's format and version (the plaintext of ``cubepack.manifest.age``).
#: Version 2 (issue #37) adds the cube's ``series`` and ``generation`` (as its public lock
#: states them) and the recipient ``history``: who each generation added and removed, so a
#: rekey can say whom it would re-add. Version 1 is still read (no series, generation, history).
MANIFEST_FORMAT = "cubepack.private-manifest"
MANIFEST_VERSION = 3
MANIFEST_VERSIONS = (1, 2, 3)
MANIFEST_KEYS_V1 = frozenset({"format", "version", "lock", "names", "recipients"})
MANIFEST_KEYS_V2 = MANIFEST_KEYS_V1 | {"series", "generation", "history"}
#: Version 3 (issue #40) adds ``headers``: each ciphertext's header and nonce (where its payload
#: starts, their sha256), so a reader of part of a ciphertext (one memory of a private shard)
#: fetches only its chunks and binds the file key it unwraps to the one encrypt chose.
MANIFEST_KEYS = MANIFEST_KEYS_V2 | {"headers"}
#: One entry of the recipient history: the generation, and the recipients it added and removed.
HISTORY_KEYS = frozenset({"generation", "added", "removed"})
_MAX_IDENTITY_BYTES = 1024 * 1024
_MAX_RECIPIENTS_FILE = 1024 * 1024
_SECRET_PREFIX = "AGE-SECRET-KEY-"


def _require() -> None:
    if not _stream.available():
        raise CubepackError("Private cubes need the optional dependency cryptography: pip "
                            "install 'cubepack[private]'.")


@dataclass(frozen=True)
class Recipient:
    """One recipient: its text as written (``age1...``, ``ssh-ed25519 AAAA...``, the comment
    dropped) and the object that wraps a file key to it."""

    text: str
    value: Any


def _one_recipient(text: str, where: str) -> Recipient:
    _require()
    fields = text.split()
    if text.startswith("age1") and len(fields) == 1:
        public = _stream.bech32_bytes(text, "age")
        if public is None or len(public) != 32:
            raise UsageError(f"{where} is not a valid age recipient (its bech32 encoding or "
                             "checksum is wrong); expected an age X25519 key (age1...) or an "
                             "SSH public key (ssh-ed25519 / ssh-rsa).")
        return Recipient(text, _stream.X25519Recipient(public))
    if fields and fields[0] in ("ssh-ed25519", "ssh-rsa") and len(fields) >= 2:
        value = _ssh.recipient(fields[0], fields[1], where)
        # The key, not its spelling: the comment dropped and the base64 re-encoded from the
        # key's bytes (unused trailing bits, padding), so one key is one recipient everywhere
        # (the history, the re-added check, --remove, the stanza count).
        try:
            blob = base64.b64decode(fields[1] + "=" * (-len(fields[1]) % 4), validate=True)
        except (binascii.Error, ValueError):
            blob = None
        canonical_text = f"{fields[0]} {base64.b64encode(blob).decode('ascii')}" \
            if blob else f"{fields[0]} {fields[1]}"
        return Recipient(canonical_text, value)
    if fields and (fields[0] in UNSUPPORTED_SSH or fields[0].startswith("sk-")):
        raise UsageError(f"{where} is an SSH {fields[0]} key, a type age cannot encrypt to: use "
                         "an ssh-ed25519 or ssh-rsa key, or an age key (age1...).")
    raise UsageError(f"{where} is not an age recipient: expected an age X25519 key (age1...), "
                     "an SSH public key (ssh-ed25519 / ssh-rsa AAAA...), or a file of them, one "
                     "a line (e.g. https://github.com/USER.keys saved to a file).")


#: SSH public key types age has no recipient for (a keys file may hold them).
UNSUPPORTED_SSH = frozenset({"ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                             "ssh-dss"})


def canonical_recipient(text: str) -> str:
    """How cubepack names the recipient ``text`` (an age key, lower case; an SSH key's type and
    base64 re-encoded from its bytes), or ``text`` as it is when it does not parse: a record
    written by an older cubepack compares with a key as it is named now."""
    try:
        return _one_recipient(text.strip(), "a recorded recipient").text
    except CubepackError:
        return text


def _refuse_secret(text: str, where: str) -> None:
    """A secret key given where a public one belongs is refused without a byte of it echoed."""
    if text.upper().startswith("AGE-SECRET-KEY-") or "PRIVATE KEY-----" in text:
        raise UsageError(f"{where} is a secret key (an identity), not a recipient: never pass a "
                         "secret key as a recipient. Pass its public key (age-keygen -y "
                         "KEYFILE prints it; for SSH, the .pub file).")


def parse_recipients(specs: list[str] | tuple[str, ...]) -> list[Recipient]:
    """Each spec is a recipient, or a file of recipients (one a line, ``#`` comments). In a
    file, an SSH key of a type age cannot encrypt to (ecdsa beside ed25519 in a GitHub keys
    file) is skipped with one warning naming its line and type, as ``age -R`` does; given
    alone, it is refused by name. Duplicates (one key however spelled) are kept once.
    Raises UsageError when none is left or one is invalid."""
    found: dict[str, Recipient] = {}
    for spec in specs:
        spec = str(spec).strip()
        path = Path(spec)
        if not spec.startswith(("age1", "ssh-")) and path.is_file():
            if path.stat().st_size > _MAX_RECIPIENTS_FILE:
                raise UsageError(f"Recipients file {path} is larger than 1 MiB.")
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            before, skipped = len(found), []
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if line and not line.startswith("#"):
                    _refuse_secret(line, f"{path} line {number}")
                    if line.split()[0] in UNSUPPORTED_SSH or line.startswith("sk-"):
                        # As age -R reads a keys file: a key type age cannot encrypt to is
                        # skipped, by name (a GitHub user's keys may hold ecdsa beside ed25519).
                        skipped.append(f"line {number} ({line.split()[0]})")
                        continue
                    one = _one_recipient(line, f"{path} line {number}")
                    found.setdefault(one.text, one)
            if skipped:
                logger.warning("cubepack: recipients file %s: skipped %s: SSH key types age "
                               "cannot encrypt to", path, ", ".join(skipped))
            if len(found) == before:
                raise UsageError(
                    f"Recipients file {path} names no recipient age can encrypt to"
                    + (f" (skipped {', '.join(skipped)}: only ssh-ed25519 and ssh-rsa keys, "
                       "or age keys)" if skipped else " (it is empty, or holds only comments)")
                    + ": put one age key (age1...) or ssh-ed25519 / ssh-rsa public key a line "
                    "in it.")
        else:
            _refuse_secret(spec, "A recipient given")
            one = _one_recipient(spec, f"Recipient {spec[:40]!r}")
            found.setdefault(one.text, one)
    if not found:
        raise UsageError("No recipient given: name at least one (--encrypt-to / --to: an age key "
                         "age1..., an SSH public key, or a file of them).")
    return list(found.values())


def identity_path(path: str | os.PathLike[str] | None) -> Path | None:
    """The identity file given, else ``$CUBEPACK_IDENTITY``, else None."""
    chosen = path if path is not None else os.environ.get(IDENTITY_ENV) or None
    return Path(chosen) if chosen is not None else None


#: SSH keys read (passphrase-protected ones unlocked): (device, inode, mtime, size) -> them.
_UNLOCKED: dict[tuple[int, int, int, int], list[Any]] = {}
_UNLOCKING = threading.Lock()


def _checked_identity_file(path: Path) -> os.stat_result:
    """The identity file's lstat, refused as ssh refuses a private key: anything but a
    regular file, readable or writable by group or others, larger than 1 MiB."""
    try:
        info = os.lstat(path)
    except OSError:
        raise UsageError(f"Identity file {path} does not exist (--identity, or "
                         f"{IDENTITY_ENV}).") from None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeInputError(f"Identity file {path} is not a regular file (a symlink or "
                               "special file); point at the key file itself.")
    if info.st_mode & 0o077:
        raise UnsafeInputError(f"Identity file {path} is accessible by others (mode "
                               f"{stat.S_IMODE(info.st_mode):04o}); a private key must be "
                               f"readable by its owner only, as ssh requires: chmod 600 {path}.")
    if info.st_size > _MAX_IDENTITY_BYTES:
        raise UsageError(f"Identity file {path} is larger than 1 MiB: not a key file.")
    return info


def _file_key(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)


def unlock_identity(path: str | os.PathLike[str], passphrase: str | bytes) -> None:
    """Unlock the passphrase-protected SSH private key at ``path`` for this process, as
    ``ssh-add`` does for an agent: every later use of ``path`` (``decrypt_with=``, the MemOS
    hook's ``CUBEPACK_IDENTITY``) decrypts with it without asking. Kept until the process
    ends, or the file changes.

    Raises:
        RefusedError: the passphrase does not open the key.
        UsageError: not a passphrase-protected key (an age key, an unprotected SSH key, no key).
    """
    path = Path(path)
    info = _checked_identity_file(path)
    data = path.read_bytes()
    if not _is_ssh_key(data):
        raise UsageError(f"Identity file {path} is not an SSH private key: only those take a "
                         "passphrase.")
    secret = passphrase.encode("utf-8") if isinstance(passphrase, str) else bytes(passphrase)
    if secret and _ssh_key(data, path, None) is not None:
        raise UsageError(f"Identity file {path} is not passphrase-protected: use it as it is.")
    identities = [_ssh_key(data, path, secret)]
    with _UNLOCKING:
        _UNLOCKED[_file_key(info)] = identities


def _is_ssh_key(data: bytes) -> bool:
    return b"PRIVATE KEY-----" in data


def _ssh_key(data: bytes, path: Path, passphrase: bytes | None) -> Any:
    """The identity of the SSH private key ``data``; None when it needs a passphrase and none
    was given.

    Raises:
        RefusedError: the passphrase is wrong.
        UsageError: not a key cubepack can read, or bcrypt (OpenSSH's key derivation) missing.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    loader = serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data \
        else serialization.load_pem_private_key
    if passphrase is not None and not passphrase:
        # An empty passphrase is no passphrase to the key loader: say what it is, not that
        # the key is unprotected.
        if _ssh_key(data, path, None) is None:
            raise RefusedError(f"An empty passphrase does not open identity file {path}: it is "
                               f"passphrase-protected. Give its passphrase ({PASSPHRASE_ENV}, "
                               "cubepack.trust.unlock_identity, or at the prompt).")
        passphrase = None
    try:
        key = loader(data, password=passphrase)
    except TypeError:
        if passphrase is None:
            return None  # "Password was not given but private key is encrypted"
        raise UsageError(f"Identity file {path} is not passphrase-protected: use it as it "
                         "is.") from None
    except UnsupportedAlgorithm as exc:
        if "bcrypt" in str(exc).lower():
            raise UsageError(f"Identity file {path} is a passphrase-protected OpenSSH key, "
                             "whose key derivation needs the bcrypt package: pip install "
                             "'cubepack[private]'.") from None
        raise UsageError(f"Identity file {path} holds an SSH private key cubepack cannot use "
                         "(an unsupported cipher or key type): an OpenSSH or PEM ed25519 or "
                         "RSA key.") from None
    except ValueError:
        if passphrase is not None:
            raise RefusedError(f"The passphrase does not open identity file {path} (or the "
                               "key is damaged).") from None
        raise UsageError(f"Identity file {path} holds an SSH private key cubepack cannot use: "
                         "it must be an OpenSSH or PEM ed25519 or RSA key.") from None
    return _ssh.identity(key, f"Identity file {path}")


def _passphrase(path: Path) -> bytes:
    """The passphrase of the protected key ``path``: ``$CUBEPACK_IDENTITY_PASSPHRASE``, else
    asked on the terminal without echo. Raises UsageError when neither is there."""
    given = os.environ.get(PASSPHRASE_ENV)
    if given is not None:
        return given.encode("utf-8")
    try:  # getpass falls back to an echoing stdin without a terminal: never that
        os.close(os.open("/dev/tty", os.O_RDWR | getattr(os, "O_NOCTTY", 0)))
    except OSError:
        raise UsageError(f"Identity file {path} is a passphrase-protected SSH key and there is "
                         f"no terminal to ask for its passphrase: set {PASSPHRASE_ENV}, or, "
                         "from Python, call cubepack.trust.unlock_identity(path, passphrase) "
                         "first.") from None
    import getpass

    try:
        return getpass.getpass(f"Enter passphrase for {path}: ").encode("utf-8")
    except (EOFError, KeyboardInterrupt):
        raise UsageError(f"No passphrase given for identity file {path}.") from None


def load_identities(path: str | os.PathLike[str]) -> list[Any]:
    """Read an identity file: age X25519 secret keys (``AGE-SECRET-KEY-1...``, one a line, as
    ``age-keygen`` writes) or an OpenSSH or PEM private key (ed25519 or RSA), unencrypted or
    passphrase-protected (see the module docstring for where the passphrase comes from).

    Refused, as ssh refuses a private key: a file readable or writable by group or others, a
    symlink, anything but a regular file. Its content never appears in a message.

    Raises:
        UnsafeInputError: permissions too open, or not a regular file.
        UsageError: missing, holding no identity cubepack can use, or no passphrase source.
        RefusedError: a wrong passphrase.
    """
    _require()
    path = Path(path)
    info = _checked_identity_file(path)
    with _UNLOCKING:
        unlocked = _UNLOCKED.get(_file_key(info))
    if unlocked is not None:
        return list(unlocked)
    data = path.read_bytes()
    if _is_ssh_key(data):
        identity = _ssh_key(data, path, None)
        if identity is None:
            identity = _ssh_key(data, path, _passphrase(path))
        # Kept, as an unlocked key is: reading an RSA key checks it (~0.1 s for 3072 bits),
        # and one load opens the identity file two or three times.
        with _UNLOCKING:
            _UNLOCKED[_file_key(info)] = [identity]
        return [identity]
    identities = [_x25519_identity(line.strip(), path)
                  for line in data.decode("utf-8", errors="replace").splitlines()
                  if line.strip().startswith(_SECRET_PREFIX)]
    if not identities:
        public = (" It holds a public key (a recipient): pass the private key (the SSH key file "
                  "without .pub, or the age key file).") \
            if data.lstrip().startswith((b"ssh-", b"age1")) else ""
        raise UsageError(f"Identity file {path} holds no identity: expected AGE-SECRET-KEY-1... "
                         f"lines (age-keygen) or an OpenSSH ed25519/RSA private key.{public}")
    return identities


def _x25519_identity(text: str, path: Path | str) -> _stream.X25519Identity:
    secret = _stream.bech32_bytes(text, "age-secret-key-") if text.isupper() else None
    if secret is None or len(secret) != 32:
        raise UsageError(f"Identity file {path} holds a malformed AGE-SECRET-KEY line.")
    return _stream.X25519Identity(secret)


def _native(identities: list[Any]) -> list[Any]:
    """Identities as this module's objects; an age identity may also be given as its text, or
    an object whose ``str()`` is (pyrage's ``x25519.Identity``)."""
    return [i if hasattr(i, "unwrap") else _x25519_identity(str(i).strip(), "given")
            for i in identities]


def encrypt(data: Any, recipients: list[Recipient]) -> bytearray:
    """``data`` (any buffer: read in place, never copied) encrypted to ``recipients`` under a
    fresh file key: an age v1 file, in the bytearray it was encrypted into."""
    _require()
    return _stream.encrypt(data, [r.value for r in recipients])


def decrypt(data: Any, identities: list[Any], what: str) -> bytearray:
    """The plaintext of the age file ``what`` (its bytes: ``data``), in a new bytearray (the
    heap: for small things the caller parses anyway; a file's plaintext goes to
    :func:`decrypt_to` and memory the caller owns).

    Raises:
        FormatError: not an age file.
        RefusedError: none of ``identities`` opens it, or its ciphertext is damaged.
    """
    found: list[bytearray] = []

    def allocate(size: int) -> bytearray:
        found.append(bytearray(size))
        return found[0]

    decrypt_to(data, identities, what, allocate)
    return found[0]


def decrypt_to(data: Any, identities: list[Any], what: str, allocate: Any) -> None:
    """Decrypt the age file ``data`` (binary or armored) into ``allocate(size)``, a writable
    buffer the caller owns (private anonymous memory, a memory file's map, a RAM folder's
    file), each chunk straight into it. See :func:`decrypt`."""
    _require()
    if bytes(data[:len(_ARMOR_BEGIN) + 8]).lstrip().startswith(_ARMOR_BEGIN):
        data = _dearmor(data, what)
    if not bytes(data[:len(AGE_MAGIC)]) == AGE_MAGIC:
        raise FormatError(f"{what} is not an age file (it does not start with "
                          "'age-encryption.org/v1').")
    identities = _native(identities)
    if not _stream.decrypt_into(data, identities, what, allocate):
        raise _not_a_recipient(what, identities)


#: The age stanza types of the recipients cubepack encrypts to (age X25519 keys, SSH keys).
RECIPIENT_STANZAS = frozenset({b"X25519", b"ssh-ed25519", b"ssh-rsa"})
#: How the random "grease" stanzas the age crate (pyrage) adds to a header end their type:
#: no identity opens one, so it names no recipient.
GREASE_SUFFIX = b"-grease"


def recipient_stanzas(data: Any, what: str, *,
                      grease: bool = False) -> tuple[int, list[str]]:
    """How many recipient stanzas the age header of the file ``data`` holds (one a recipient
    per file: age X25519, ssh-ed25519, ssh-rsa), and the types of any other stanza, shown
    quoted. ``grease``: the file was written by the age crate (a private cube of encryption
    version 1, written through pyrage), which adds random ``*-grease`` stanzas, so those are
    not counted; cubepack's own writer adds none, so in a file it wrote any stanza of another
    type (grease included: any stanza can wrap a file key for someone) is another reader.
    Read without a key: anyone can count a file's readers (not who they are).

    Raises:
        FormatError: not an age file, or a malformed header.
    """
    if bytes(data[:len(_ARMOR_BEGIN) + 8]).lstrip().startswith(_ARMOR_BEGIN):
        data = _dearmor(data, what)
    stanzas = _stream._parse_header(data, what)[0]
    types = [args[0] if args else b"" for args, _ in stanzas]
    others = [repr(kind.decode("ascii", "replace"))[:40] for kind in types
              if kind not in RECIPIENT_STANZAS and not (grease and kind.endswith(GREASE_SUFFIX))]
    return sum(kind in RECIPIENT_STANZAS for kind in types), others


_ARMOR_BEGIN = b"-----BEGIN AGE ENCRYPTED FILE-----"
_ARMOR_END = b"-----END AGE ENCRYPTED FILE-----"


def _dearmor(data: Any, what: str) -> bytes:
    """The binary age file inside age's ASCII armor (``age -a``; the spec's strict PEM: base64
    lines of 64 columns, the last one shorter, LF or CRLF, whitespace around the block),
    refused when it is anything looser, as age refuses it."""
    lines = bytes(data).strip().replace(b"\r\n", b"\n").split(b"\n")
    body = lines[1:-1]
    well_formed = (len(lines) >= 2 and lines[0] == _ARMOR_BEGIN and lines[-1] == _ARMOR_END
                   and all(len(line) == 64 for line in body[:-1])
                   and (not body or 0 < len(body[-1]) <= 64))
    if well_formed:
        text = b"".join(body)
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            data = None
        if data is not None and base64.b64encode(data) == text:  # canonical, as age requires
            return data
    raise FormatError(f"{what} is not a well-formed armored age file (the base64 between "
                      "its BEGIN and END lines is malformed); encrypt it again, or without "
                      "--armor.")


def _not_a_recipient(what: str, identities: list[Any]) -> RefusedError:
    return RefusedError(
        f"{what} is not encrypted to the identity given: none of its {len(identities)} key(s) "
        "is one of the file's recipients. Use an identity it was encrypted to, or ask the "
        "cube's owner to add your public key (cubepack rekey --add).")


def manifest_bytes(lock_text: str, names: dict[str, str], recipients: list[Recipient], *,
                   series: str, generation: int, history: list[dict[str, Any]],
                   headers: dict[str, list[Any]]) -> bytes:
    """The private manifest's plaintext: the clear cube's lock (every plaintext digest), the
    ciphertext -> clear name map, the recipients (so a rekey knows whom to keep), the cube's
    generation and its recipient history (each generation's added and removed recipients),
    and each ciphertext's ``[payload start, sha256 of the header and nonce]``."""
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "lock": lock_text,
                "names": dict(sorted(names.items())),
                "recipients": sorted(r.text for r in recipients), "series": series,
                "generation": generation, "history": history,
                "headers": dict(sorted(headers.items()))}
    _check_history(manifest)
    _check_headers(manifest)
    return canonical.dumps(manifest).encode("utf-8")


def parse_manifest(data: bytes) -> dict[str, Any]:
    """Read a decrypted manifest strictly (closed keys, its version). A version-1 manifest is
    returned with ``series`` and ``generation`` None and an empty ``history``. Raises
    FormatError."""
    try:
        manifest = canonical.loads_strict(data.decode("utf-8"),
                                          object_pairs_hook=canonical.unique_pairs)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"The private manifest is not valid JSON ({type(exc).__name__}).") \
            from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError("The private manifest is not a cubepack private manifest.")
    version = manifest.get("version")
    if type(version) is not int or version not in MANIFEST_VERSIONS:
        raise FormatError(f"The private manifest is version {version!r}; this cubepack reads "
                          f"versions {MANIFEST_VERSIONS[0]} to {MANIFEST_VERSIONS[-1]}. Upgrade "
                          "cubepack.")
    keys = {1: MANIFEST_KEYS_V1, 2: MANIFEST_KEYS_V2}.get(version, MANIFEST_KEYS)
    if set(manifest) != keys:
        raise FormatError(f"The private manifest (version {version}) must hold exactly "
                          f"{sorted(keys)}.")
    names, recipients = manifest["names"], manifest["recipients"]
    if not (isinstance(manifest["lock"], str) and isinstance(names, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
            and isinstance(recipients, list) and all(isinstance(r, str) for r in recipients)
            and len(set(names.values())) == len(names)):
        raise FormatError("The private manifest is malformed (lock text, a one-to-one names map, "
                          "a recipients list).")
    if version == 1:
        return {**manifest, "series": None, "generation": None, "history": [], "headers": None}
    _check_history(manifest)
    if version == 2:
        return {**manifest, "headers": None}
    _check_headers(manifest)
    return manifest


def _check_headers(manifest: dict[str, Any]) -> None:
    """Version 3's ``headers``: one ``[start, sha256]`` for each ciphertext the names map
    holds, no other (``start`` past the smallest age header and its nonce)."""
    headers = manifest["headers"]
    if not (isinstance(headers, dict) and set(headers) == set(manifest["names"])
            and all(isinstance(v, list) and len(v) == 2 and type(v[0]) is int
                    and 0 < v[0] < 2 ** 53 and isinstance(v[1], str)
                    and re.fullmatch(r"[0-9a-f]{64}", v[1]) for v in headers.values())):
        raise FormatError("The private manifest's headers are malformed (one [payload start, "
                          "sha256] for each ciphertext of its names map).")


def _check_history(manifest: dict[str, Any]) -> None:
    """A generation from 1 to 2**53-1; its history one entry a generation that changed the
    recipients or drew new keys, in increasing order, ending at the cube's own generation,
    each naming lists of recipients."""
    generation, history = manifest["generation"], manifest["history"]
    if not (isinstance(manifest["series"], str) and type(generation) is int
            and 1 <= generation < 2 ** 53 and isinstance(history, list)
            and history and all(isinstance(e, dict) and set(e) == HISTORY_KEYS
                                and type(e["generation"]) is int
                                and all(isinstance(e[k], list)
                                        and all(isinstance(r, str) for r in e[k])
                                        for k in ("added", "removed"))
                                for e in history)):
        raise FormatError("The private manifest's series, generation or recipient history is "
                          "malformed (a string; a positive integer; a list of {generation, "
                          "added, removed}).")
    numbers = [entry["generation"] for entry in history]
    if numbers != sorted(set(numbers)) or numbers[-1] != generation or numbers[0] < 1:
        raise FormatError("The private manifest's recipient history must run in increasing "
                          f"generations up to its own ({generation}).")
