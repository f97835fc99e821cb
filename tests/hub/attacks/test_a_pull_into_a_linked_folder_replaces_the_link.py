"""Adversary (issue #40, item 5): `pull --local-dir LINK` replaces the user's link to a folder.

The promise (docs/how-to/hub.md, "Where the bytes go"): "Disk needed: the cube's size, once,
on the file system of `--local-dir`"; a pull places the cube at `--local-dir`, and a failed or
finished pull leaves nothing else behind. A new user with a small home disk does what every
guide says: `ln -s /bigdisk/cubes/mine ~/work/mine`, then `cubepack pull ... --local-dir
~/work/mine` (and, later, the same command to update it).

What happened: the staging folder was made beside the link (on the small disk), and the swap
exchanged the link itself with it: `~/work/mine` became a real folder on the small disk, the
folder the link named stayed empty (or at the old commit, on an update), and the link was left
beside it as `.mine.pull.<pid>.*` (removing the old side failed silently: rmtree refuses a
link), never cleaned up.

The fix: a `--local-dir` that is a link to a folder is pulled into the folder it names (its
staging folder beside that one, on its file system); the link is left as it was, naming the
pulled folder.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import cubepack
from cubepack.hub import pull, push
from cubepack.testing.blobs import write_safetensors_blob
from cubepack.testing.hub import InstrumentedHub

MIB = 1024 * 1024


def make_cube(folder: Path, seed: int) -> Path:
    block = random.Random(0).randbytes(MIB)
    for index in range(2):
        write_safetensors_blob(folder / "data" / f"part-{index}.safetensors", 2 * MIB,
                               seed=index + seed, block=block)
    (folder / "config.json").write_text('{"cube_id": "ns/linked"}')
    cubepack.pack(folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("linked")
    with InstrumentedHub(root / "hub-root") as server:
        server.v1 = push(make_cube(root / "v1", 0), "ns/linked", endpoint=server.url).commit_sha
        server.v2 = push(make_cube(root / "v2", 100), "ns/linked",
                         endpoint=server.url).commit_sha
        yield server


def test_a_linked_local_dir_is_pulled_into_the_folder_it_names(hub, tmp_path):
    real = tmp_path / "bigdisk" / "mine"
    real.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    link = tmp_path / "work" / "mine"
    link.symlink_to(real)
    for sha in (hub.v1, hub.v2):  # a first pull, then an update
        pull(f"ns/linked@{sha}", endpoint=hub.url, local_dir=link, progress=False,
             cache_dir=tmp_path / "hf-cache")
        assert link.is_symlink() and link.resolve() == real.resolve()
        assert (real / "cubepack.lock").is_file()
        assert cubepack.verify(real).ok
        assert sorted(p.name for p in link.parent.iterdir()) == ["mine"]  # nothing beside it
        assert sorted(p.name for p in real.parent.iterdir()) == ["mine"]
    assert (real / ".cache" / "cubepack" / "origin.json").read_text().count(hub.v2) == 1
