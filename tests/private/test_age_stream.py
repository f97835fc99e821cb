"""The native age path (X25519 + STREAM on ``cryptography``) against pyrage and the age CLI:
same plaintext both ways at every chunk boundary, and every tampering refused."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cubepack.errors import FormatError, RefusedError
from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream

pyrage = pytest.importorskip("pyrage")
pytest.importorskip("cryptography")

SIZES = [0, 1, stream.CHUNK - 1, stream.CHUNK, stream.CHUNK + 1, 2 * stream.CHUNK, 200_001]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path_factory.mktemp("key") / "key.txt"
    path.write_text(f"{identity}\n")
    os.chmod(path, 0o600)
    return identity, age.parse_recipients([str(identity.to_public())]), path


@pytest.mark.parametrize("size", SIZES)
def test_native_and_pyrage_read_each_other(pair, size):
    identity, recipients, _ = pair
    data = os.urandom(size)
    ours = age.encrypt(data, recipients)
    assert pyrage.decrypt(bytes(ours), [identity]) == data
    assert age.decrypt(pyrage.encrypt(data, [identity.to_public()]), [identity], "f") == data


@pytest.mark.skipif(shutil.which("age") is None, reason="needs Debian's age CLI")
@pytest.mark.parametrize("size", [0, stream.CHUNK, 200_001])
def test_the_age_cli_reads_the_native_output(pair, tmp_path, size):
    identity, recipients, key = pair
    data = os.urandom(size)
    (tmp_path / "f.age").write_bytes(age.encrypt(data, recipients))
    done = subprocess.run(["age", "-d", "-i", str(key), str(tmp_path / "f.age")],
                          capture_output=True, check=True)
    assert done.stdout == data


def test_every_tampering_is_refused(pair):
    identity, recipients, _ = pair
    good = age.encrypt(os.urandom(3 * stream.CHUNK + 5), recipients)
    header_end = good.index(b"\n--- ") + 1
    mac_line_end = good.index(b"\n", header_end) + 1
    cases = {
        "header byte": good[:30] + bytes([good[30] ^ 1]) + good[31:],
        "MAC": good[:header_end + 6] + bytes([good[header_end + 6] ^ 1]) + good[header_end + 7:],
        "nonce": good[:mac_line_end] + bytes([good[mac_line_end] ^ 1]) + good[mac_line_end + 1:],
        "payload": good[:-100] + bytes([good[-100] ^ 1]) + good[-99:],
        "truncated to a chunk boundary": good[:mac_line_end + 16 + 3 * (stream.CHUNK + 16)],
        "truncated": good[:-3],
        "chunk dropped": good[:mac_line_end + 16] + good[mac_line_end + 16 + stream.CHUNK + 16:],
    }
    for name, bad in cases.items():
        with pytest.raises((RefusedError, FormatError)):
            age.decrypt(bad, [identity], name)
        with pytest.raises(Exception):  # noqa: B017 - pyrage agrees it is not age's
            pyrage.decrypt(bytes(bad), [identity])


def test_a_stranger_is_named_not_a_recipient(pair):
    _, recipients, _ = pair
    with pytest.raises(RefusedError, match="not encrypted to the identity given"):
        age.decrypt(age.encrypt(b"x", recipients), [pyrage.x25519.Identity.generate()], "f")


# --- the parallel path: one run of chunks a thread, straight into one destination ---------------
# Three runs of 8 chunks (PARALLEL_CHUNKS lowered to 4, three workers asked for), whatever this
# machine's core count: the split, the runs' boundaries and the error a run reports are the
# ones a large cache takes on a 3-core machine.

RUNS, RUN = 3, 8


@pytest.fixture
def three_runs(monkeypatch):
    monkeypatch.setattr(stream, "PARALLEL_CHUNKS", 4)
    monkeypatch.setattr(stream, "workers", lambda: RUNS)


def _payload_start(ciphertext) -> int:
    return ciphertext.index(b"\n", ciphertext.index(b"\n--- ") + 1) + 1 + 16


def _flip(data, at: int) -> bytes:
    return bytes(data[:at]) + bytes([data[at] ^ 1]) + bytes(data[at + 1:])


@pytest.mark.parametrize("size", [RUNS * RUN * stream.CHUNK, RUNS * RUN * stream.CHUNK - 7])
def test_the_parallel_path_reads_and_writes_age_byte_for_byte(pair, three_runs, tmp_path, size):
    identity, recipients, key = pair
    data = os.urandom(size)
    ours = age.encrypt(data, recipients)
    assert pyrage.decrypt(bytes(ours), [identity]) == data
    assert age.decrypt(pyrage.encrypt(data, [identity.to_public()]), [identity], "f") == data
    if shutil.which("age"):
        (tmp_path / "f.age").write_bytes(ours)
        done = subprocess.run(["age", "-d", "-i", str(key), str(tmp_path / "f.age")],
                              capture_output=True, check=True)
        assert done.stdout == data


def test_a_bad_chunk_in_any_run_is_refused_and_the_first_is_named(pair, three_runs):
    identity, recipients, _ = pair
    good = age.encrypt(os.urandom(RUNS * RUN * stream.CHUNK + 5), recipients)
    start = _payload_start(good)

    def inside(chunk: int) -> int:  # a byte in the middle of chunk ``chunk``'s ciphertext
        return start + chunk * (stream.CHUNK + stream.TAG) + stream.CHUNK // 2

    cases = {  # chunks damaged -> the chunk named
        (RUN + RUN // 2,): RUN + RUN // 2,  # the middle of the second thread's run
        (RUN,): RUN,  # the first chunk of the second run
        (2 * RUN + 3, RUN + 1): RUN + 1,  # two runs fail: the lower chunk is named
        (2 * RUN + 3, 1): 1,  # the calling thread's run and the last run
        (RUNS * RUN,): RUNS * RUN,  # the short last chunk (the third run's end)
    }
    for damaged, named in cases.items():
        bad = good
        for chunk in damaged:
            bad = _flip(bad, min(inside(chunk), len(bad) - 1))
        with pytest.raises(RefusedError, match=f"fails authentication at chunk {named}:"):
            age.decrypt(bad, [identity], "f")
        with pytest.raises(Exception):  # noqa: B017 - pyrage agrees it is not age's
            pyrage.decrypt(bytes(bad), [identity])


def test_a_stream_cut_or_reordered_at_a_run_boundary_is_refused(pair, three_runs):
    identity, recipients, _ = pair
    good = age.encrypt(os.urandom(RUNS * RUN * stream.CHUNK), recipients)
    start = _payload_start(good)
    step = stream.CHUNK + stream.TAG

    def chunk(index: int) -> bytes:
        return good[start + index * step:start + (index + 1) * step]

    swapped = bytearray(good)  # the last chunk of run one and the first of run two, swapped
    swapped[start + (RUN - 1) * step:start + (RUN + 1) * step] = chunk(RUN) + chunk(RUN - 1)
    cases = {
        # the last chunk's flag is then on a chunk that was not flagged last: its tag fails
        "cut after the second run": (good[:start + 2 * RUN * step], RefusedError),
        "swapped across runs": (bytes(swapped), RefusedError),
        "a run's first chunk dropped": (good[:start + RUN * step] + good[start + (RUN + 1) * step:],
                                        RefusedError),
        # age's rule: a final empty chunk only in an empty file
        "an empty final chunk after full ones": (good + bytes(stream.TAG), FormatError),
        "cut inside the last chunk": (good[:-3], RefusedError),
        "cut to less than a tag after a run": (good[:start + 2 * RUN * step + 5], FormatError),
    }
    for name, (bad, error) in cases.items():
        with pytest.raises(error):
            age.decrypt(bad, [identity], name)
        with pytest.raises(Exception):  # noqa: B017 - pyrage agrees it is not age's
            pyrage.decrypt(bytes(bad), [identity])
