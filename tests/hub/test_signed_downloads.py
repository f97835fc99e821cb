"""A signed cube still verifies after every normal download flow: ``cubepack pull`` (which
leaves ``.cache/cubepack/origin.json``), ``hf download --local-dir`` (``.cache/huggingface/``)
and a re-pack of the pulled folder; the file-set rule says what a signature covers, and pack,
verify, sign, push and pull all ask it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import constants
from cubepack.hub import pull, push

from data import HUB_TOKEN
from helpers import copy_of, make_key


@pytest.fixture
def published(hub, packed_cube_factory, tmp_path):
    key, public = make_key(tmp_path, "publisher")
    cube = copy_of(packed_cube_factory(), tmp_path / "cube")
    cubepack.pack(cube, sign_key=key)
    sha = push(cube, "ns/signed", endpoint=hub.url, token=HUB_TOKEN,
               allow_local_paths=True).commit_sha
    return sha, key, public


def test_a_pulled_signed_cube_verifies_with_its_key(hub, published, tmp_path):
    sha, _, public = published
    placed = tmp_path / "placed"
    pull(f"ns/signed@{sha}", endpoint=hub.url, local_dir=placed, cache_dir=tmp_path / "c",
         trusted_keys=[public])
    assert (placed / ".cache" / "cubepack" / "origin.json").is_file()
    report = cubepack.verify(placed, trusted_keys=[public], require_signature=True)
    assert report.ok and report.signed_by == str(public)


def test_hf_download_local_dir_of_a_signed_cube_verifies(hub, published, tmp_path):
    from huggingface_hub import snapshot_download

    sha, _, public = published
    folder = tmp_path / "hf-local"
    snapshot_download("ns/signed", repo_type="dataset", revision=sha, endpoint=hub.url,
                      local_dir=folder, cache_dir=tmp_path / "hf-cache")
    assert (folder / ".cache" / "huggingface").is_dir()
    assert cubepack.verify(folder, trusted_keys=[public], require_signature=True).ok


def test_a_repack_of_a_pulled_folder_pushes_no_bookkeeping(hub, published, tmp_path):
    sha, key, public = published
    placed = tmp_path / "placed"
    pull(f"ns/signed@{sha}", endpoint=hub.url, local_dir=placed, cache_dir=tmp_path / "c")
    (placed / "notes.txt").write_text("a reviewer's note\n")
    cubepack.pack(placed, sign_key=key)
    locked = json.loads((placed / constants.LOCK_FILENAME).read_text())["files"]
    assert not any(name.startswith(".cache/") for name in locked)
    result = push(placed, "ns/signed", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    assert not any(name.startswith(".cache/") for name in result.uploaded)
    again = tmp_path / "again"
    pull(f"ns/signed@{result.commit_sha}", endpoint=hub.url, local_dir=again,
         cache_dir=tmp_path / "c2", trusted_keys=[public])
    assert cubepack.verify(again, trusted_keys=[public], require_signature=True).ok
