"""The age format (https://age-encryption.org/v1), for private cubes (``pip install
'cubepack[private]'``): recipients, identities, one file encrypted or decrypted, and the
encrypted manifest.

Why ``pyrage``: it binds the ``age`` Rust crate (the reference implementation's sibling, by
age's co-designer's ecosystem, interoperable with the Go ``age`` CLI byte for byte), so the
header, the X25519, ssh-ed25519 and ssh-rsa stanzas, the STREAM payload and their edge cases
are age's own code, not ours. ``cryptography`` has every primitive, but assembling all of age
from them (HKDF labels, stanza wrapping, the header MAC, chunked STREAM with its last-chunk
flag, OpenSSH key parsing and the ssh-rsa/ssh-ed25519 stanzas) would be a second
implementation to keep interoperable, reviewed by nobody else. pyrage ships wheels for Linux, macOS and Windows and
encrypts in native code. Two things it does not do: expose the file key (so a rekey
re-encrypts rather than rewriting headers: see :func:`cubepack.ops._encrypt.rekey`), and run
fast: its wheels' ChaCha20-Poly1305 is built without vector instructions (~150 MB/s here). So
X25519 recipients and identities, the common case and every KV load's, take a native path on
``cryptography`` (:mod:`._age_stream`: OpenSSL's vector code, one thread per core, straight
into the caller's memory);
SSH stanzas and anything else stay pyrage's. The tests hold the two paths and Debian's ``age``
CLI to each other both ways.

Every error here names the file, never its bytes; an identity file's content is never echoed.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import canonical
from ..errors import CubepackError, FormatError, RefusedError, UnsafeInputError, UsageError
from ..format._content import AGE_MAGIC
from . import _age_stream as _stream

#: The environment variable naming an identity file when none is given.
IDENTITY_ENV = "CUBEPACK_IDENTITY"
#: The private manifest's format and version (the plaintext of ``cubepack.manifest.age``).
#: Version 2 (issue #37) adds the cube's ``series`` and ``generation`` (as its public lock
#: states them) and the recipient ``history``: who each generation added and removed, so a
#: rekey can say whom it would re-add. Version 1 is still read (no series, generation, history).
MANIFEST_FORMAT = "cubepack.private-manifest"
MANIFEST_VERSION = 2
MANIFEST_VERSIONS = (1, 2)
MANIFEST_KEYS_V1 = frozenset({"format", "version", "lock", "names", "recipients"})
MANIFEST_KEYS = MANIFEST_KEYS_V1 | {"series", "generation", "history"}
#: One entry of the recipient history: the generation, and the recipients it added and removed.
HISTORY_KEYS = frozenset({"generation", "added", "removed"})
_MAX_IDENTITY_BYTES = 1024 * 1024
_MAX_RECIPIENTS_FILE = 1024 * 1024


def _pyrage() -> Any:
    try:
        import pyrage
    except ImportError as exc:
        raise CubepackError("Private cubes need the optional dependency pyrage: pip install "
                            "'cubepack[private]'.") from exc
    return pyrage


@dataclass(frozen=True)
class Recipient:
    """One recipient: its text as written (``age1...``, ``ssh-ed25519 AAAA...``) and pyrage's."""

    text: str
    value: Any


def _one_recipient(text: str, where: str) -> Recipient:
    pyrage = _pyrage()
    fields = text.split()
    try:
        if text.startswith("age1"):
            return Recipient(text, pyrage.x25519.Recipient.from_str(text))
        if fields and fields[0] in ("ssh-ed25519", "ssh-rsa") and len(fields) >= 2:
            canonical_text = f"{fields[0]} {fields[1]}"  # the comment is not the key
            return Recipient(canonical_text, pyrage.ssh.Recipient.from_str(canonical_text))
    except Exception as exc:  # noqa: BLE001 - pyrage raises its own RecipientError, ValueError
        raise UsageError(f"{where} is not a valid age recipient ({exc}); expected an age "
                         "X25519 key (age1...) or an SSH public key (ssh-ed25519 / ssh-rsa).") \
            from None
    raise UsageError(f"{where} is not an age recipient: expected an age X25519 key (age1...), "
                     "an SSH public key (ssh-ed25519 / ssh-rsa AAAA...), or a file of them, one "
                     "a line (e.g. https://github.com/USER.keys saved to a file).")


def parse_recipients(specs: list[str] | tuple[str, ...]) -> list[Recipient]:
    """Each spec is a recipient, or a file of recipients (one a line, ``#`` comments; SSH key
    types age cannot encrypt to, e.g. ecdsa in a GitHub keys file, are refused by name).
    Duplicates are kept once. Raises UsageError when none is given or one is invalid."""
    found: dict[str, Recipient] = {}
    for spec in specs:
        spec = str(spec).strip()
        path = Path(spec)
        if not spec.startswith(("age1", "ssh-")) and path.is_file():
            if path.stat().st_size > _MAX_RECIPIENTS_FILE:
                raise UsageError(f"Recipients file {path} is larger than 1 MiB.")
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if line and not line.startswith("#"):
                    one = _one_recipient(line, f"{path} line {number}")
                    found.setdefault(one.text, one)
        else:
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


def load_identities(path: str | os.PathLike[str]) -> list[Any]:
    """Read an identity file: age X25519 secret keys (``AGE-SECRET-KEY-1...``, one a line, as
    ``age-keygen`` writes) or an unencrypted OpenSSH private key (ed25519 or RSA).

    Refused, as ssh refuses a private key: a file readable or writable by group or others, a
    symlink, anything but a regular file. Its content never appears in a message.

    Raises:
        UnsafeInputError: permissions too open, or not a regular file.
        UsageError: missing, or holding no identity cubepack can use.
    """
    path = Path(path)
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
    data = path.read_bytes()
    pyrage = _pyrage()
    identities: list[Any] = []
    if b"PRIVATE KEY-----" in data:
        try:
            identities.append(pyrage.ssh.Identity.from_buffer(data))
        except Exception:  # noqa: BLE001 - never echo a key parser's view of the key
            raise UsageError(f"Identity file {path} holds an SSH private key cubepack cannot "
                             "use: it must be an unencrypted OpenSSH ed25519 or RSA key (a "
                             "passphrase-protected key: use an age identity instead).") from None
        return identities
    for line in data.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if line.startswith("AGE-SECRET-KEY-"):
            try:
                identities.append(pyrage.x25519.Identity.from_str(line))
            except Exception:  # noqa: BLE001
                raise UsageError(f"Identity file {path} holds a malformed AGE-SECRET-KEY "
                                 "line.") from None
    if not identities:
        raise UsageError(f"Identity file {path} holds no identity: expected AGE-SECRET-KEY-1... "
                         "lines (age-keygen) or an OpenSSH ed25519/RSA private key.")
    return identities


def _x25519_publics(recipients: list[Recipient]) -> list[bytes] | None:
    """The raw X25519 keys of ``recipients`` when every one is an age X25519 key, else None."""
    if not all(r.text.startswith("age1") for r in recipients):
        return None
    return [_stream.bech32_bytes(r.text) for r in recipients]


def _x25519_secrets(identities: list[Any]) -> list[bytes]:
    x25519 = _pyrage().x25519.Identity
    return [_stream.bech32_bytes(str(i)) for i in identities if isinstance(i, x25519)]


def encrypt(data: Any, recipients: list[Recipient]) -> bytes | bytearray:
    """``data`` encrypted to ``recipients`` under a fresh file key: an age v1 file. X25519-only
    recipient sets take the native fast path (:mod:`._age_stream`), whose bytearray is
    returned as it was encrypted into (a copy into ``bytes`` took longer than the encryption
    of a 210 MB cache); SSH recipients, pyrage (bytes)."""
    publics = _x25519_publics(recipients)
    if publics is not None and _stream.available():
        return _stream.encrypt(data, publics)
    return _pyrage().encrypt(bytes(data), [r.value for r in recipients])


def decrypt(data: Any, identities: list[Any], what: str) -> bytes | bytearray:
    """The plaintext of the age file ``what`` (its bytes: ``data``): bytes, or the bytearray
    it was decrypted into (not copied again).

    Raises:
        FormatError: not an age file.
        RefusedError: none of ``identities`` opens it, or its ciphertext is damaged.
    """
    found: list[bytearray] = []

    def allocate(size: int) -> bytearray:
        found.append(bytearray(size))
        return found[0]

    plain = decrypt_to(data, identities, what, allocate)
    return plain if plain is not None else found[0]


def decrypt_to(data: Any, identities: list[Any], what: str,
               allocate: Any) -> bytes | None:
    """Decrypt the age file ``data`` into ``allocate(size)`` (a writable buffer the caller
    owns: a memory file's map, a bytearray) when an X25519 identity opens it (the fast path);
    else (SSH identities) return the plaintext pyrage decrypted. See :func:`decrypt`."""
    if bytes(data[:len(_ARMOR_BEGIN) + 8]).lstrip().startswith(_ARMOR_BEGIN):
        data = _dearmor(data, what)
    if not bytes(data[:len(AGE_MAGIC)]) == AGE_MAGIC:
        raise FormatError(f"{what} is not an age file (it does not start with "
                          "'age-encryption.org/v1').")
    secrets = _x25519_secrets(identities)
    if secrets and _stream.available() and _stream.decrypt_into(data, secrets, what, allocate):
        return None
    others = [i for i in identities if not isinstance(i, _pyrage().x25519.Identity)]
    if not others and secrets and _stream.available():
        raise _not_a_recipient(what, identities)
    pyrage = _pyrage()
    try:
        return pyrage.decrypt(bytes(data), identities)
    except pyrage.DecryptError as exc:
        if "no matching keys" in str(exc).lower():
            raise _not_a_recipient(what, identities) from None
        raise RefusedError(f"{what} could not be decrypted: {exc} (its ciphertext is "
                           "damaged or was tampered with).") from None


#: The age stanza types of the recipients cubepack encrypts to (age X25519 keys, SSH keys).
RECIPIENT_STANZAS = frozenset({b"X25519", b"ssh-ed25519", b"ssh-rsa"})
#: How the random "grease" stanzas the age crate (pyrage) adds to a header end their type:
#: no identity opens one, so it names no recipient.
GREASE_SUFFIX = b"-grease"


def recipient_stanzas(data: Any, what: str) -> tuple[int, list[str]]:
    """How many recipient stanzas the age header of the file ``data`` holds (one a recipient
    per file: age X25519, ssh-ed25519, ssh-rsa), and the types of any other stanza that is not
    grease (a type cubepack never writes, e.g. a plugin's or a passphrase's), shown quoted.
    Read without a key: anyone can count a file's readers (not who they are).

    Raises:
        FormatError: not an age file, or a malformed header.
    """
    if bytes(data[:len(_ARMOR_BEGIN) + 8]).lstrip().startswith(_ARMOR_BEGIN):
        data = _dearmor(data, what)
    stanzas = _stream._parse_header(data, what)[0]
    types = [args[0] if args else b"" for args, _ in stanzas]
    others = [repr(kind.decode("ascii", "replace"))[:40] for kind in types
              if kind not in RECIPIENT_STANZAS and not kind.endswith(GREASE_SUFFIX)]
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
        try:
            return base64.b64decode(b"".join(body), validate=True)
        except binascii.Error:
            pass
    raise FormatError(f"{what} is not a well-formed armored age file (the base64 between "
                      "its BEGIN and END lines is malformed); encrypt it again, or without "
                      "--armor.")


def _not_a_recipient(what: str, identities: list[Any]) -> RefusedError:
    return RefusedError(
        f"{what} is not encrypted to the identity given: none of its {len(identities)} key(s) "
        "is one of the file's recipients. Use an identity it was encrypted to, or ask the "
        "cube's owner to add your public key (cubepack rekey --add).")


def manifest_bytes(lock_text: str, names: dict[str, str], recipients: list[Recipient], *,
                   series: str, generation: int, history: list[dict[str, Any]]) -> bytes:
    """The private manifest's plaintext: the clear cube's lock (every plaintext digest), the
    ciphertext -> clear name map, the recipients (so a rekey knows whom to keep), the cube's
    generation and its recipient history (each generation's added and removed recipients)."""
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "lock": lock_text,
                "names": dict(sorted(names.items())),
                "recipients": sorted(r.text for r in recipients), "series": series,
                "generation": generation, "history": history}
    _check_history(manifest)
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
    keys = MANIFEST_KEYS if version >= 2 else MANIFEST_KEYS_V1
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
        return {**manifest, "series": None, "generation": None, "history": []}
    _check_history(manifest)
    return manifest


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
