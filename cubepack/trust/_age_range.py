"""Part of an age file, decrypted by chunk (issue #40): a reader of one memory of a private
shard fetches the file's header and only the STREAM chunks its bytes lie in, never the whole
ciphertext.

age's payload is independent 64 KiB chunks: ciphertext chunk ``i`` is the ``CHUNK + TAG``
bytes at ``start + i * (CHUNK + TAG)`` (``start``: the header and the 16-byte nonce), its
nonce the counter ``i`` and the last-chunk flag. So plaintext bytes ``[offset, end)`` need the
chunks ``offset // CHUNK`` to ``(end - 1) // CHUNK`` alone, and each is authenticated by its own
Poly1305 tag under the file's key: a chunk moved, swapped with another of the file, taken from
another file, flagged last where it is not (or not where it is), or cut short fails its tag.
The last chunk's index comes from the ciphertext's size, which the caller takes from a lock it
trusts, never from the bytes it fetched.

What a tag cannot say is *which* file key is right: anyone who can encrypt to the readers makes
a file whose chunks pass under its own key. The caller binds the key through the header's
digest (:attr:`StreamHead.digest`, recorded in the cube's encrypted manifest) and the plaintext
through a digest it trusts (the memory's sha256): a tag proves a chunk is the file's, the
digests that the file is the cube's.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from .._util.ramdir import anonymous_memory
from ..errors import FormatError, IntegrityError, RefusedError
from . import _age_stream as stream
from ._age import _native, _not_a_recipient

__all__ = ["CHUNK", "StreamHead", "chunk_span", "decrypt_span", "head_digest", "open_head"]

#: A STREAM chunk's plaintext bytes (64 KiB; the last chunk may be shorter).
CHUNK = stream.CHUNK
#: One ciphertext chunk's bytes in the payload (a full chunk and its tag).
STRIDE = stream.CHUNK + stream.TAG


@dataclass(frozen=True)
class StreamHead:
    """An age file's header opened: where its payload starts (the header and nonce's bytes),
    their sha256, the plaintext size (from the ciphertext size the caller trusts) and the
    payload's AEAD under the file key."""

    start: int
    digest: str
    size: int
    aead: Any


def head_digest(data: Any) -> tuple[int, str]:
    """(where the payload starts, the sha256 of the bytes before it: header and nonce) of the
    age file ``data`` (its first bytes at least): what a private cube's manifest records of
    each ciphertext, so a reader binds the file key it unwraps to the one encrypt chose."""
    start = stream._parse_header(data, "ciphertext")[3] + 16
    return start, hashlib.sha256(bytes(data[:start])).hexdigest()


def open_head(data: Any, identities: list[Any], what: str, total: int) -> StreamHead:
    """Open the header at the start of ``data`` (at least the header and the nonce) of an
    age file of ``total`` bytes: the file key unwrapped by one of ``identities``, the
    header's MAC checked.

    Raises:
        FormatError: a malformed header, a payload size no age file has.
        RefusedError: no stanza opens to ``identities``; the header fails its MAC.
    """
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    stanzas, covered, mac, end = stream._parse_header(data, what)
    identities = _native(identities)
    file_key = stream._file_key(stanzas, identities, what)
    if file_key is None:
        raise _not_a_recipient(what, identities)
    expected = hmac.new(stream._hkdf(file_key, b"", b"header"), covered, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, mac):
        raise RefusedError(f"{what}'s age header fails its MAC: it was tampered with.")
    nonce = bytes(data[end:end + 16])
    if len(nonce) != 16:
        raise FormatError(f"{what}'s age payload is truncated (no nonce).")
    start = end + 16
    size = stream.plaintext_size(total - start, what)
    return StreamHead(start, hashlib.sha256(bytes(data[:start])).hexdigest(), size,
                      ChaCha20Poly1305(stream._hkdf(file_key, nonce, b"payload")))


def chunk_span(head: StreamHead, offset: int, length: int) -> tuple[int, int, int, int]:
    """(first chunk, last chunk, the ciphertext's first byte, its end) holding plaintext bytes
    ``[offset, offset + length)`` of the file ``head`` opened: what a ranged GET fetches.

    Raises:
        FormatError: the span lies outside the plaintext.
    """
    if offset < 0 or length < 1 or offset + length > head.size:
        raise FormatError(f"plaintext bytes [{offset}:{offset + length}] lie outside the "
                          f"file's {head.size} bytes.")
    first, last = offset // stream.CHUNK, (offset + length - 1) // stream.CHUNK
    chunks = max(1, -(-head.size // stream.CHUNK))
    end = head.start + (head.size - last * stream.CHUNK + stream.TAG if last == chunks - 1
                        else STRIDE) + last * STRIDE
    return first, last, head.start + first * STRIDE, end


def decrypt_span(head: StreamHead, offset: int, length: int, ciphertext: Any, out: Any,
                 what: str) -> None:
    """Decrypt plaintext bytes ``[offset, offset + length)`` of the file ``head`` opened into
    ``out`` (a writable buffer of ``length`` bytes), from ``ciphertext``: exactly the bytes
    :func:`chunk_span` names. Every chunk of the span is decrypted and its tag checked (its
    index and last-chunk flag in its nonce); a chunk wholly inside the span straight into
    ``out``, the first and last (whose bytes the neighbours share) into a scratch chunk of
    private anonymous memory, of which only the span's part is copied out before it is
    cleared. One run of chunks a core, as a whole file (:func:`_age_stream._each_run`).

    Raises:
        IntegrityError: the ciphertext is not the span's length, or a chunk fails its tag
            (the first such named): a chunk swapped, moved, taken from another file,
            truncated or damaged.
    """
    from cryptography.exceptions import InvalidTag

    first, last, begin, end = chunk_span(head, offset, length)
    if len(ciphertext) != end - begin:
        raise IntegrityError(f"{what}: {len(ciphertext)} bytes of ciphertext for chunks "
                             f"{first}-{last}, expected {end - begin}; nothing was decrypted.")
    chunks = max(1, -(-head.size // stream.CHUNK))
    failed: list[int] = []
    with memoryview(ciphertext) as data, memoryview(out) as target:

        def run(indices: range) -> None:
            scratch = view = None
            try:
                for k in indices:
                    index = first + k
                    is_last = index == chunks - 1
                    size = head.size - index * stream.CHUNK if is_last else stream.CHUNK
                    low = max(offset, index * stream.CHUNK) - index * stream.CHUNK
                    high = min(offset + length, index * stream.CHUNK + size) \
                        - index * stream.CHUNK
                    at, to = k * STRIDE, index * stream.CHUNK + low - offset
                    whole = low == 0 and high == size
                    if not whole and view is None:
                        scratch = anonymous_memory(stream.CHUNK)
                        view = memoryview(scratch)
                    try:
                        head.aead.decrypt_into(
                            stream._chunk_nonce(index, is_last),
                            data[at:at + size + stream.TAG], None,
                            target[to:to + size] if whole else view[:size])
                    except InvalidTag:
                        failed.append(index)
                        return
                    if not whole:
                        target[to:to + high - low] = view[low:high]
            finally:
                if view is not None:  # the neighbours' plaintext goes with the scratch
                    view[:] = bytes(len(view))
                    view.release()
                    scratch.close()

        stream._each_run(run, last - first + 1)
    if failed:
        raise IntegrityError(f"{what}'s age payload fails authentication at chunk "
                             f"{min(failed)}: it was swapped, moved, truncated or damaged; "
                             "nothing was loaded.")
