"""What the scale benchmarks share (bench/scale.py, bench/on_demand.py): a local endpoint in its
own process, MemOS cube folders of many small or a few large activation memories, and one plain
file of given bytes on the endpoint (the ``hf download`` baseline). Imported after ``_common``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("CUBEPACK_NO_PROGRESS", "1")

#: A large memory's model: the KV shape of an 8B Llama (32 layers, 8 KV heads of dim 128) in
#: bf16, 128 KiB a token; 2,048 tokens are 256 MiB.
LARGE_LAYERS, LARGE_HEADS, LARGE_HEAD_DIM = 32, 8, 128
LARGE_BYTES_A_TOKEN = LARGE_LAYERS * LARGE_HEADS * LARGE_HEAD_DIM * 2 * 2


@contextlib.contextmanager
def endpoint(root: Path) -> Iterator[tuple[str, int]]:
    """A local endpoint serving ``root`` in its own process, as ``cubepack hub serve`` runs
    (sharing this process's interpreter would make server and client contend for one GIL):
    its URL and port."""
    from cubepack.testing import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cubepack.testing.hub", "--root",
                               str(root), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        server.stdout.readline()  # "serving ..." once the socket is bound
        yield f"http://127.0.0.1:{port}", port
    finally:
        server.terminate()
        server.wait()


def small_model(root: Path):
    """The tiny 2-layer Llama's folder, its 4-token cache and the token ids: ~3 KB a memory."""
    import torch

    from cubepack.kv._torch import forward, output_cache
    from cubepack.testing import tiny

    model_dir = tiny.build_model(root / "model", tiny.llama_config(), seed=0,
                                 tokenizer=tiny.build_tokenizer())
    model = tiny.load(model_dir)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        cache = output_cache(forward(model, ids))
    return model_dir, model, cache, ids


def large_model(root: Path, tokens: int):
    """A model of the large memories' KV shape (tiny otherwise) and a bf16 cache of ``tokens``
    tokens for it (``tokens * LARGE_BYTES_A_TOKEN`` bytes)."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    from cubepack.testing import tiny

    config = LlamaConfig(vocab_size=tiny.VOCAB_SIZE, hidden_size=64, intermediate_size=64,
                         num_hidden_layers=LARGE_LAYERS, num_attention_heads=LARGE_HEADS,
                         num_key_value_heads=LARGE_HEADS, head_dim=LARGE_HEAD_DIM)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(root / "model")
    tiny.build_tokenizer().save_pretrained(root / "model")
    model = tiny.load(root / "model", dtype=torch.bfloat16)
    cache = DynamicCache(config=model.config)
    shape = (1, LARGE_HEADS, tokens, LARGE_HEAD_DIM)
    for layer in range(LARGE_LAYERS):
        cache.update(torch.randn(shape, dtype=torch.bfloat16),
                     torch.randn(shape, dtype=torch.bfloat16), layer)
    return root / "model", model, cache


def write_config(folder: Path, model_dir: Path) -> None:
    """A MemOS cube's config.json whose activation memory names ``model_dir``."""
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_dir)}}
    config = {"model_schema": "memos.configs.mem_cube.GeneralMemCubeConfig",
              "config_filename": "config.json", "user_id": "bench", "cube_id": "bench/scale",
              "text_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
              "act_mem": {"backend": "kv_cache", "config": {
                  "cube_id": None, "memory_filename": "activation_memory.pickle",
                  "extractor_llm": llm}},
              "para_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
              "pref_mem": {"backend": "uninitialized", "config": {"cube_id": None}}}
    (folder / "activations").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def item_id(index: int) -> str:
    """Zero-padded, so ids sort as they were made: appended memories sort after the others."""
    return f"item-{index:06d}"


def add_small(folder: Path, model_dir: Path, cache, ids, indices: range) -> int:
    """KV files of the memories ``indices`` (each distinct: its id is in its header) in the
    cube folder ``folder``; returns their bytes."""
    import cubepack

    identity = cubepack.fingerprint(model_dir)
    size = 0
    for index in indices:
        path = folder / "activations" / f"{item_id(index)}.kv.safetensors"
        cubepack.save_kv_cache(cache, path, producer=identity, token_ids=ids,
                               metadata={"id": item_id(index)})
        size += path.stat().st_size
    return size


def build_small(folder: Path, model_dir: Path, cache, ids, count: int) -> None:
    """A MemOS cube folder of ``count`` small activations of ``model_dir``, not yet packed."""
    write_config(folder, model_dir)
    add_small(folder, model_dir, cache, ids, range(count))


def build_large(folder: Path, model_dir: Path, cache, count: int) -> None:
    """``count`` large activations (one cache, one value changed in each: no two alike)."""
    import cubepack

    write_config(folder, model_dir)
    identity = cubepack.fingerprint(model_dir)
    for index in range(count):
        cache.layers[0].keys[0, 0, 0, 0] = float(index)
        cubepack.save_kv_cache(cache, folder / "activations"
                               / f"{item_id(index)}.kv.safetensors", producer=identity,
                               metadata={"id": item_id(index)})


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def plain_file_repo(url: str, repo: str, size: int, work: Path) -> str:
    """A dataset repo on ``url`` holding one file ``blob.bin`` of ``size`` random bytes (not a
    cube): the ``hf download`` baseline's. Returns its commit."""
    from cubepack.testing.hub import upload_folder

    folder = work / "plain-file"
    folder.mkdir(parents=True)
    block = os.urandom(8 * 1024 * 1024)
    with open(folder / "blob.bin", "wb") as handle:
        left = size
        while left > 0:
            handle.write(block[:left])
            left -= len(block[:left])
    try:
        return upload_folder(url, repo, folder, repo_type="dataset")
    finally:
        shutil.rmtree(folder)


def free_gib(path: Path) -> float:
    return shutil.disk_usage(path).free / 1024**3


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())
