"""Fuzzing the two parsers that read untrusted bytes: the lock and the KV header.

Properties:
- whatever the bytes, the parser either accepts them or raises a CubepackError; never another
  exception, never a hang (hypothesis's deadline fails slow examples);
- a mutation of a valid lock that is *not* resealed (its digests not recomputed) is refused,
  and so is a cube whose KV file was mutated under an unchanged lock: these would pass if the
  parsers accepted everything.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubepack
from cubepack import CubepackError
from cubepack._util.safetensors_header import parse_header
from cubepack.format import _lock as lockfile
from cubepack.kv import read_kv_header

from envs import once

pytestmark = once

# CI runs a fixed, derandomized set (a red CI must be reproducible); set CUBEPACK_FUZZ_EXAMPLES
# to explore further locally with fresh random inputs.
_EXPLORE = int(os.environ.get("CUBEPACK_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_EXPLORE or 300, deadline=2000, derandomize=not _EXPLORE,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=20)


@pytest.fixture(scope="module")
def good_lock(packed_cube_factory):
    cube = packed_cube_factory()
    return (cube / "cubepack.lock").read_bytes(), cube / "activations" / "item-1.kv.safetensors"


def parses_or_refuses(action) -> None:
    try:
        action()
    except CubepackError:
        pass


@FUZZ
@given(data=st.binary(max_size=2048))
def test_lock_parser_on_arbitrary_bytes(data):
    parses_or_refuses(lambda: lockfile.parse(data))


def replace_somewhere(document, choice, replacement):
    """Replace the value at the ``choice``-th path of ``document`` (in place)."""
    paths = [p for p in _paths(document) if p]
    path = paths[choice % len(paths)]
    holder = document
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = replacement


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, prefix + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, prefix + (index,))


@FUZZ
@given(choice=st.integers(min_value=0), replacement=json_values, reseal=st.booleans())
def test_lock_parser_on_mutated_valid_locks(good_lock, choice, replacement, reseal):
    lock = json.loads(good_lock[0])
    replace_somewhere(lock, choice, replacement)
    if reseal and isinstance(lock, dict):
        from cubepack._util import canonical

        lock.pop("digest", None)
        try:
            lock["digest"] = canonical.digest(lock)
        except (TypeError, ValueError):
            return
    parses_or_refuses(lambda: lockfile.parse(json.dumps(lock).encode()))


@FUZZ
@given(choice=st.integers(min_value=0), replacement=json_values)
def test_unresealed_lock_mutations_are_refused(good_lock, choice, replacement):
    original = json.loads(good_lock[0])
    lock = json.loads(good_lock[0])
    replace_somewhere(lock, choice, replacement)
    if lock == original:
        return  # replaced a value by itself: nothing to refuse
    with pytest.raises(CubepackError):
        lockfile.parse(json.dumps(lock).encode())


@FUZZ
@given(raw=st.binary(max_size=1024), file_size=st.integers(min_value=0, max_value=2**40))
def test_kv_header_parser_on_arbitrary_bytes(raw, file_size):
    parses_or_refuses(lambda: parse_header(raw, file_size))


@FUZZ
@given(header=st.dictionaries(st.text(max_size=12), json_values, max_size=6),
       file_size=st.integers(min_value=0, max_value=4096))
def test_kv_header_parser_on_arbitrary_json(header, file_size):
    raw = json.dumps(header).encode()
    parses_or_refuses(lambda: parse_header(raw, file_size + 8 + len(raw)))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
                      min_size=1, max_size=8),
       cut=st.none() | st.integers(min_value=0))
def test_kv_reader_on_corrupted_files(good_lock, tmp_path_factory, flips, cut):
    original = good_lock[1].read_bytes()
    (length,) = struct.unpack("<Q", original[:8])
    data = bytearray(original)
    for offset, mask in flips:
        data[offset % (8 + length)] ^= mask  # corrupt the length prefix and the header
    if cut is not None:
        data = data[: cut % len(data)]
    path = tmp_path_factory.mktemp("kv") / "fuzzed.kv.safetensors"
    path.write_bytes(bytes(data))
    parses_or_refuses(lambda: read_kv_header(path))


@FUZZ
@given(choice=st.integers(min_value=0), replacement=json_values)
def test_kv_reader_on_mutated_metadata(good_lock, tmp_path_factory, choice, replacement):
    from helpers import rewrite_kv_metadata

    path = tmp_path_factory.mktemp("kvmeta") / "fuzzed.kv.safetensors"
    rewrite_kv_metadata(good_lock[1], path, lambda meta: replace_somewhere(meta, choice, replacement))
    parses_or_refuses(lambda: read_kv_header(path))


@settings(FUZZ, max_examples=_EXPLORE or 60)
@given(choice=st.integers(min_value=0), replacement=json_values)
def test_kv_metadata_mutated_under_an_unchanged_lock_is_refused(good_lock, tmp_path_factory,
                                                               choice, replacement):
    import shutil

    from helpers import rewrite_kv_metadata

    source = good_lock[1]
    cube = tmp_path_factory.mktemp("kvcube") / "cube"
    shutil.copytree(source.parent.parent, cube)
    target = cube / "activations" / source.name
    rewrite_kv_metadata(source, target, lambda meta: replace_somewhere(meta, choice, replacement))
    if target.read_bytes() == source.read_bytes():
        return
    with pytest.raises(cubepack.VerificationFailed):
        cubepack.verify(cube)
