"""Benchmark: the cost of ``verify --recompute`` against a plain prefill of the same tokens.

A Llama-shaped model (8 layers, hidden 512) and a cache of 1024 tokens it produced; in the
same run, best of N: a plain ``model(ids)`` prefill, then cubepack's recomputation of the
cache (prefill through the base model, then every layer's keys and values compared with the
stored ones). Target: <= 1.2x (the comparison must not dominate). Then the embedder check of
a text memory (``verify --embedder``) against one plain batched embedding call of the same
sample, counting calls (target: <= 2 batched calls). Not a test (``--smoke``: tiny sizes, as
CI runs it).

Run: .venv/latest/bin/python bench/recompute.py [--smoke]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import _common  # noqa: F401 (imported first: declines in one line where torch is missing)
import torch
from _common import best_of, llama_config

import cubepack
from cubepack.kv._recompute import recompute
from cubepack.kv._torch import forward, output_cache
from cubepack.testing import tiny

REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    layers, hidden, tokens, repeats = (2, 64, 32, 2) if args.smoke else (8, 512, 1024, REPEATS)
    root = Path(tempfile.mkdtemp(prefix="cubepack-bench-recompute-"))
    try:
        config = llama_config(layers, hidden)
        folder = tiny.build_model(root / "model", config, seed=0, tokenizer=tiny.build_tokenizer())
        model = tiny.load(folder)
        ids = torch.randint(2, tiny.VOCAB_SIZE, (1, tokens))
        with torch.no_grad():
            cache = output_cache(forward(model, ids))
        path = cubepack.save_kv_cache(cache, root / "item.kv.safetensors", producer=model,
                                      token_ids=ids)
        info = cubepack.read_kv_header(path)

        def plain():
            with torch.no_grad():
                model(ids, use_cache=True, logits_to_keep=1)  # the same work as the verifier

        plain()  # warm up kernels and caches once
        prefill = best_of(plain, repeats)
        checked = best_of(lambda: recompute(model, info, "item"), repeats)
        result = recompute(model, info, "item")
        assert result.ok, result.to_dict()
        print(f"model: {layers} layers, hidden {hidden}; cache: {tokens} tokens, float32 "
              f"(torch {torch.__version__})")
        print(f"plain prefill                 best {prefill * 1e3:8.2f} ms")
        print(f"recompute (prefill + compare) best {checked * 1e3:8.2f} ms  "
              f"(max relative error {result.max_rel_error:.2e})")
        print(f"ratio recompute / plain prefill: {checked / prefill:.2f}x (target <= 1.2x)")
        _embedder_cost(root, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _embedder_cost(root: Path, repeats: int) -> None:
    import json

    from cubepack.format.sections import VectorsRecord
    from cubepack.kinds.vectors._embedder import embed, probe_vectors
    from cubepack.kinds.vectors._vectors import vector_record
    from cubepack.kinds.vectors._check import embedder_checks
    from cubepack.testing.embeddings import EmbeddingServer, build_encoder

    encoder = build_encoder(root / "encoder", seed=0, hidden=384)
    texts = [f"The user's memory number {i}: likes tea, walks, and books." for i in range(200)]
    with EmbeddingServer(encoder) as server:
        vectors = embed(server.spec, texts)
        cube = root / "text-cube"
        cube.mkdir()
        (cube / "textual_memory.json").write_text(json.dumps(
            [{"id": f"m{i:03d}", "vector": v, "payload": {"memory": t}}
             for i, (t, v) in enumerate(zip(texts, vectors))]))
        record = vector_record(cube, "textual_memory.json")
        record["probes"] = probe_vectors(server.spec)
        config = {"text_mem": {"backend": "general_text",
                               "config": {"memory_filename": "textual_memory.json"}}}
        pinned = VectorsRecord.of(record)  # as the lock's models section parses it
        sample = texts[:16]  # one plain call of as many texts as the check re-embeds
        plain = best_of(lambda: embed(server.spec, sample), repeats)
        server.calls = 0
        checked = best_of(lambda: embedder_checks(
            cube, config, ["textual_memory.json"], pinned,
            lambda batch: embed(server.spec, batch), label="e"), repeats)
        calls = server.calls // repeats
    print(f"embedder check: {calls} batched calls (target <= 2); {checked * 1e3:.1f} ms vs "
          f"{plain * 1e3:.1f} ms for one plain call of the sample: {checked / plain:.2f}x")


if __name__ == "__main__":
    main()
