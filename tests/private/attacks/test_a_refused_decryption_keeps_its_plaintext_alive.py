"""Promise 4 of issue #32 ("decrypted only in memory", and memory released): a private file
whose ciphertext fails age's check part-way (a chunk damaged at its end) was decrypted, chunk
by chunk, into private memory before the damaged chunk was reached; the refusal's traceback
still held that memory (``decrypted_memory``'s list of what it allocated, ``decrypted_file``'s
map of the memory file), so every authenticated chunk's plaintext stayed alive for as long as
the caller kept the error: a retry loop that logs its errors, ``sys.last_value`` in a REPL,
a framework that stores the last exception. A refusal must hold no plaintext."""

from __future__ import annotations

import mmap
import traceback

import pytest
from private_keys import age_keys

from cubepack.errors import RefusedError
from cubepack.ops._private import decrypted_file, decrypted_memory
from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream

pytest.importorskip("pyrage")


def _live_maps(error: BaseException) -> list[str]:
    """Every open map a frame of ``error``'s traceback still reaches (directly or in a list)."""
    found = []
    for frame, _ in traceback.walk_tb(error.__traceback__):
        for name, value in frame.f_locals.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, mmap.mmap) and not item.closed:
                    found.append(f"{frame.f_code.co_name}: {name}")
    return found


@pytest.mark.parametrize("reader", ["memory", "file"])
def test_a_refused_decryption_leaves_no_plaintext_behind_in_its_error(tmp_path, reader):
    keys = age_keys(tmp_path, "alice")
    secret = b"private memory " * 300_000  # 4.5 MB: several runs of chunks
    good = bytearray(age.encrypt(secret, age.parse_recipients([keys["alice"][1]])))
    good[-5] ^= 1  # the last chunk damaged: every other chunk authenticates and is decrypted
    damaged = tmp_path / "item.kv.safetensors.age"
    damaged.write_bytes(good)
    assert len(secret) > stream.PARALLEL_CHUNKS * stream.CHUNK
    with pytest.raises(RefusedError) as refused:
        if reader == "memory":
            decrypted_memory(damaged, keys["alice"][0])
        else:
            with decrypted_file(damaged, keys["alice"][0]):
                pass
    assert _live_maps(refused.value) == []
