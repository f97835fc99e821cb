"""The age v1 format for X25519 recipients and identities, natively on ``cryptography``: the
fast path of :mod:`._age`.

Why a second implementation beside pyrage: pyrage's wheels build the age crate's ChaCha20-
Poly1305 without the CPU's vector instructions (about 150 MB/s here, against 500 MB/s for the
Go ``age`` CLI and 800 MB/s for OpenSSL through ``cryptography``), and a private KV cache is
decrypted on every load. This module does only what the spec defines for X25519
(https://age-encryption.org/v1): the header (version line, stanzas, the HMAC over them), the
X25519 stanza (HKDF-SHA256, ChaCha20-Poly1305 wrap of the 16-byte file key) and the STREAM
payload (64 KiB chunks, 11-byte counter and last-chunk flag), decrypting each chunk straight
into the caller's buffer, one run of chunks a core. Anything else (SSH stanzas and
identities, scrypt) is pyrage's, and the tests hold both to each other and to the age CLI
both ways.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import FormatError, RefusedError

VERSION_LINE = b"age-encryption.org/v1"
CHUNK = 64 * 1024
TAG = 16
#: Below this many chunks (4 MiB) a file is de/encrypted on the calling thread.
PARALLEL_CHUNKS = 64
_X25519_LABEL = b"age-encryption.org/v1/X25519"
_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def available() -> bool:
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    except ImportError:
        return False
    return True


def bech32_bytes(text: str) -> bytes:
    """The data of a bech32 string already validated by pyrage (checksum dropped)."""
    data = text.lower().rpartition("1")[2][:-6]
    bits, value, out = 0, 0, bytearray()
    for char in data:
        value = (value << 5) | _BECH32.index(char)
        bits += 5
        if bits >= 8:
            bits -= 8
            out.append((value >> bits) & 0xFF)
    return bytes(out)


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(hashes.SHA256(), 32, salt or None, info).derive(ikm)


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data).rstrip(b"=")


def _unb64(text: bytes, what: str) -> bytes:
    try:
        data = base64.b64decode(text + b"=" * (-len(text) % 4), validate=True)
    except ValueError:
        raise FormatError(f"{what} has a malformed age header (base64).") from None
    if _b64(data) != text:
        raise FormatError(f"{what} has a non-canonical base64 value in its age header.")
    return data


def _header_end(data: Any) -> int:
    """Where the header's ``\n--- `` MAC line starts, or -1. Looked for in growing windows:
    the spec bounds no header, and one grows ~98 bytes a recipient (a cube encrypted to an
    organisation's keys file, written by cubepack or ``age -R``, passes 64 KiB); most
    headers end in the first window, and a file with none costs one copy of itself."""
    limit = 64 * 1024 + 4096
    while True:
        end = bytes(data[:limit]).find(b"\n--- ")
        if end >= 0 or limit >= len(data):
            return end
        limit *= 4


def _parse_header(data: Any, what: str) -> tuple[list[tuple[list[bytes], bytes]], bytes, bytes,
                                                  int]:
    """(stanzas as (args, body), the bytes the MAC covers, the MAC, where the payload starts)."""
    end = _header_end(data)
    if end < 0:
        raise FormatError(f"{what} has no complete age header.")
    newline = bytes(data[end + 5:end + 5 + 128]).find(b"\n")
    if newline < 0:
        raise FormatError(f"{what} has no complete age header (MAC line).")
    lines = bytes(data[:end]).split(b"\n")
    if lines[0] != VERSION_LINE:
        raise FormatError(f"{what} is not an age v1 file.")
    stanzas: list[tuple[list[bytes], bytes]] = []
    index = 1
    while index < len(lines):
        line = lines[index]
        if not line.startswith(b"-> "):
            raise FormatError(f"{what} has a malformed age header (a stanza line).")
        args = line[3:].split(b" ")
        body = b""
        index += 1
        while True:
            if index >= len(lines):
                raise FormatError(f"{what} has a malformed age header (a stanza body).")
            chunk = lines[index]
            index += 1
            body += chunk
            if len(chunk) < 64:
                break
        stanzas.append((args, body))
    mac = _unb64(bytes(data[end + 5:end + 5 + newline]), what)
    return stanzas, bytes(data[:end + 4]), mac, end + 5 + newline + 1


def _file_key(stanzas: list[tuple[list[bytes], bytes]], secrets: list[bytes],
              what: str) -> bytes | None:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    for secret in secrets:
        private = X25519PrivateKey.from_private_bytes(secret)
        public = private.public_key().public_bytes_raw()
        for args, body in stanzas:
            if args[0] != b"X25519":
                continue
            if len(args) != 2:
                raise FormatError(f"{what} has a malformed X25519 stanza.")
            share = _unb64(args[1], what)
            wrapped = _unb64(body, what)
            if len(share) != 32 or len(wrapped) != 32:
                raise FormatError(f"{what} has a malformed X25519 stanza.")
            try:
                shared = private.exchange(X25519PublicKey.from_public_bytes(share))
            except ValueError:  # OpenSSL refuses the all-zero secret of a low-order share
                shared = bytes(32)
            if shared == bytes(32):
                raise FormatError(f"{what} has an X25519 stanza with a low-order share.")
            key = _hkdf(shared, share + public, _X25519_LABEL)
            try:
                return ChaCha20Poly1305(key).decrypt(bytes(12), wrapped, None)
            except InvalidTag:
                continue
    return None


def plaintext_size(payload: int, what: str) -> int:
    """The plaintext size of a STREAM payload of ``payload`` bytes (its nonce excluded)."""
    full, rest = divmod(payload, CHUNK + TAG)
    if rest and rest < TAG or (not rest and not full) or (rest == TAG and full):
        raise FormatError(f"{what}'s age payload is truncated or malformed.")
    return full * CHUNK + (rest - TAG if rest else 0)


def decrypt_into(data: Any, secrets: list[bytes], what: str,
                 allocate: Callable[[int], Any]) -> bool:
    """Decrypt the age file ``data`` (bytes-like) with the X25519 ``secrets``, each chunk
    straight into ``allocate(plaintext size)`` (a writable buffer), on one thread per core
    (see :func:`_each_run`). False when no X25519 stanza opens to these secrets (the caller
    tries its other identities).

    Raises:
        FormatError: a malformed header or payload.
        RefusedError: a header MAC or payload chunk that fails authentication (the first such
            chunk named, whichever thread found it).
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    stanzas, covered, mac, start = _parse_header(data, what)
    file_key = _file_key(stanzas, secrets, what)
    if file_key is None:
        return False
    expected = hmac.new(_hkdf(file_key, b"", b"header"), covered, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, mac):
        raise RefusedError(f"{what}'s age header fails its MAC: it was tampered with.")
    nonce = bytes(data[start:start + 16])
    if len(nonce) != 16:
        raise FormatError(f"{what}'s age payload is truncated.")
    size = plaintext_size(len(data) - start - 16, what)
    aead = ChaCha20Poly1305(_hkdf(file_key, nonce, b"payload"))
    chunks = max(1, -(-size // CHUNK))
    failed: list[int] = []  # chunks whose tag failed: at most one a run
    # The views are released on the way out, also when refused: a traceback holding them
    # would keep the caller's map of the ciphertext exported, and closing it would raise
    # BufferError in place of the refusal.
    with memoryview(data) as view, view[start + 16:] as payload, \
            memoryview(allocate(size)) as out:

        def run(indices: range) -> None:
            for index in indices:
                if failed and min(failed) < indices.start:
                    return  # a lower run failed: its chunk is the one named, not one of ours
                last = index == chunks - 1
                length = (size - index * CHUNK) if last else CHUNK
                begin = index * (CHUNK + TAG)
                try:
                    aead.decrypt_into(_chunk_nonce(index, last),
                                      payload[begin:begin + length + TAG], None,
                                      out[index * CHUNK:index * CHUNK + length])
                except InvalidTag:
                    failed.append(index)
                    return

        _each_run(run, chunks)
    if failed:
        raise RefusedError(f"{what}'s age payload fails authentication at chunk {min(failed)}: "
                           "it was tampered with or is damaged.")
    return True


def _chunk_nonce(index: int, last: bool) -> bytes:
    """STREAM's nonce of chunk ``index``: an 11-byte big-endian counter and the last-chunk
    flag. A chunk moved, dropped or flagged in the wrong place fails its tag."""
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


def workers() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _each_run(job: Callable[[range], None], chunks: int) -> None:
    """``job`` over contiguous runs of the chunk indices ``range(chunks)``, one run a core, the
    first on the calling thread. Each chunk is independent in STREAM (its nonce is its index
    and the last-chunk flag), and ``cryptography`` releases the GIL inside ChaCha20-Poly1305,
    so the runs go in parallel straight into one destination: 210 MB decrypted into
    anonymous memory in 73 ms on 2 threads against 122 ms on one (the project's 2-core
    machine, idle; more threads than cores were slower). A file under
    ``PARALLEL_CHUNKS`` chunks stays on the calling thread (a thread costs more than it saves).
    """
    count = max(1, min(workers(), chunks // PARALLEL_CHUNKS))
    runs = [range(chunks * k // count, chunks * (k + 1) // count) for k in range(count)]
    if count == 1:
        job(runs[0])
        return
    with ThreadPoolExecutor(count - 1, thread_name_prefix="cubepack-age") as pool:
        futures = [pool.submit(job, indices) for indices in runs[1:]]
        job(runs[0])
        for future in futures:
            future.result()


def encrypt(data: Any, publics: list[bytes]) -> bytearray:
    """``data`` encrypted to the X25519 public keys ``publics``: a fresh file key, one stanza
    each, the header MAC, the STREAM payload encrypted chunk by chunk into the output (one
    run of chunks a core, as :func:`decrypt_into`)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    file_key = os.urandom(16)
    header = [VERSION_LINE]
    for public in publics:
        ephemeral = X25519PrivateKey.generate()
        share = ephemeral.public_key().public_bytes_raw()
        shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(public))
        wrapped = ChaCha20Poly1305(_hkdf(shared, share + public, _X25519_LABEL)).encrypt(
            bytes(12), file_key, None)
        header += [b"-> X25519 " + _b64(share), _b64(wrapped)]
    covered = b"\n".join(header) + b"\n---"
    mac = hmac.new(_hkdf(file_key, b"", b"header"), covered, hashlib.sha256).digest()
    head = covered + b" " + _b64(mac) + b"\n"
    nonce = os.urandom(16)
    view = memoryview(data)
    size = len(view)
    chunks = max(1, -(-size // CHUNK))
    out = bytearray(len(head) + 16 + size + chunks * TAG)
    out[:len(head)] = head
    out[len(head):len(head) + 16] = nonce
    target = memoryview(out)[len(head) + 16:]
    aead = ChaCha20Poly1305(_hkdf(file_key, nonce, b"payload"))

    def run(indices: range) -> None:
        for index in indices:
            last = index == chunks - 1
            length = (size - index * CHUNK) if last else CHUNK
            begin = index * (CHUNK + TAG)
            aead.encrypt_into(_chunk_nonce(index, last), view[index * CHUNK:index * CHUNK + length],
                              None, target[begin:begin + length + TAG])

    _each_run(run, chunks)
    return out
