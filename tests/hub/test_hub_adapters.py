"""A cube's LoRA adapter through push and pull: pull --verify refuses it on another base (the
fields named) before the cube is placed; a base named by a local path is not pushed by
default."""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack import UsageError, VerificationFailed
from cubepack.hub import pull, push

from data import HUB_TOKEN
from helpers import make_adapter

TOKEN = HUB_TOKEN


@pytest.fixture
def cube(tmp_path, zoo):
    cube = tmp_path / "cube"
    make_adapter(zoo["a"], cube / "parametric" / "lora")
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    return cube


def test_pull_verify_refuses_the_adapter_on_another_base(hub, cube, zoo, tmp_path):
    pushed = push(cube, "ns/adapter", endpoint=hub.url, token=TOKEN, allow_local_paths=True)
    spec = f"ns/adapter@{pushed.commit_sha}"
    with pytest.raises(VerificationFailed) as caught:
        pull(spec, endpoint=hub.url, token=TOKEN, local_dir=tmp_path / "b",
             cache_dir=tmp_path / "hf", model=zoo["b"])
    failed = [c for c in caught.value.report.failures if c.role == "adapter.lora"]
    assert any(c.subject.endswith("weights_digest") for c in failed), failed
    assert not (tmp_path / "b").exists()
    pulled = pull(spec, endpoint=hub.url, token=TOKEN, local_dir=tmp_path / "a",
                  cache_dir=tmp_path / "hf", model=zoo["a"])
    assert any(c.name == "adapter base" and c.ok for c in pulled.report.checks)


def test_an_adapter_naming_its_base_by_a_local_path_is_not_pushed_by_default(hub, cube, zoo):
    claimed = json.loads((cube / "parametric/lora/adapter_config.json").read_text())[
        "base_model_name_or_path"]
    assert claimed == str(zoo["a"])
    with pytest.raises(UsageError, match="names its base model by the local path"):
        push(cube, "ns/adapter", endpoint=hub.url, token=TOKEN)
    assert hub.stats.commits == 0


def test_a_folder_hf_download_made_packs_with_its_adapters(hub, cube, zoo, tmp_path):
    """`hf download --local-dir` keeps its bookkeeping in the folder (.cache/huggingface/:
    a .metadata file and a .lock per file, named after it): pack's adapter scan took
    `parametric/lora/adapter_model.safetensors.metadata` there for an adapter file outside
    parametric/ and refused the folder. The file-set rule says what is bookkeeping."""
    from huggingface_hub import snapshot_download

    from cubepack.format import _fileset as fileset

    pushed = push(cube, "ns/adapter", endpoint=hub.url, token=TOKEN, allow_local_paths=True)
    folder = tmp_path / "downloaded"
    snapshot_download("ns/adapter", repo_type="dataset", revision=pushed.commit_sha,
                      local_dir=folder, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "hf")
    kept = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    assert any(fileset.is_bookkeeping(name) and "parametric/lora/" in name for name in kept)
    before = json.loads((folder / "cubepack.lock").read_text())
    result = cubepack.pack(folder, adapter_base=str(zoo["a"]))
    after = json.loads((folder / "cubepack.lock").read_text())
    assert sorted(result.adapters) == ["lora"] and after["adapters"] == before["adapters"]
    # the lock lists what it listed, and the Hub's .gitattributes the download brought
    assert set(after["files"]) == set(before["files"]) | {".gitattributes"}
    assert not any(fileset.is_bookkeeping(name) for name in after["files"])
    assert cubepack.verify(folder, model=str(zoo["a"])).ok
