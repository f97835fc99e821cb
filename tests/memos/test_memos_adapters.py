"""A cube dumped by the real MemoryOS with a LoRA parametric memory, a peft adapter added and
packed: its placeholder file stays accepted as text, and the hook checks the adapter against
the base the parametric memory names before MemOS builds anything (memos environment).

MemOS 2.0.33's ``LoRAMemory`` is a placeholder: ``dump`` writes ``Placeholder`` and ``load``
reads nothing, and it never builds its extractor LLM; these tests pin that down too, so a MemOS
that starts loading adapters is noticed."""

from __future__ import annotations

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import IdentityMismatch

from helpers import make_adapter


def dump_lora_cube(base_named, out):
    """A cube dumped by MemOS with only a LoRA parametric memory naming ``base_named``."""
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(base_named)}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/lora_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "uninitialized"},
        "para_mem": {"backend": "lora", "config": {"extractor_llm": llm}}})
    GeneralMemCube(config).dump(str(out))
    return out


@pytest.fixture
def lora_cube(tmp_path, zoo):
    def make(base_named, folder="cube"):
        cube = dump_lora_cube(base_named, tmp_path / folder)
        make_adapter(zoo["a"], cube / "parametric" / "lora")
        cubepack.pack(cube, adapter_base=str(zoo["a"]))
        return cube
    return make


def test_memos_writes_a_placeholder_which_stays_accepted_as_text(lora_cube, zoo):
    cube = lora_cube(zoo["a"])
    assert (cube / "parametric_memory.adapter").read_bytes() == b"Placeholder"
    lock = cubepack.verify(cube).lock
    assert "parametric_memory.adapter" in lock.files and "lora" in lock.adapters
    import yaml

    memories = yaml.safe_load((cube / "cubepack.yaml").read_text())["memories"]["parametric"]
    assert memories[0] == "parametric_memory.adapter"
    assert "parametric/lora/adapter_model.safetensors" in memories


def test_the_hook_checks_the_adapter_against_the_base_the_parametric_memory_names(lora_cube,
                                                                                  zoo):
    loaded = hook.init_from_dir(lora_cube(zoo["a"]))
    assert loaded.cubepack.adapters["lora"].startswith("checked against")
    assert type(loaded.para_mem).__name__ == "LoRAMemory"
    with pytest.raises(IdentityMismatch) as caught:
        hook.init_from_dir(lora_cube(zoo["b"], "other"))
    assert "weights_digest" in caught.value.fields


def test_a_default_config_swapping_the_base_is_refused_and_drop_drops(lora_cube, zoo):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    cube = lora_cube(zoo["a"])
    swapped = GeneralMemCubeConfig.model_validate_json((cube / "config.json").read_text())
    data = swapped.model_dump(mode="json")
    data["para_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] = str(zoo["b"])
    default = GeneralMemCubeConfig.model_validate(data)
    with pytest.raises(IdentityMismatch):
        hook.init_from_dir(cube, default_config=default)
    dropped = hook.init_from_dir(cube, default_config=default, on_mismatch="drop")
    assert dropped.cubepack.dropped == {"para_mem": ["lora"]}


def test_installed_memos_loads_check_the_adapter_too(lora_cube, zoo, installed):
    from memos.mem_cube.general import GeneralMemCube

    with pytest.raises(IdentityMismatch):
        GeneralMemCube.init_from_dir(str(lora_cube(zoo["b"], "other")))
    cube = lora_cube(zoo["a"])
    loaded = GeneralMemCube.init_from_dir(str(cube))
    loaded.para_mem.load(str(cube))  # MemOS's own entry point: LoRAMemory.load, patched
    assert loaded.para_mem.cubepack.adapters["lora"].startswith("checked against")


def test_a_cube_whose_config_names_no_parametric_model_says_the_adapter_is_not_applied(
        tmp_path, zoo):
    import json

    from memos_format import memos_config

    cube = tmp_path / "cube"
    cube.mkdir()
    config = memos_config(str(zoo["a"]))
    config["act_mem"] = {"backend": "uninitialized", "config": {"cube_id": None}}
    (cube / "config.json").write_text(json.dumps(config))
    make_adapter(zoo["a"], cube / "parametric" / "lora")
    cubepack.pack(cube, adapter_base=str(zoo["a"]))
    loaded = hook.init_from_dir(cube)
    assert "MemOS 2.0.33 loads no adapter" in loaded.cubepack.adapters["lora"]


def test_an_adapter_on_another_base_is_refused_before_memos_builds_anything(lora_cube, zoo,
                                                                            monkeypatch):
    """The refusal comes before MemOS builds the cube (nothing is loaded into any store): the
    adapters' check is a check of the config, run before ``GeneralMemCube(config)``."""
    from memos.mem_cube.general import GeneralMemCube

    built = []
    original = GeneralMemCube.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GeneralMemCube, "__init__", counting)
    cube = lora_cube(zoo["b"], "other")
    built.clear()
    with pytest.raises(IdentityMismatch):
        hook.init_from_dir(cube)
    assert built == []
