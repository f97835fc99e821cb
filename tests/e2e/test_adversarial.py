"""Every case of the adversarial corpus is refused by verify, pull and the MemOS hook, with a
CubepackError naming the problem; no code runs (a canary file never appears); the target
folder is unchanged."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

import cubepack
from cubepack import CubepackError
from cubepack.hub import pull
from cubepack.testing.hub import InstrumentedHub, upload_folder

from adversarial import CASES, Case
from helpers import build_cache, tree_bytes
from memos_format import write_cube


def test_the_corpus_is_large_and_covers_every_category():
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)
    assert {case.category for case in CASES} == {"tamper", "path", "pickle", "content", "kv",
                                                  "producer", "lock"}


@pytest.fixture(scope="module")
def good_cube(packed_cube_factory):
    cube = packed_cube_factory()
    assert cubepack.verify(cube).ok
    return cube


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("corpus-hub")) as server:
        yield server


def hostile(case: Case, good_cube, tmp_path):
    cube = tmp_path / "case" / "cube"
    shutil.copytree(good_cube, cube)
    canary = tmp_path / "canary"
    case.mutate(cube, canary)
    return cube, canary


def upload_raw(hub, repo_id, folder) -> str:
    """Publish a folder as-is, bypassing cubepack (as an attacker with push access would)."""
    return upload_folder(hub.url, repo_id, folder, repo_type="dataset")


def assert_refused(error: BaseException, case: Case) -> None:
    assert isinstance(error, CubepackError), f"{case.name}: {type(error).__name__}: {error}"
    assert re.search(case.expect, str(error)), f"{case.name}: {error}"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_verify_refuses(case, good_cube, tmp_path):
    cube, canary = hostile(case, good_cube, tmp_path)
    before = tree_bytes(cube) if case.hub else None
    with pytest.raises(Exception) as caught:
        cubepack.verify(cube)
    assert_refused(caught.value, case)
    assert not canary.exists()
    if before is not None:
        assert tree_bytes(cube) == before


@pytest.mark.parametrize("case", [c for c in CASES if c.hub], ids=lambda case: case.name)
def test_pull_refuses(case, good_cube, hub, tmp_path):
    cube, canary = hostile(case, good_cube, tmp_path)
    sha = upload_raw(hub, f"corpus/{case.name}", cube)
    target = tmp_path / "target"
    target.mkdir()
    (target / "kept.txt").write_text("the folder as it was")
    with pytest.raises(Exception) as caught:
        pull(f"corpus/{case.name}@{sha}", endpoint=hub.url, local_dir=target,
             cache_dir=tmp_path / "hf-cache", force=True)
    assert_refused(caught.value, case)
    assert not canary.exists()
    assert tree_bytes(target) == {"kept.txt": b"the folder as it was"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".target")) == []


@pytest.mark.parametrize("case", [c for c in CASES if c.hub], ids=lambda case: case.name)
def test_memos_hook_refuses_before_memos_builds_anything(case, good_cube, hub, tmp_path,
                                                        monkeypatch):
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from huggingface_hub import constants as hub_constants
    from memos.mem_cube import general

    import cubepack.memos as hook

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    built = []
    monkeypatch.setattr(general.GeneralMemCube, "__init__", lambda self, *a, **k: built.append(a))
    cube, canary = hostile(case, good_cube, tmp_path)
    sha = upload_raw(hub, f"corpus-hook/{case.name}", cube)
    with pytest.raises(Exception) as caught:
        hook.init_from_remote_repo(f"corpus-hook/{case.name}@{sha}", endpoint=hub.url,
                                   local_dir=tmp_path / "pulled")
    assert_refused(caught.value, case)
    assert built == [] and not canary.exists() and not (tmp_path / "pulled").exists()


def _payloads():
    import pickle

    from adversarial import _Call, _Canary, _memos_module_global, nested_payload

    return {
        "direct-os-system": lambda k: pickle.dumps({"kv_cache_memories": {"x": _Canary(k)}}),
        "nested-load-from-bytes": nested_payload,
        "torch-load": lambda k: pickle.dumps(
            {"kv_cache_memories": {"x": _Call("torch.serialization", "load", str(k))}}),
        "torch-private-global": lambda k: pickle.dumps(
            {"kv_cache_memories": {"x": _Call("torch", "_assert", False, "boom")}}),
        "memos-module-os": _memos_module_global,
        "builtins-eval": lambda k: pickle.dumps(
            {"kv_cache_memories": {"x": _Call("builtins", "eval", f"open({str(k)!r}, 'w')")}}),
        "transformers-module-attribute": lambda k: pickle.dumps(
            {"kv_cache_memories": {"x": _Call("transformers.cache_utils", "QuantizedCache")}}),
    }


@pytest.mark.parametrize("name", sorted(_payloads()))
def test_pack_legacy_pickle_refuses_malicious_payloads(name, zoo, models, tmp_path):
    """The allowlist unpickler (pack --legacy-pickle) refuses every global off its list."""
    cube = write_cube(tmp_path / "cube", str(zoo["a"]),
                      {"x": build_cache(models["a"], torch.tensor([[5, 6]]))})
    canary = tmp_path / "canary"
    (cube / "activation_memory.pickle").write_bytes(_payloads()[name](canary))
    before = tree_bytes(cube)
    with pytest.raises(cubepack.UnsafeInputError) as caught:
        cubepack.pack(cube, legacy_pickle=True)
    assert "allowlist" in str(caught.value) or "forbidden global" in str(caught.value)
    assert not canary.exists() and tree_bytes(cube) == before
