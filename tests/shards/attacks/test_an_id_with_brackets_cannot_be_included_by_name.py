"""An item id holding fnmatch's special characters (``[``, ``]``, ``*``, ``?``; MemOS ids are
free text, a document's chunk may well be ``report[3]``): ``pull --include ID``, the very
command a load of the absent memory prints, matches no memory, since the id is read as a
pattern whose ``[3]`` is a character class. An id (or a path) equal to the argument is the
memory asked for, whatever fnmatch makes of it."""

from __future__ import annotations

import shlex

import pytest
import torch

import cubepack
from cubepack.errors import PartialCube
from cubepack.format import _partial as partialformat

from data import HUB_TOKEN

IDS = ["report[3]", "a*b", "what?", "plain-000"]


@pytest.fixture
def odd(zoo, models, tmp_path, hub):
    from helpers import build_cache

    cube = tmp_path / "cube"
    (cube / "activations").mkdir(parents=True)
    identity = cubepack.fingerprint(zoo["a"])
    for index, item in enumerate(IDS):
        ids = [(index * 7 + k) % 50 + 1 for k in range(4)]
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               cube / "activations" / f"m{index}.kv.safetensors",
                               producer=identity, token_ids=ids, metadata={"id": item})
    cubepack.pack(cube, cube_id="me/odd", model=str(zoo["a"]), shards=True)
    cubepack.push(cube, "me/odd", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    return cube


@pytest.mark.parametrize("item", IDS[:3])
def test_pull_include_of_an_id_selects_that_memory(odd, hub, tmp_path, models, item):
    target = tmp_path / "p"
    cubepack.pull("me/odd", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=["plain-000"])
    with pytest.raises(PartialCube) as caught:
        cubepack.load_kv_cache(target, models["a"], item=item)
    more = caught.value.args[0].split("Pull it too: ")[1].split(", or the whole cube: ")[0]
    asked = [arg for flag, arg in zip(shlex.split(more), shlex.split(more)[1:])
             if flag == "--include"]
    assert asked == ["plain-000", item]
    cubepack.pull("me/odd", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=asked)
    assert set(partialformat.read(target).memories) == {"plain-000", item}
    cubepack.load_kv_cache(target, models["a"], item=item)
