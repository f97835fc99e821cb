"""A vLLM cube's producer pinned from its Hub commit alone: ``pack`` computes the identity a
download would give from the Hub's metadata (LFS sha256 of the weights, the safetensors headers
by byte range, the small files), downloading no weights; ``verify --remote`` checks pins with
the same function. Real huggingface_hub client, local endpoint."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import pytest

import cubepack
from cubepack import FormatError
from cubepack.testing.hub import InstrumentedHub, upload_folder

from memos_format import write_vllm_cube

REPO = "tiny-org/served"
PROMPTS = {"p-1": "<prompt one>", "p-2": "<prompt two>"}


class CountingHub(InstrumentedHub):
    """The endpoint, counting the bytes of each file it sends (a Range read sends a part)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: Counter = Counter()

    def send_file(self, handler, handle, offset, count):
        self.sent[handler.path.split("?")[0].rsplit("/", 1)[-1]] += count
        super().send_file(handler, handle, offset, count)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The endpoint as the Hub, as HF_ENDPOINT makes it when set before huggingface_hub is
    imported (the constants it derives, and 0.36's copy of one), and a fresh, empty HF cache."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import file_download

    with CountingHub(tmp_path / "hub-root") as server:
        monkeypatch.setattr(hub_constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        for module in (hub_constants, file_download):
            if hasattr(module, "HUGGINGFACE_CO_URL_TEMPLATE"):
                monkeypatch.setattr(module, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def cached_weights(tmp_path):
    return sorted(p.name for p in (tmp_path / "hf-cache").rglob("*.safetensors"))


def full_download_pin(hub, tmp_path, revision):
    """What pinning gives after downloading every file of the revision (the old way)."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(REPO, revision=revision, endpoint=hub.url,
                               cache_dir=tmp_path / "full-download")
    return cubepack.fingerprint(folder).pinned()


@pytest.mark.parametrize("model", ["a", "a_bf16"])
def test_pack_pins_a_vllm_producer_from_its_hub_commit_downloading_no_weights(
        hub, zoo, tmp_path, model):
    sha = upload_folder(hub.url, REPO, zoo[model])
    weights = (zoo[model] / "model.safetensors").stat().st_size
    (header_length,) = struct.unpack("<Q", (zoo[model] / "model.safetensors").read_bytes()[:8])
    cube = write_vllm_cube(tmp_path / "cube", REPO, PROMPTS)
    hub.sent.clear()

    result = cubepack.pack(cube, legacy_pickle=True)

    pin = result.models["act_mem"]
    assert (pin["repo_id"], pin["revision"], pin["strict"]) == (REPO, sha, True)
    assert cached_weights(tmp_path) == []  # nothing of the weights in the HF cache
    assert hub.sent["model.safetensors"] == 8 + header_length < weights  # the header only
    lock = json.loads((cube / "cubepack.lock").read_text())
    identity = lock["models"]["act_mem"]["identity"]
    assert identity["dtype"] == ("bfloat16" if model == "a_bf16" else "float32")
    assert identity == full_download_pin(hub, tmp_path, sha)
    prompts = json.loads((cube / "activations" / "prompts.json").read_text())
    assert sorted(item["prompt"] for item in prompts["items"]) == sorted(PROMPTS.values())
    # verify --remote checks the pin with the same function, still reading no weights
    hub.sent.clear()
    report = cubepack.hub.verify_remote(cube)
    assert [c.ok for c in report.checks if c.name == "remote model"] == [True]
    assert hub.sent["model.safetensors"] == 0


def test_a_revision_pins_that_commit_after_main_moved(hub, zoo, tmp_path):
    first = upload_folder(hub.url, REPO, zoo["a"])
    upload_folder(hub.url, REPO, zoo["b"])  # main now holds other weights
    cube = write_vllm_cube(tmp_path / "cube", REPO, PROMPTS)
    result = cubepack.pack(cube, legacy_pickle=True, model=REPO, revision=first)
    lock = json.loads((cube / "cubepack.lock").read_text())
    assert result.models["act_mem"]["revision"] == first
    assert lock["models"]["act_mem"]["identity"] == full_download_pin(hub, tmp_path, first)
    assert lock["models"]["act_mem"]["identity"] != full_download_pin(hub, tmp_path, "main")
    assert cached_weights(tmp_path) == []


def test_a_hostile_safetensors_header_on_the_endpoint_is_refused_naming_the_file(
        hub, zoo, tmp_path):
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(zoo["a"], evil)
    data = (evil / "model.safetensors").read_bytes()
    (evil / "model.safetensors").write_bytes(struct.pack("<Q", len(data)) + data[8:])
    sha = upload_folder(hub.url, REPO, evil)
    cube = write_vllm_cube(tmp_path / "cube", REPO, PROMPTS)
    with pytest.raises(FormatError, match=rf"{REPO}@{sha}/model.safetensors declares"):
        cubepack.pack(cube, legacy_pickle=True)
    assert not (cube / "cubepack.lock").exists()


def test_an_unknown_model_is_a_clear_error_and_offline_pins_come_from_the_hf_cache(
        hub, zoo, tmp_path, monkeypatch):
    cube = write_vllm_cube(tmp_path / "cube", "tiny-org/absent", PROMPTS)
    with pytest.raises(cubepack.ModelNotFoundError, match="tiny-org/absent was not found"):
        cubepack.pack(cube, legacy_pickle=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the HF cache, as for any model
    with pytest.raises(cubepack.ModelNotFoundError, match="not in the Hugging Face cache"):
        cubepack.pack(cube, legacy_pickle=True)
    assert Path(cube / "activation_memory.pickle").is_file()  # untouched


def test_an_unreachable_hub_falls_back_to_the_hf_cache_copy_of_the_revision(
        hub_cached, tmp_path, monkeypatch):
    """As huggingface_hub itself falls back: the cached snapshot of that revision, whose bytes
    this process hashes (a pin from local files)."""
    import time

    from huggingface_hub import constants as hub_constants

    from cubepack.testing import free_port

    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cube = write_vllm_cube(tmp_path / "cube", hub_cached["repo_id"], PROMPTS)
    started = time.monotonic()
    result = cubepack.pack(cube, legacy_pickle=True, revision=hub_cached["commit"])
    assert result.models["act_mem"]["revision"] == hub_cached["commit"]
    assert result.models["act_mem"]["identity"] == cubepack.fingerprint(
        hub_cached["snapshot"]).pinned()
    assert time.monotonic() - started < 60


def test_the_hook_loads_a_vllm_cube_downloading_no_weights_and_sends_vllm_the_hub_id(
        hub, zoo, tmp_path):
    """A vLLM server holds the weights and MemOS sends it the model's name: loading the cube
    downloads none of them, and the config keeps the Hub id (a local path would mean nothing
    to the server)."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    import cubepack.memos as hook
    from cubepack.hub import push

    upload_folder(hub.url, REPO, zoo["a"])
    cube = write_vllm_cube(tmp_path / "cube", REPO, PROMPTS)
    cubepack.pack(cube, legacy_pickle=True)
    sha = push(cube, "ns/served-cube", endpoint=hub.url).commit_sha
    hub.sent.clear()
    loaded = hook.init_from_remote_repo(f"ns/served-cube@{sha}", endpoint=hub.url)
    assert hub.sent["model.safetensors"] == 0 and cached_weights(tmp_path) == []
    assert loaded.act_mem.config.extractor_llm.config.model_name_or_path == REPO
    assert sorted(item.memory for item in loaded.act_mem.get_all()) == sorted(PROMPTS.values())
    assert "served by vllm" in loaded.cubepack.models["act_mem"]


def test_a_snapshot_path_is_named_by_its_hub_id_in_everything_pack_writes(hub, zoo, models,
                                                                          tmp_path):
    """A cube whose config.json names an HF-cache snapshot folder (how MemOS users load a Hub
    model): config.json, cubepack.yaml, the lock and the card name the Hub id; the path, which
    means nothing to whoever pulls the cube and reveals the packer's file system, is nowhere."""
    import torch
    from huggingface_hub import snapshot_download

    from helpers import build_cache
    from memos_format import write_cube

    sha = upload_folder(hub.url, REPO, zoo["a"])
    folder = snapshot_download(REPO, revision=sha, endpoint=hub.url)
    cube = write_cube(tmp_path / "cube", folder,
                      {"item-1": build_cache(models["a"], torch.tensor([[5, 6, 7]]))})
    result = cubepack.pack(cube, legacy_pickle=True)
    assert (result.models["act_mem"]["repo_id"], result.models["act_mem"]["revision"]) == (REPO, sha)
    lock = json.loads((cube / "cubepack.lock").read_text())
    assert lock["models"]["act_mem"]["name"] == REPO
    for name in ("config.json", "cubepack.yaml", "cubepack.lock", "README.md"):
        assert str(folder) not in (cube / name).read_text() and "snapshots" not in \
            (cube / name).read_text(), name
    assert cubepack.verify(cube).ok
