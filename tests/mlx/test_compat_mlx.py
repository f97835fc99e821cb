"""Compatible on purpose, in MLX (#39 item 7): the MLX-LM prompt caches and the lone KV files
of ``tests/fixtures/compat/`` (see ``tests/format/test_compat_fixtures.py``, which tests the
rest in the other environments) load into their producer run by MLX, and import; what cannot
(a prompt cache whose KV header has no checksums, a KV file of format 1) is refused naming the
upgrade, which, done, makes it load. The folder is swept: every ``mlx`` and ``kv`` fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cubepack
import cubepack.mlx

COMPAT = Path(__file__).resolve().parents[1] / "fixtures" / "compat"


def fixtures(artefact: str) -> list[str]:
    return sorted(p.parent.name for p in COMPAT.glob("*/fixture.json")
                  if json.loads(p.read_text())["artefact"] == artefact)


def spec(name: str) -> dict:
    return json.loads((COMPAT / name / "fixture.json").read_text())


def copy_of(name: str, artefact: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(COMPAT / name / artefact, folder)
    return next(folder.iterdir())


@pytest.mark.parametrize("name", fixtures("kv"))
def test_a_lone_kv_file_loads_into_its_producer_run_by_mlx(name, mlx_models, zoo, tmp_path):
    """Into MLX's own prefill's model, which must reproduce it (another runtime computed it)."""
    fixture = spec(name)
    path = copy_of(name, "kv", tmp_path)
    if fixture.get("fixes"):  # format 1: refused naming the upgrade, which is done here
        with pytest.raises(cubepack.FormatError) as refused:
            cubepack.mlx.load_prompt_cache(path, mlx_models[fixture["model"]],
                                           folder=zoo[fixture["model"]])
        assert f"cubepack upgrade {path} --model MODEL" in str(refused.value)
        cubepack.upgrade(path, zoo[fixture["model"]])
    cache = cubepack.mlx.load_prompt_cache(path, mlx_models[fixture["model"]],
                                           folder=zoo[fixture["model"]])
    assert cache and all(layer.offset > 0 for layer in cache)


@pytest.mark.parametrize("name", fixtures("mlx"))
def test_a_prompt_cache_loads_and_imports_or_names_the_upgrade(name, mlx_models, zoo, tmp_path):
    fixture = spec(name)
    model, folder = mlx_models[fixture["model"]], zoo[fixture["model"]]
    path = copy_of(name, "mlx", tmp_path)
    assert all(layer.offset > 0 for layer in cubepack.mlx.load_prompt_cache(path, model,
                                                                            folder=folder))
    out = tmp_path / "imported.kv.safetensors"
    source = cubepack.read_kv_header(next((COMPAT / fixture["source"] / "kv").iterdir()))
    if source.version < 3:
        with pytest.raises(cubepack.FormatError) as refused:
            cubepack.mlx.import_prompt_cache(path, folder, out=out)
        assert "cubepack upgrade FILE --model MODEL" in str(refused.value)
        assert "export it again" in str(refused.value) and not out.exists()
        kv = copy_of(fixture["source"], "kv", tmp_path)  # the file it was exported from
        cubepack.upgrade(kv, folder)
        path = cubepack.mlx.export_prompt_cache(kv, tmp_path / "again.safetensors",
                                                model=folder)
    cubepack.mlx.import_prompt_cache(path, folder, out=out)
    assert cubepack.read_kv_header(out).version == 3
