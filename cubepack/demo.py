"""``python -m cubepack.demo``: the main job end to end, offline, on tiny local models.

Builds two tiny same-shape models (A and B), builds a MemOS cube with the real MemoryOS
package using model A, packs it (converting MemOS's pickle through the allowlist), verifies it,
loads the activation into A and continues generation, then shows the refusal when B is offered.
Everything happens under ``./demo-out`` (or the folder given as the first argument).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def greedy(model, cache, ids, steps: int = 8) -> list[int]:
    """Greedy decoding from a prefilled cache (the tiny models' text is noise; ids show it)."""
    import torch

    produced = []
    with torch.no_grad():
        for _ in range(steps):
            ids = model(ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            produced.append(int(ids))
    return produced


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = Path(argv[0] if argv else "demo-out").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ.setdefault("MEMOS_BASE_PATH", str(work / "memos-home"))
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

    import torch

    import cubepack
    from cubepack import tiny

    step("1. Build two tiny same-shape models (A and B: same config, other seeds)")
    tokenizer = tiny.build_tokenizer()
    model_a = tiny.build_model(work / "model-a", tiny.llama_config(), seed=0, tokenizer=tokenizer)
    model_b = tiny.build_model(work / "model-b", tiny.llama_config(), seed=1, tokenizer=tokenizer)
    print(f"model A: {model_a}\nmodel B: {model_b}")

    step("2. Build a MemOS cube with the real MemoryOS package (model A extracts the KV cache)")
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_a), "max_tokens": 8}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "demo", "cube_id": "demo/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    memos_cube = GeneralMemCube(config)
    item = memos_cube.act_mem.extract("The user is a Chinese man who likes green tea.")
    memos_cube.act_mem.add([item])
    cube_dir = work / "cube"
    memos_cube.dump(str(cube_dir))
    print("MemOS wrote:", ", ".join(sorted(p.name for p in cube_dir.iterdir())))

    step("3. cubepack pack --legacy-pickle: pin the producer, convert the pickle, lock, card")
    result = cubepack.pack(cube_dir, legacy_pickle=True, license="apache-2.0")
    print(f"activations: {result.activations}\nlock digest: {result.digest}")
    print("the cube now holds:", ", ".join(sorted(p.relative_to(cube_dir).as_posix()
                                                 for p in cube_dir.rglob("*") if p.is_file())))

    step("4. cubepack verify --model model-a")
    report = cubepack.verify(cube_dir, model=str(model_a))
    for check in report.checks:
        print(f"  ok  {check.name:<15} {check.subject}")

    step("5. Load the activation into model A and continue")
    activation = cube_dir / "activations" / f"{item.id}.kv.safetensors"
    model = tiny.load(model_a)
    cache = cubepack.load_kv_cache(activation, model)
    covered = cache.get_seq_length()
    question = tokenizer("What does the user drink?", return_tensors="pt").input_ids
    print(f"cache covers {covered} tokens; greedy continuation ids: {greedy(model, cache, question)}")

    step("6. Offer model B (same shapes, other weights): cubepack refuses")
    try:
        cubepack.load_kv_cache(activation, tiny.load(model_b))
    except cubepack.IdentityMismatch as refusal:
        print(f"refused: {refusal}")
    else:
        print("ERROR: model B was not refused")
        return 1
    print("\ndone: everything is under", work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
