"""Shared fixtures: an isolated HF cache and cubepack cache, and the tiny model zoo.

Environment variables read at import time by huggingface_hub are set here, before any test
module imports it, so no test can touch the user's real caches or the network.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SANDBOX = Path(tempfile.mkdtemp(prefix="cubepack-tests-"))
os.environ["HF_HOME"] = str(_SANDBOX / "hf-home")
os.environ["HF_HUB_CACHE"] = str(_SANDBOX / "hf-home" / "hub")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["CUBEPACK_CACHE"] = str(_SANDBOX / "cubepack-cache")
os.environ["CUBEPACK_NO_PROGRESS"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read at import: no bars in captured output
os.environ["MEMOS_BASE_PATH"] = str(_SANDBOX / "memos")
os.environ.pop("HF_TOKEN", None)
os.environ.pop("HF_ENDPOINT", None)

import sys

import pytest

# Shared helpers (support/) are imported by name from any test folder (tests run in pytest's
# importlib mode, so test folders never shadow packages such as ``memos``).
sys.path.insert(0, str(Path(__file__).parent / "support"))

from data import EXAMPLES, ITEMS, MODEL_A_COMMIT, PROMPT  # noqa: F401


@pytest.fixture(autouse=True, scope="module")
def _fresh_private_state():
    """Each test module starts as a fresh process would as to private memories: a content a
    private cube brought stays sealed for the life of a process (so an identical cache built
    later cannot be dumped in clear), and a pytest worker runs many modules that build the
    same tiny model's caches, public in one and loaded from a private cube in another."""
    yield
    use = sys.modules.get("cubepack.memos._use")
    if use is not None:
        use.forget_sealed_content()


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> dict[str, Path]:
    """Every tiny fixture model (see :func:`cubepack.testing.tiny.build_zoo`)."""
    from cubepack.testing import tiny

    return tiny.build_zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def models(zoo):
    """Loaded fixture models, loaded once per session (they are only read)."""
    import torch

    from cubepack.testing import tiny

    loaded = {name: tiny.load(folder) for name, folder in zoo.items()}
    loaded["a_as_bf16"] = tiny.load(zoo["a"], dtype=torch.bfloat16)
    return loaded




@pytest.fixture(scope="session")
def packed_cube_factory(tmp_path_factory, zoo, models):
    """``make(items=ITEMS, texts=None)`` -> a MemOS-format cube whose caches model A built from
    ``items`` (id -> token ids), packed with ``pack(legacy_pickle=True)``. Each distinct request
    is built once per session: treat the folder as read-only (copy it to change it)."""
    import torch

    import cubepack

    from helpers import build_cache
    from memos_format import write_cube

    built: dict[tuple, Path] = {}

    def make(items: dict[str, list[int]] | None = None, *,
             texts: dict[str, str] | None = None) -> Path:
        items = items or ITEMS
        key = (tuple((k, tuple(v)) for k, v in items.items()),
               tuple(sorted((texts or {}).items())))
        if key not in built:
            caches = {item: build_cache(models["a"], torch.tensor([ids]))
                      for item, ids in items.items()}
            cube = write_cube(tmp_path_factory.mktemp("packed") / "cube", str(zoo["a"]), caches,
                              texts=texts)
            cubepack.pack(cube, legacy_pickle=True)
            built[key] = cube
        return built[key]

    return make


@pytest.fixture
def prompt_ids():
    import torch

    return torch.tensor([PROMPT])


@pytest.fixture(scope="session")
def hub_cached(zoo):
    """Model A laid out in this session's HF cache as the Hub client lays it out.

    ``tiny-org/model-a`` at commit :data:`MODEL_A_COMMIT`, ``refs/main`` pointing at it, LFS-style
    blobs named by their sha256, so ``snapshot_download(..., local_files_only=True)`` and
    offline resolution find it exactly as they would find a downloaded model.
    """
    import shutil

    from cubepack._util import hashing

    repo = Path(os.environ["HF_HUB_CACHE"]) / "models--tiny-org--model-a"
    snapshot = repo / "snapshots" / MODEL_A_COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for source in sorted(zoo["a"].iterdir()):
        blob = repo / "blobs" / hashing.sha256_file(source)
        shutil.copyfile(source, blob)
        link = snapshot / source.name
        if not link.is_symlink():
            os.symlink(os.path.relpath(blob, snapshot), link)
    (repo / "refs" / "main").write_text(MODEL_A_COMMIT)
    return {"repo_id": "tiny-org/model-a", "commit": MODEL_A_COMMIT, "snapshot": snapshot}






@pytest.fixture(scope="session")
def qwen3_snapshot(tmp_path_factory):
    """A tiny Qwen3 of mem_cube_2's KV geometry, in the HF cache as Qwen/Qwen3-1.7B."""
    import torch
    from huggingface_hub import snapshot_download
    from transformers import Qwen3Config

    from cubepack.testing import tiny
    from cubepack.testing.hub import InstrumentedHub, upload_folder

    root = tmp_path_factory.mktemp("qwen3")
    config = Qwen3Config(vocab_size=tiny.VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=0, pad_token_id=1)
    folder = tiny.build_model(root / "model", config, seed=5, tokenizer=tiny.build_tokenizer(),
                              dtype=torch.bfloat16)
    with InstrumentedHub(root / "hub") as hub:
        upload_folder(hub.url, "Qwen/Qwen3-1.7B", folder)
        return Path(snapshot_download("Qwen/Qwen3-1.7B", endpoint=hub.url))


@pytest.fixture(scope="module")
def packed(packed_cube_factory):
    """The session's packed MemOS cube (read only)."""
    return packed_cube_factory()


@pytest.fixture
def cube(packed, tmp_path):
    """A fresh copy of ``packed`` for one test to change (a folder needing another cube
    defines its own ``cube``)."""
    from helpers import copy_of

    return copy_of(packed, tmp_path)
