"""``pull --local-dir`` keeps each byte once, as ``hf download --local-dir`` does (issue #40
item 5): the files are downloaded into the staging folder beside the target (huggingface_hub's
local-dir mode, its bookkeeping in ``.cache/huggingface/``), hashed there, verified, and only
then swapped in; the HF cache receives no file of the cube. An earlier pull at the target is
updated by hash: an unchanged file is linked into the staging folder and hashed by this process
(a record is a claim), never downloaded again. Bytes are counted from the process's own I/O
counters (``/proc/self/io`` ``write_bytes``: this machine's file system is ext4, which charges a
page to the task that dirties it), requests from the endpoint's."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

import cubepack
from cubepack.hub import pull, push
from cubepack.testing.blobs import write_safetensors_blob
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes

MIB = 1024 * 1024
PARTS = 3
CHANGED = "data/part-1.safetensors"


def write_bytes() -> int:
    """Bytes this process (every thread) has caused to be written to a block device."""
    with open("/proc/self/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["write_bytes"])


def make_cube(folder: Path, *, changed: bool = False) -> Path:
    block = random.Random(0).randbytes(MIB)  # v1 and v2 share every file but CHANGED
    for index in range(PARTS):
        seed = index + (100 if changed and f"data/part-{index}.safetensors" == CHANGED else 0)
        write_safetensors_blob(folder / "data" / f"part-{index}.safetensors", 8 * MIB,
                               seed=seed, block=block)
    (folder / "config.json").write_text('{"cube_id": "ns/big"}')
    cubepack.pack(folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-dir")
    with InstrumentedHub(root / "hub-root") as server:
        first = make_cube(root / "v1")
        server.v1 = push(first, "ns/big", endpoint=server.url).commit_sha
        second = make_cube(root / "v2", changed=True)
        server.v2 = push(second, "ns/big", endpoint=server.url).commit_sha
        server.size = sum(path.stat().st_size for path in first.rglob("*") if path.is_file())
        yield server


def do_pull(hub, target, sha, tmp_path, **kwargs):
    kwargs.setdefault("cache_dir", tmp_path / "hf-cache")
    return pull(f"ns/big@{sha}", endpoint=hub.url, local_dir=target, progress=False, **kwargs)


def cached_files(tmp_path) -> list[str]:
    """The HF cache's files (its blobs, snapshots' links), without the refs a pull records."""
    root = tmp_path / "hf-cache"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if (p.is_file() or p.is_symlink()) and "/refs/" not in p.as_posix())


def gets(hub, name: str) -> int:
    return sum(count for key, count in hub.stats.requests.items()
               if key.startswith("GET ") and "/resolve/" in key and key.endswith(name))


def test_a_pull_writes_each_byte_once(hub, tmp_path):
    before = write_bytes()
    result = do_pull(hub, tmp_path / "out", hub.v1, tmp_path)
    written = write_bytes() - before
    assert result.report.ok
    assert written <= 1.02 * hub.size, f"{written} bytes written for a {hub.size}-byte cube"
    assert cached_files(tmp_path) == []  # the one copy is the folder's


def test_an_update_downloads_and_writes_only_what_changed(hub, tmp_path):
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    kept = {name: os.stat(target / name).st_ino for name in tree_bytes(target)
            if name.startswith("data/") and name != CHANGED}
    hub.stats.reset()
    before = write_bytes()
    result = do_pull(hub, target, hub.v2, tmp_path)
    written = write_bytes() - before
    assert result.report.ok and result.commit_sha == hub.v2
    assert gets(hub, CHANGED) == 1
    assert all(gets(hub, name) == 0 for name in kept), hub.stats.requests  # never downloaded again
    changed_size = os.stat(target / CHANGED).st_size
    assert written <= changed_size + 0.02 * hub.size, written
    # The unchanged files are the very files the earlier pull placed, now of this one only.
    for name, inode in kept.items():
        st = os.stat(target / name)
        assert st.st_ino == inode and st.st_nlink == 1
    assert cubepack.verify(target).ok
