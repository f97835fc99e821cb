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
