"""Benchmark: the cost of ``cubepack migrate`` against the work it cannot avoid.

A cube of model A (Llama-shaped, 8 layers, hidden 512): activations of 256 tokens each, saved
with their token ids, and a text memory whose vectors an encoder made. It is migrated to model B
(same shapes, other weights) and another encoder at once. In the same run, best of N, contenders
taking turns: the plain work (B's prefill of the same tokens, one ``model(ids)`` per activation,
plus one batched embedding call of every text with the new encoder) and ``migrate`` (verify the
old cube, re-prefill and write each activation, re-embed in batches, re-pack: hash, pin B and the
encoder, whose sample and probes are checked, lock). B is passed loaded to both, so neither pays
for loading it. Goal: <= 1.3x. Not a test (``--smoke``: tiny sizes, as CI runs it).

Run: .venv/latest/bin/python bench/migrate.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import uuid
from pathlib import Path

import _common  # noqa: F401 (imported first: declines in one line where torch is missing)
import torch
from _common import llama_config, timed

import cubepack
from cubepack.kv._torch import forward, output_cache
from cubepack.kinds.vectors._embedder import embed
from cubepack.testing import tiny
from cubepack.testing.embeddings import build_encoder

REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="rounds (best of)")
    args = parser.parse_args()
    layers, hidden, items, tokens, texts, repeats = (
        (2, 64, 2, 16, 8, 2) if args.smoke else (8, 512, 16, 256, 512, args.repeats))
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-migrate-"))
    try:
        config = llama_config(layers, hidden)
        tokenizer = tiny.build_tokenizer()
        folders = {name: tiny.build_model(root / name, config, seed=seed, tokenizer=tokenizer)
                   for name, seed in (("model-a", 0), ("model-b", 1))}
        model_a, model_b = tiny.load(folders["model-a"]), tiny.load(folders["model-b"])
        encoders = [build_encoder(root / f"encoder-{seed}", seed=seed, hidden=384)
                    for seed in (0, 1)]
        cube, ids = _cube(root / "cube", folders["model-a"], model_a, encoders[0], items, tokens,
                          texts)
        sentences = [f"Memory {i}: the user said something about topic {i % 17}."
                     for i in range(texts)]

        def plain() -> None:
            with torch.no_grad():
                for row in ids:
                    model_b(torch.tensor([row]), use_cache=True)
            embed(str(encoders[1]), sentences)

        def migrate(out: Path) -> None:
            cubepack.migrate(cube, model=model_b, embedder=str(encoders[1]), out=out,
                             progress=False)

        plain()  # warm up kernels and caches once
        migrate(root / "warm")
        best_plain, best_migrate = float("inf"), float("inf")
        for round_ in range(repeats):  # taking turns, so load swings hit both
            best_plain = min(best_plain, timed(plain))
            out = root / f"out-{round_}"
            best_migrate = min(best_migrate, timed(lambda: migrate(out)))
            shutil.rmtree(out)
        assert cubepack.verify(root / "warm", model=model_b, recompute=True,
                               embedder=str(encoders[1])).ok
        print(f"model: {layers} layers, hidden {hidden}; {items} activations of {tokens} tokens, "
              f"{texts} text memories, 384-dim encoder (torch {torch.__version__})")
        print(f"plain: B's prefill + one embedding pass  best {best_plain * 1e3:8.1f} ms")
        print(f"cubepack migrate                         best {best_migrate * 1e3:8.1f} ms")
        print(f"ratio migrate / (prefill + embedding pass): {best_migrate / best_plain:.2f}x "
              "(goal <= 1.3x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cube(folder: Path, model_dir: Path, model: object, encoder: Path, items: int, tokens: int,
          texts: int) -> tuple[Path, list[list[int]]]:
    """A packed cube of ``model``: ``items`` activations with their token ids, and ``texts``
    text memories whose vectors ``encoder`` made."""
    generator = torch.Generator().manual_seed(0)
    (folder / "activations").mkdir(parents=True)
    rows = []
    for index in range(items):
        row = torch.randint(2, tiny.VOCAB_SIZE, (tokens,), generator=generator).tolist()
        with torch.no_grad():
            cache = output_cache(forward(model, torch.tensor([row])))
        cubepack.save_kv_cache(cache, folder / "activations" / f"item-{index}.kv.safetensors",
                               producer=model, token_ids=row, metadata={"id": f"item-{index}"})
        rows.append(row)
    sentences = [f"Memory {i}: the user said something about topic {i % 17}."
                 for i in range(texts)]
    vectors = embed(str(encoder), sentences)
    (folder / "textual_memory.json").write_text(json.dumps([
        {"id": str(uuid.UUID(int=i + 1)), "vector": vector, "payload": {"memory": text}}
        for i, (text, vector) in enumerate(zip(sentences, vectors))]))
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_dir)}}
    (folder / "config.json").write_text(json.dumps({
        "cube_id": "bench/cube", "user_id": "bench",
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}},
        "text_mem": {"backend": "general_text", "config": {
            "memory_filename": "textual_memory.json",
            "embedder": {"backend": "universal_api", "config": {"model_name_or_path": "e"}}}}}))
    cubepack.pack(folder, progress=False)
    return folder, rows


if __name__ == "__main__":
    main()
