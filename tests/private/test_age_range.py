"""Part of an age file decrypted by chunk (``trust/_age_range.py``): every span, swept across
chunk boundaries (inside one chunk, across two, ending at the last partial chunk, the whole
file, of files whose last chunk is full or partial, on one thread or one run a core), decrypts
to the plaintext's bytes from exactly the chunks :func:`chunk_span` names."""

from __future__ import annotations

import os

import pytest

from cubepack.errors import FormatError
from cubepack.trust import _age as age
from cubepack.trust import _age_range as ranges

CHUNK = 65536


@pytest.fixture(scope="module")
def identity():
    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    return pyrage.x25519.Identity.generate()


@pytest.mark.parametrize("size", [1, CHUNK - 1, CHUNK, 3 * CHUNK, 3 * CHUNK + 1234,
                                  70 * CHUNK + 5])
def test_every_span_decrypts_to_the_plaintext_from_its_own_chunks(identity, size):
    plain = os.urandom(size)
    data = bytes(age.encrypt(plain, age.parse_recipients([str(identity.to_public())])))
    head = ranges.open_head(data, [str(identity)], "f", len(data))
    assert (head.start, head.size) == (ranges.head_digest(data)[0], size)
    edges = sorted({0, 1, size - 1, *(k * CHUNK + d for k in range(size // CHUNK + 1)
                                      for d in (-1, 0, 1))} & set(range(size)))
    spans = {(o, n) for o in edges for n in (1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK,
                                             size - o) if 0 < n <= size - o}
    for offset, length in sorted(spans):
        first, last, begin, end = ranges.chunk_span(head, offset, length)
        assert (first, last) == (offset // CHUNK, (offset + length - 1) // CHUNK)
        out = bytearray(length)
        ranges.decrypt_span(head, offset, length, data[begin:end], out, "f")
        assert out == plain[offset:offset + length], (offset, length)


def test_a_span_outside_the_file_is_refused(identity):
    data = bytes(age.encrypt(b"x" * 100, age.parse_recipients([str(identity.to_public())])))
    head = ranges.open_head(data, [str(identity)], "f", len(data))
    for offset, length in [(0, 101), (100, 1), (-1, 2), (5, 0)]:
        with pytest.raises(FormatError, match="outside"):
            ranges.chunk_span(head, offset, length)
