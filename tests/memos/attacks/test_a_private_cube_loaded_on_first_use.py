"""The hook's load on first use (``init_from_remote_repo(..., on_demand=True)``) does not open
a private cube (its docs say so: pull it). It relied on ``cubepack.open`` refusing one; now
that ``open`` opens a private cube (its memories load with ``decrypt_with``), the hook must
refuse it itself, typed and naming the pull, before MemOS builds anything, rather than
verify ciphertexts as a clear cube's files and install memories it cannot read."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack.hub import push
from cubepack.testing.hub import InstrumentedHub


def test_a_private_cube_is_refused_on_demand_naming_the_pull(packed_cube_factory, tmp_path):
    cube = tmp_path / "cube"
    shutil.copytree(packed_cube_factory(), cube)  # the factory's folder is read-only
    cubepack.encrypt(cube, ["age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"])
    hook.install(require_pin=False)
    try:
        with InstrumentedHub(tmp_path / "hub-root") as hub:
            sha = push(cube, "ns/private", endpoint=hub.url).commit_sha
            with pytest.raises(cubepack.UnsupportedError, match="private cube.*pull"):
                hook.init_from_remote_repo(f"ns/private@{sha}", endpoint=hub.url,
                                           on_demand=True)
    finally:
        hook.uninstall()
