"""``python -m cubepack.demo``: the main job end to end, offline, on a local Hub endpoint.

1. starts ``cubepack hub serve``'s endpoint on 127.0.0.1 (a local stand-in for the Hub);
2. builds two tiny same-shape models, A and B, and publishes A there as a model repo;
3. builds a MemOS cube with the real MemoryOS package, its KV cache extracted by A;
4. packs it (pins A's commit, converts the pickle through the allowlist, lock + card);
5. pushes it as one commit, pulls it back at that exact SHA with verification;
6. loads the activation into A and continues; offers B and shows the refusal.

Everything lives under ``./demo-out`` (or the folder given as the first argument).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def step(text: str, command: str | None = None) -> None:
    print(f"\n== {text}", flush=True)
    if command:
        print(f"   $ {command}", flush=True)


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

    from .localhub import LocalHub

    hub = LocalHub(work / "hub-root").start()
    # The Hub client reads these at import time, so they are set before anything imports it.
    os.environ.update({
        "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(work / "hf-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "demo-token",
        "MEMOS_BASE_PATH": str(work / "memos-home"), "CUBEPACK_CACHE": str(work / "cubepack-cache"),
    })
    try:
        return _run(work, hub)
    finally:
        hub.stop()


def _run(work: Path, hub) -> int:
    import cubepack
    from cubepack.testing import tiny
    from cubepack.testing.hub import upload_folder

    step(f"1. A local Hub-compatible endpoint is serving at {hub.url}",
         f"cubepack hub serve --root {work / 'hub-root'}")

    step("2. Build two tiny same-shape models (A and B: same config, other seeds); publish A")
    tokenizer = tiny.build_tokenizer()
    folder_a = tiny.build_model(work / "model-a", tiny.llama_config(), seed=0, tokenizer=tokenizer)
    folder_b = tiny.build_model(work / "model-b", tiny.llama_config(), seed=1, tokenizer=tokenizer)
    from huggingface_hub import snapshot_download

    upload_folder(hub.url, "demo/tiny-model-a", folder_a)
    snapshot_a = Path(snapshot_download("demo/tiny-model-a"))
    print(f"model A: demo/tiny-model-a, downloaded to {snapshot_a}")

    step("3. Build a MemOS cube with the real MemoryOS package (model A extracts the KV cache)")
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(snapshot_a),
                                                 "max_tokens": 8}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "demo", "cube_id": "demo/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    memos_cube = GeneralMemCube(config)
    item = memos_cube.act_mem.extract("The user is a Chinese man who likes green tea.")
    memos_cube.act_mem.add([item])
    cube_dir = work / "cube"
    memos_cube.dump(str(cube_dir))
    print("MemOS wrote:", ", ".join(sorted(p.name for p in cube_dir.iterdir())))

    step("4. Pack: pin the producer, convert the pickle (allowlist), lock, card",
         f"cubepack pack {cube_dir} --legacy-pickle")
    packed = cubepack.pack(cube_dir, legacy_pickle=True, license="apache-2.0")
    pin = packed.models["act_mem"]
    print(f"producer pinned: {pin['repo_id']}@{pin['revision']}")
    print("the cube now holds:", ", ".join(sorted(p.relative_to(cube_dir).as_posix()
                                                 for p in cube_dir.rglob("*") if p.is_file())))
    print(f"lock digest: {packed.digest}")

    step("5. Push it as exactly one commit", f"cubepack push {cube_dir} demo/tiny_cube --tag v1")
    from cubepack.hub import pull, push

    pushed = push(cube_dir, "demo/tiny_cube", tag="v1")
    print(f"commit {pushed.commit_sha} ({len(pushed.uploaded)} files)\n{pushed.commit_url}")
    again = push(cube_dir, "demo/tiny_cube")
    print(f"pushed again unchanged: changed={again.changed}, still {again.commit_sha}")

    pulled_dir = work / "pulled"
    step("6. Pull it at the pushed SHA, verified before it is placed",
         f"cubepack pull demo/tiny_cube@{pushed.commit_sha} --local-dir {pulled_dir}")
    pulled = pull(f"demo/tiny_cube@{pushed.commit_sha}", local_dir=pulled_dir)
    for check in pulled.report.checks:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[check.ok]
        print(f"  {mark} {check.name:<15} {check.subject}")

    step("7. Load the activation into model A (the pinned snapshot) and continue")
    activation = pulled_dir / "activations" / f"{item.id}.kv.safetensors"
    model_a = tiny.load(snapshot_a)
    cache = cubepack.load_kv_cache(activation, model_a)
    question = tokenizer("What does the user drink?", return_tensors="pt").input_ids
    print(f"cache covers {cache.get_seq_length()} tokens; greedy continuation ids: "
          f"{greedy(model_a, cache, question)}")

    step("8. Offer model B (same shapes, other weights): cubepack refuses")
    try:
        cubepack.load_kv_cache(activation, tiny.load(folder_b))
    except cubepack.IdentityMismatch as refusal:
        print(f"refused: {refusal}")
    else:
        print("ERROR: model B was not refused")
        return 1
    print(f"\ndone: everything is under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
