"""Shared builder: a packed adapter cube, then rewritten and re-sealed as a pusher can, so that
verifying it runs modules x rank_pattern keys bounded pattern matches inside one checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

import cubepack
from cubepack._util.hashing import sha256_file
from cubepack.kinds.adapters._lora import adapter_digest

from helpers import make_adapter, reseal_lock


def slow_adapter_cube(base_folder: Path, cube: Path, *, modules: int, keys: int) -> Path:
    folder = make_adapter(base_folder, cube / "parametric" / "lora")
    cubepack.pack(cube, cube_id="alice/cube")
    tensors = {}
    names = [f"m{i}.proj" for i in range(modules)]
    for name in names:
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.zeros(1, 1)
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.zeros(1, 1)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "adapter_config.json").read_text())
    # keys that match no module: every module is tried against every key
    rank_pattern = {f"never_{i:05d}_[a-z]" + "x" * 200: 1 for i in range(keys)}
    config.update(r=1, target_modules=names[:1], rank_pattern=rank_pattern)
    (folder / "adapter_config.json").write_text(json.dumps(config))

    old_digest = json.loads((cube / "cubepack.lock").read_text())["adapters"]["lora"]["digest"]
    new_digest = adapter_digest(sha256_file(folder / "adapter_config.json"),
                                sha256_file(folder / "adapter_model.safetensors"))
    yaml = cube / "cubepack.yaml"  # it repeats the adapter's digest
    yaml.write_text(yaml.read_text().replace(old_digest, new_digest))

    def reseal(lock):
        files = lock["files"]
        files["cubepack.yaml"] = {"sha256": sha256_file(yaml), "size": yaml.stat().st_size}
        for leaf in ("adapter_config.json", "adapter_model.safetensors"):
            path = folder / leaf
            files[f"parametric/lora/{leaf}"] = {"sha256": sha256_file(path),
                                                "size": path.stat().st_size}
        entry = lock["adapters"]["lora"]
        entry.update(rank=1, target_modules=names[:1], rank_pattern=rank_pattern,
                     modules={n: {"kind": "linear", "rank": 1, "shape": [1, 1]} for n in names},
                     digest=adapter_digest(files[entry["config_file"]]["sha256"],
                                           files[entry["weights_file"]]["sha256"]))
    reseal_lock(cube, reseal)
    return cube
