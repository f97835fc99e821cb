"""Part of a private cube, decrypted on demand (issue #40): a reader of one memory of a
private cube (``load_kv_cache(cube, model, item=..., decrypt_with=...)``, a remote cube's
``load(item, model, decrypt_with=...)``) decrypts the manifest, then only the bytes it needs:
a shard's index, then the memory's own 64 KiB STREAM chunks of its shard (and at most the
neighbours' bytes sharing its first and last chunk), never the rest of the cube.

The chain of trust, each link checked before the next is read:

1. the **public lock** (signed, when the caller asked for a trusted key) records the
   manifest's ciphertext by sha256 and size, and every ciphertext's size;
2. the **encrypted manifest** (its ciphertext hashed against the public lock, then decrypted
   whole, its age tags and MAC checked) holds the clear lock, the ciphertext -> clear name map
   and, from manifest version 3, each ciphertext's header digest and payload start;
3. a ciphertext's **header** (its bytes up to the payload) must hash to the manifest's record
   before its file key is unwrapped: the key the chunks are checked under is the one encrypt
   chose (a file re-encrypted by anyone who can encrypt to the readers, or by an older rekey,
   has another header);
4. each **chunk** read is authenticated by its Poly1305 tag under that key, its nonce its index
   and last-chunk flag (the chunk count from the ciphertext size the public lock records): a
   chunk swapped, moved, taken from another file or cut short fails;
5. what the chunks decrypt to is a clear file's range, checked by the clear lock's sha256 (a
   shard's index, read whole) or the index's sha256 and checksums (a memory) before it is
   parsed or any tensor is built.

A cube whose manifest predates version 3 (no header records; none of them is sharded) is read
whole, file by file: each ciphertext hashed against the public lock, then decrypted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.paths import resolve_inside
from .._util.ramdir import anonymous_memory
from .._util.safetensors_header import open_regular
from ..errors import FormatError, IntegrityError, UsageError
from ..format import _lock as lockfile
from ..format.sections import Lock, Locator
from ..trust import _age as age
from ..trust import _age_range as ranges
from ._private import MAX_HEADER_BYTES, is_private, read_manifest

__all__ = ["PrivateRanges", "local_reader"]

#: ``read(ciphertext name, offset, length)``: exactly those bytes of the ciphertext (a local
#: file, or one HTTP Range request), its size the public lock's (the reader refuses another).
Reader = Callable[[str, int, int], Any]


class PrivateRanges:
    """A private cube opened for reading its clear files by range: :attr:`lock` is its clear
    lock (from the encrypted manifest), :meth:`fetch` a clear file's bytes (a
    :class:`Locator` of the clear lock), each decrypted from the chunks it lies in only.
    ``requests`` counts the reads made (for the tests and the benchmarks)."""

    def __init__(self, public_lock: Lock, read: Reader, identity: Any, where: str) -> None:
        if not is_private(public_lock):
            raise UsageError(f"{where} is not a private cube (its lock has no encryption "
                             "section): load it without decrypt_with.")
        self.public_lock = public_lock
        self.where = where
        self._read = read
        self._identities = age.load_identities(identity)
        encryption = public_lock.encryption
        assert encryption is not None
        self.manifest, self.lock = read_manifest(
            public_lock, self._whole(encryption.manifest), self._identities)
        self._cipher_of = {clear: cipher for cipher, clear in self.manifest["names"].items()}
        self._heads: dict[str, ranges.StreamHead] = {}
        #: what a reader of the clear files parsed of them, once (a shard's index)
        self.indexes: dict[str, Any] = {}

    def _whole(self, cipher: str) -> bytes:
        """The ciphertext ``cipher`` whole, its sha256 and size the public lock's."""
        entry = self.public_lock.files[cipher]
        data = self._read(cipher, 0, entry.size)
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise IntegrityError(f"{cipher} of {self.where} is not the ciphertext the cube's "
                                 "lock records (its sha256 or size differs); nothing was "
                                 "decrypted.")
        return data

    def fetch(self, locator: Locator) -> Any:
        """The bytes of ``locator`` (a range of a clear file of :attr:`lock`), decrypted from
        the chunks holding them (their tags checked), in private anonymous memory. Not checked
        against the locator's sha256: its reader does that (the index, the memory).

        Raises:
            FormatError: the clear lock lists no such file, or the range lies outside it.
            IntegrityError: a header that is not the manifest's, a chunk that fails its tag,
                a ciphertext that is not the public lock's size.
        """
        clear = self.lock.files.get(locator.path)
        cipher = self._cipher_of.get(locator.path)
        if clear is None or cipher is None:
            raise FormatError(f"{locator.path} is not a file of the private lock of "
                              f"{self.where}.")
        if locator.offset < 0 or locator.length < 1 or locator.end > clear.size:
            raise FormatError(f"{locator.path} [{locator.offset}:{locator.end}] lies outside "
                              f"its {clear.size} bytes.")
        headers = self.manifest["headers"]
        if headers is None:  # before manifest version 3: the file whole, each time (no
            # plaintext is kept between reads: its one memory is read once)
            found: list[Any] = []

            def allocate(size: int) -> Any:
                found.append(anonymous_memory(size))
                return found[0]

            age.decrypt_to(self._whole(cipher), self._identities, cipher, allocate)
            if len(found[0]) != clear.size:
                raise IntegrityError(f"{cipher} of {self.where} holds {len(found[0])} bytes of "
                                     f"plaintext, its private lock records {clear.size}.")
            return memoryview(found[0])[locator.offset:locator.end]
        start, digest = headers[cipher]
        total = self.public_lock.files[cipher].size
        head = self._heads.get(cipher)
        prefix = None
        if head is None:
            # The manifest's word, bounded before it sizes a read: a header is at most
            # MAX_HEADER_BYTES, and the file is the public lock's size.
            if start > min(total, MAX_HEADER_BYTES + 16):
                raise IntegrityError(f"{cipher} of {self.where}: its manifest says its payload "
                                     f"starts past {min(total, MAX_HEADER_BYTES + 16)} bytes "
                                     f"(at {start}; the file is {total}): the manifest lies "
                                     "about the file; nothing was read.")
            first_chunk = locator.offset < ranges.CHUNK
            # The header, and the span too when it starts in the first chunk: one read (no
            # further than the file: the span is checked against the header's size once read).
            end = min(total, ranges.chunk_span(_sized(start, clear.size), locator.offset,
                                               locator.length)[3]) if first_chunk else start
            prefix = self._read(cipher, 0, end)
            head = self._open(cipher, prefix, start, digest, total, clear.size)
        begin, end = ranges.chunk_span(head, locator.offset, locator.length)[2:]
        if prefix is not None and len(prefix) >= end:
            data = memoryview(prefix)[begin:end]
        else:
            data = self._read(cipher, begin, end - begin)
        out = anonymous_memory(locator.length)
        ranges.decrypt_span(head, locator.offset, locator.length, data, out,
                            f"{cipher} of {self.where}")
        return out

    def _open(self, cipher: str, prefix: Any, start: int, digest: str, total: int,
              size: int) -> ranges.StreamHead:
        """The header of ``cipher`` (``prefix``: its first bytes) checked against the
        manifest's record, then opened; the plaintext size its clear lock entry's."""
        if len(prefix) < start or hashlib.sha256(bytes(prefix[:start])).hexdigest() != digest:
            raise IntegrityError(f"{cipher} of {self.where} has another age header than the "
                                 "one its manifest records (the file was encrypted again, by "
                                 "someone else or an older rekey); nothing was decrypted. "
                                 "Pull the cube again.")
        head = ranges.open_head(prefix, self._identities, cipher, total)
        if head.start != start or head.size != size:
            raise IntegrityError(f"{cipher} of {self.where} holds {head.size} bytes of "
                                 f"plaintext, its private lock records {size}; nothing was "
                                 "decrypted.")
        self._heads[cipher] = head
        return head


def _sized(start: int, size: int) -> ranges.StreamHead:
    """A header stand-in to compute a span with before the header is read (where the payload
    starts, and the plaintext size: the manifest's and the clear lock's records)."""
    return ranges.StreamHead(start, "", size, None)


def local_reader(cube: Path) -> tuple[Lock, Reader]:
    """(the public lock, a reader of its ciphertexts) of the private cube folder ``cube``:
    each read one ``pread`` of a regular file inside the folder, whose size must be the
    public lock's (a truncated or grown file is refused before a byte is decrypted)."""
    public = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())

    def read(cipher: str, offset: int, length: int) -> bytes:
        listed = public.files.get(cipher)
        if listed is None:
            raise FormatError(f"{cipher} is not a file of the lock of {cube}.")
        with open_regular(resolve_inside(cube, cipher)) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != listed.size:
                raise IntegrityError(f"{cube / cipher} is {size} bytes, its lock records "
                                     f"{listed.size}: it was truncated or replaced. Pull the "
                                     "cube again.")
            return os.pread(handle.fileno(), length, offset)

    return public, read
