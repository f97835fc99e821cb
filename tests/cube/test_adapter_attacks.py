"""Attacks on parametric memory: adapter configs that make PEFT build, initialise or rewrite
something the pack never checked, and models that are not the bare pinned base."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import cubepack
from cubepack.errors import (
    FormatError,
    IdentityMismatch,
    ModelNotFoundError,
    UnsupportedError,
)
from cubepack.testing import tiny

from helpers import make_adapter

IDS = torch.tensor([[1, 5, 9, 33, 2, 7]])


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def peft_layers(model):
    return [name for name, module in model.named_modules()
            if type(module).__module__.startswith("peft")]


@pytest.fixture
def cube_with(tmp_path, zoo):
    """``make(config_change=None, weights_change=None, **adapter_config)`` -> an unpacked cube
    holding one PEFT-saved adapter ``lora`` for model A, its files then edited."""

    def make(config_change=None, weights_change=None, **config):
        cube = tmp_path / "cube"
        shutil.rmtree(cube, ignore_errors=True)
        folder = make_adapter(zoo["a"], cube / "parametric" / "lora", **config)
        if config_change:
            path = folder / "adapter_config.json"
            data = json.loads(path.read_text())
            config_change(data)
            path.write_text(json.dumps(data))
        if weights_change:
            path = folder / "adapter_model.safetensors"
            tensors = load_file(str(path))
            weights_change(tensors)
            save_file(tensors, str(path), metadata={"format": "pt"})
        return cube

    return make


def pack(cube):
    return cubepack.pack(cube, cube_id="alice/cube")


def test_kasa_config_which_truncates_the_base_weights_at_load_is_refused(cube_with):
    cube = cube_with(lambda c: c.update(kasa_config={"beta": 0.0, "gamma": 0.0}))
    with pytest.raises(UnsupportedError, match="kasa_config"):
        pack(cube)


@pytest.mark.parametrize("flag, what", [("use_dora", "lora_magnitude_vector"),
                                        ("lora_bias", "lora_B.bias")])
def test_a_part_the_config_asks_for_but_the_file_lacks_is_refused(cube_with, flag, what):
    # PEFT would compute it from the random LoRA weights it initialises: other logits per load
    cube = cube_with(lambda c: c.update({flag: True}))
    with pytest.raises(FormatError, match=f"lacks a {what} tensor .* {flag} true"):
        pack(cube)


def test_a_magnitude_the_config_does_not_ask_for_is_refused(cube_with):
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
    cube = cube_with(weights_change=lambda t: t.__setitem__(key, torch.ones(64)))
    with pytest.raises(FormatError, match="has a lora_magnitude_vector tensor .* ignore it"):
        pack(cube)


def test_rank_pattern_giving_a_module_another_rank_than_its_tensors_is_refused(cube_with):
    cube = cube_with(lambda c: c.update(rank_pattern={"q_proj": 8}))
    with pytest.raises(FormatError, match=r"q_proj have rank 4, but .* r=8"):
        pack(cube)


def test_rank_pattern_matching_the_tensors_packs_and_loads(cube_with, zoo):
    cube = cube_with(r=4, rank_pattern={"v_proj": 2})
    pack(cube)
    from peft import PeftModel

    expected = logits(PeftModel.from_pretrained(tiny.load(zoo["a"]),
                                                str(cube / "parametric" / "lora")))
    assert torch.equal(logits(cubepack.load_adapter(tiny.load(zoo["a"]), cube, "lora")), expected)


@pytest.mark.parametrize("change, fresh", [
    (lambda c: c.update(target_modules="all-linear"), "mlp.down_proj.lora_A"),
    (lambda c: c.update(target_modules=["q_proj", "v_proj", "k_proj"], layers_to_transform=[0, 1]),
     "self_attn.k_proj.lora_A"),
])
def test_modules_peft_would_initialise_afresh_are_refused_and_the_model_left_unchanged(
        cube_with, zoo, change, fresh):
    # all-linear and layers_to_transform pass pack's shape check, but PEFT builds LoRA layers
    # the file has no tensors for: random with init_lora_weights false
    cube = cube_with(change)
    pack(cube)
    model = tiny.load(zoo["a"])
    before = logits(model)
    with pytest.raises(IdentityMismatch, match=f"{fresh}.weight: expected in the adapter's "
                                               "file, found initialised afresh by PEFT"):
        cubepack.load_adapter(model, cube, "lora")
    assert peft_layers(model) == [] and not hasattr(model, "peft_config")
    assert torch.equal(logits(model), before)


def test_a_peft_failure_midway_is_typed_and_leaves_the_model_unchanged(cube_with, zoo):
    cube = cube_with(lambda c: c.update(arrow_config={}))  # PEFT 0.21 fails after injecting
    pack(cube)
    model = tiny.load(zoo["a"])
    before = logits(model)
    with pytest.raises(UnsupportedError, match="PEFT could not apply adapter 'lora'"):
        cubepack.load_adapter(model, cube, "lora")
    assert peft_layers(model) == [] and not hasattr(model, "peft_config")
    assert torch.equal(logits(model), before)
    good = cube_with()
    pack(good)
    cubepack.load_adapter(model, good, "lora")  # the restored model is the bare base again


@pytest.mark.parametrize("how", ["injected", "transformers", "peft_model"])
def test_a_model_already_holding_peft_layers_is_refused_before_peft_loads(
        cube_with, zoo, tmp_path, how):
    from peft import LoraConfig, PeftModel, inject_adapter_in_model

    cube = cube_with(target_modules=["q_proj"])
    pack(cube)
    other = make_adapter(zoo["a"], tmp_path / "other", target_modules=["v_proj"], seed=3)
    model = tiny.load(zoo["a"])
    if how == "injected":  # LoRA on v_proj: the q_proj shapes and the file digest still agree
        model = inject_adapter_in_model(LoraConfig(r=4, target_modules=["v_proj"],
                                                   init_lora_weights=False), model)
    elif how == "transformers":
        model.load_adapter(str(other))
    else:
        model = PeftModel.from_pretrained(model, str(other))
    with pytest.raises(IdentityMismatch, match=r"holds PEFT layers.*v_proj: expected a "
                                               "base-model module, found PEFT's"):
        cubepack.load_adapter(model, cube, "lora")


def test_fingerprint_of_a_model_with_a_transformers_loaded_adapter(zoo, tmp_path):
    other = make_adapter(zoo["a"], tmp_path / "other")
    model = tiny.load(zoo["a"])
    model.load_adapter(str(other))  # PEFT keeps target_modules as a set
    assert cubepack.fingerprint(model).adapters.startswith("sha256:")


def test_a_claimed_base_the_hub_cannot_serve_asks_for_adapter_base(cube_with, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    cube = cube_with(lambda c: c.update(base_model_name_or_path="nobody/nothing"))
    with pytest.raises(ModelNotFoundError, match="nobody/nothing.*--adapter-base"):
        pack(cube)


# --- attacker-written patterns: matched under a bound --------------------------------------

HANGING = "(x+x+)+y"  # backtracks exponentially in re on a long module name


@pytest.mark.parametrize("where, change", [
    ("target_modules", lambda c: c.update(target_modules=HANGING)),
    ("exclude_modules", lambda c: c.update(exclude_modules=HANGING)),
    ("rank_pattern key", lambda c: c.update(rank_pattern={HANGING: 8})),
    ("alpha_pattern key", lambda c: c.update(alpha_pattern={"(a|a)*": 16})),
    ("layers_pattern", lambda c: c.update(layers_pattern=".*.*.*.*x")),
])
def test_a_pattern_that_could_backtrack_without_bound_is_refused_naming_its_key(
        cube_with, where, change):
    """Refused by its shape before anything matches it, so neither cubepack nor PEFT's own
    ``re`` (when the adapter is applied) runs it."""
    cube = cube_with(change)
    with pytest.raises(FormatError, match=where):
        pack(cube)


def test_verify_of_a_resealed_cube_with_a_hanging_pattern_refuses_it(cube_with, tmp_path):
    """The lock re-sealed over the new config: the adapter is parsed (its bytes are the
    lock's), and refused by the pattern bound. Run in a child process whose timeout is only a
    safety net (a hang fails the test instead of CI)."""
    import subprocess
    import sys

    from helpers import reseal_lock

    cube = cube_with()
    pack(cube)
    config = cube / "parametric" / "lora" / "adapter_config.json"
    data = json.loads(config.read_text())
    data["target_modules"] = HANGING
    config.write_text(json.dumps(data))

    def reseal(lock):
        from cubepack._util.hashing import sha256_file
        from cubepack.kinds.adapters._lora import adapter_digest

        files = lock["files"]
        files["parametric/lora/adapter_config.json"] = {
            "sha256": sha256_file(config), "size": config.stat().st_size}
        entry = lock["adapters"]["lora"]
        entry["target_modules"] = HANGING
        entry["digest"] = adapter_digest(files[entry["config_file"]]["sha256"],
                                         files[entry["weights_file"]]["sha256"])
    reseal_lock(cube, reseal)
    done = subprocess.run([sys.executable, "-m", "cubepack", "verify", str(cube), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    report = json.loads(done.stdout)["report"]
    [refused] = [c for c in report["checks"] if c["ok"] is False and c["check"] == "adapter"]
    assert "target_modules" in refused["detail"]
    assert "backtracks without bound" in refused["detail"]


def test_an_adapter_whose_hash_failed_is_never_parsed(cube_with, monkeypatch):
    from cubepack.kinds.adapters import _lora as _adapters

    cube = cube_with()
    pack(cube)
    config = cube / "parametric" / "lora" / "adapter_config.json"
    config.write_text(config.read_text().replace('"r": ', '"r":  '))  # same meaning, new bytes
    monkeypatch.setattr(_adapters, "read_adapter",
                        lambda *a, **k: pytest.fail("parsed an adapter whose bytes failed"))
    report = cubepack.verify(cube, raise_on_failure=False)
    assert [c.name for c in report.failures] == ["size"]
