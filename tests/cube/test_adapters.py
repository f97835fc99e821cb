"""Parametric memory: LoRA adapters made with real peft for the tiny models, packed into a cube,
pinned to their base and refused on any other (other weights, another dtype, other shapes),
before peft is imported; applied to the right base, the logits are PEFT's own."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import cubepack
from cubepack import (
    FormatError,
    IdentityMismatch,
    ModelNotFoundError,
    UnsupportedError,
    UsageError,
    VerificationFailed,
)
from cubepack.format import _lock as lockfile
from cubepack.testing import tiny

from envs import once
from helpers import make_adapter, reseal_lock

IDS = torch.tensor([[3, 17, 42, 5, 99, 7, 250]])


def adapter_cube(tmp_path: Path, adapter: Path, name: str = "lora") -> Path:
    cube = tmp_path / "cube"
    shutil.copytree(adapter, cube / "parametric" / name)
    return cube


@pytest.fixture(scope="session")
def narrow(tmp_path_factory):
    """A Llama of another width (hidden 32): A's module names, other weight shapes."""
    config = tiny.llama_config()
    config.hidden_size, config.intermediate_size = 32, 64
    return tiny.build_model(tmp_path_factory.mktemp("narrow") / "model", config, seed=3,
                            tokenizer=tiny.build_tokenizer())


@pytest.fixture(scope="session")
def adapter_a(tmp_path_factory, zoo):
    return make_adapter(zoo["a"], tmp_path_factory.mktemp("adapter") / "adapter-a")


@pytest.fixture(scope="session")
def packed(tmp_path_factory, zoo, adapter_a):
    """A cube holding A's adapter, packed with A named as its base (read-only)."""
    cube = adapter_cube(tmp_path_factory.mktemp("packed"), adapter_a)
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    return cube


@pytest.fixture
def cube(packed, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    return copy


def read_lock(cube: Path) -> dict:
    return json.loads((cube / "cubepack.lock").read_text())


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


# --- pack ---------------------------------------------------------------------------------------

def test_pack_pins_the_base_by_its_fingerprint_and_records_the_adapter(packed, zoo, adapter_a):
    lock = read_lock(packed)
    entry = lock["adapters"]["lora"]
    pin = lock["models"]["adapter.lora"]
    base = cubepack.fingerprint(zoo["a"])
    assert pin["strict"] is True and pin["identity"]["weights_digest"] == base.weights_digest
    assert pin["identity"]["dtype"] == "float32" and pin["identity"]["geometry"] == base.geometry
    # The adapter's own digest: its two files, the definition fingerprint() uses for a folder.
    from cubepack.identity._fingerprint import adapters_from_folder

    assert entry["digest"] == adapters_from_folder(adapter_a)
    for key, name in (("config_file", "adapter_config.json"),
                      ("weights_file", "adapter_model.safetensors")):
        assert lock["files"][entry[key]]["sha256"] == \
            hashlib.sha256((adapter_a / name).read_bytes()).hexdigest()
    assert (entry["peft_type"], entry["rank"], entry["lora_alpha"], entry["target_modules"]) == \
        ("LORA", 4, 8, ["q_proj", "v_proj"])
    assert entry["modules"]["model.layers.1.self_attn.v_proj"] == \
        {"kind": "linear", "rank": 4, "shape": [32, 64]}  # 2 KV heads x 16: v_proj is (32, 64)
    assert len(entry["modules"]) == 4
    assert entry["base"] == {"source": "--adapter-base", "claimed": str(zoo["a"])}
    # cubepack.yaml and the card show it; the adapter's bytes are PEFT's, unchanged.
    stated = yaml.safe_load((packed / "cubepack.yaml").read_text())
    assert stated["adapters"]["lora"]["digest"] == entry["digest"]
    assert stated["models"]["adapter.lora"]["weights_digest"] == base.weights_digest
    assert "parametric/lora/adapter_model.safetensors" in stated["memories"]["parametric"]
    card = (packed / "README.md").read_text()
    assert "Parametric memories (LoRA adapters)" in card and entry["digest"] in card
    assert "the adapter `lora` is only valid for this base model" in card
    assert (packed / "parametric/lora/adapter_model.safetensors").read_bytes() == \
        (adapter_a / "adapter_model.safetensors").read_bytes()
    report = cubepack.verify(packed, model=zoo["a"])
    assert [c.ok for c in report.checks if c.name == "adapter base"] == [True]
    assert any(c.name == "adapter" and c.ok for c in report.checks)


def test_a_repack_without_the_base_keeps_the_claimed_base_found_by_its_name(cube, zoo):
    """Without --adapter-base, the adapter_config's name finds the base (a claim used only to
    look): the pin is still the fingerprint of what was found."""
    before = read_lock(cube)["models"]["adapter.lora"]
    result = cubepack.pack(cube, cube_id="ns/adapter")
    assert read_lock(cube)["models"]["adapter.lora"]["identity"] == before["identity"]
    assert result.adapters["lora"]["base_source"] == \
        "adapter_config.json's base_model_name_or_path"


def test_a_config_claiming_another_base_is_recorded_as_a_claim_only(tmp_path, zoo, adapter_a):
    cube = adapter_cube(tmp_path, adapter_a)
    config_path = cube / "parametric/lora/adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = "someone/other-model"
    config_path.write_text(json.dumps(config))
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    lock = read_lock(cube)
    assert lock["adapters"]["lora"]["base"] == {"source": "--adapter-base",
                                                "claimed": "someone/other-model"}
    assert lock["models"]["adapter.lora"]["identity"]["weights_digest"] == \
        cubepack.fingerprint(zoo["a"]).weights_digest
    assert "its config claims `someone/other-model`" in (cube / "README.md").read_text()


def test_a_claimed_base_that_cannot_be_found_asks_for_adapter_base(tmp_path, adapter_a):
    cube = adapter_cube(tmp_path, adapter_a)
    config_path = cube / "parametric/lora/adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelNotFoundError, match="--adapter-base MODEL"):
        cubepack.pack(cube, cube_id="ns/adapter")
    assert not (cube / "cubepack.lock").exists()


def test_adapter_base_on_a_cube_without_adapters_is_a_usage_error(tmp_path, zoo):
    (tmp_path / "notes.txt").write_text("no adapter here\n")
    with pytest.raises(UsageError, match="holds none"):
        cubepack.pack(tmp_path, cube_id="ns/x", adapter_base=str(zoo["a"]))


def test_shapes_that_disagree_with_the_base_are_refused_naming_module_expected_found(
        tmp_path, adapter_a, narrow):
    cube = adapter_cube(tmp_path, adapter_a)
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(narrow))
    message = str(caught.value)
    assert "module model.layers.0.self_attn.q_proj" in caught.value.fields
    assert "a base weight [64, 64]" in message and "found [32, 32]" in message
    assert "a base weight [32, 64] (lora_A [4, 64], lora_B [32, 4]), found [32, 32]" in message
    assert not (cube / "cubepack.lock").exists()


def test_a_module_absent_from_the_base_is_refused(tmp_path, zoo):
    deep_adapter = make_adapter(zoo["deep"], tmp_path / "adapter-deep")
    cube = adapter_cube(tmp_path, deep_adapter)
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    assert "module model.layers.2.self_attn.q_proj" in caught.value.fields
    assert "absent from the base model" in str(caught.value)


def test_a_base_module_the_config_targets_without_tensors_is_refused(tmp_path, zoo, adapter_a):
    """A's adapter on the 3-layer model: PEFT would give layer 2 fresh random LoRA weights."""
    cube = adapter_cube(tmp_path, adapter_a)
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["deep"]))
    assert "module model.layers.2.self_attn.v_proj" in caught.value.fields
    assert "none in the adapter" in str(caught.value)


@pytest.mark.parametrize("change, match", [
    ({"init_lora_weights": "pissa"}, "rewriting the base model's weights"),
    ({"modules_to_save": ["lm_head"]}, "replaces or adds base-model weights"),
    ({"peft_type": "IA3"}, "pins LoRA adapters"),
])
def test_adapters_that_rewrite_or_replace_base_weights_are_unsupported(tmp_path, zoo, adapter_a,
                                                                       change, match):
    cube = adapter_cube(tmp_path, adapter_a)
    config_path = cube / "parametric/lora/adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **change}))
    with pytest.raises(UnsupportedError, match=match):
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))


def test_peft_files_outside_parametric_are_refused(tmp_path, zoo, adapter_a):
    shutil.copytree(adapter_a, tmp_path / "cube" / "lora")
    with pytest.raises(FormatError, match="outside parametric/NAME/"):
        cubepack.pack(tmp_path / "cube", cube_id="ns/adapter", adapter_base=str(zoo["a"]))


@once  # which modules a process imports is the same in both environments
def test_shape_refusals_import_neither_peft_nor_torch(tmp_path, adapter_a, narrow, zoo):
    """pack's check against the base reads safetensors headers only; load_adapter refuses
    another base before it imports peft."""
    cube = adapter_cube(tmp_path, adapter_a)
    code = f"""
import sys
import cubepack
try:
    cubepack.pack({str(cube)!r}, cube_id="ns/x", adapter_base={str(narrow)!r})
except cubepack.IdentityMismatch as exc:
    assert "model.layers.0.self_attn.q_proj" in str(exc)
else:
    raise SystemExit("not refused")
assert "peft" not in sys.modules and "torch" not in sys.modules, sorted(
    m for m in ("peft", "torch") if m in sys.modules)
cubepack.pack({str(cube)!r}, cube_id="ns/x", adapter_base={str(zoo['a'])!r})
from cubepack.testing import tiny
model = tiny.load({str(narrow)!r})
try:
    cubepack.load_adapter(model, {str(cube)!r}, "lora")
except cubepack.IdentityMismatch as exc:
    assert "module model.layers.0.self_attn.q_proj" in exc.fields, exc.fields
    assert "weights_digest" in exc.fields and "geometry.hidden_size" in exc.fields
else:
    raise SystemExit("not refused")
assert "peft" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


# --- verify, load_adapter ------------------------------------------------------------------------

def test_verify_refuses_the_adapter_on_model_b_naming_the_fields(packed, zoo):
    report = cubepack.verify(packed, model=zoo["b"], raise_on_failure=False)
    failed = {c.subject for c in report.failures if c.role == "adapter.lora"}
    assert any(subject.endswith("weights_digest") for subject in failed), failed
    assert all(c.detail.endswith("(the base this adapter was packed for)")
               for c in report.failures if c.name == "model identity")


def test_load_adapter_refuses_model_b_and_a_in_bfloat16(packed, models):
    with pytest.raises(IdentityMismatch) as other:
        cubepack.load_adapter(models["b"], packed, "lora")
    assert "weights_digest" in other.value.fields
    with pytest.raises(IdentityMismatch) as bf16:
        cubepack.load_adapter(models["a_as_bf16"], packed, "lora")
    assert "dtype" in bf16.value.fields and "weights_digest" not in bf16.value.fields
    assert "dtype: expected float32, found bfloat16" in str(bf16.value)
    assert not hasattr(models["b"], "peft_config")  # nothing was applied


def test_on_its_base_the_adapter_gives_the_logits_peft_gives_the_original(packed, zoo, adapter_a):
    from peft import PeftModel

    applied = cubepack.load_adapter(tiny.load(zoo["a"]), packed)  # the only adapter
    reference = PeftModel.from_pretrained(tiny.load(zoo["a"]), str(adapter_a))
    assert isinstance(applied, PeftModel)
    assert torch.equal(logits(applied), logits(reference))
    assert not torch.allclose(logits(applied), logits(tiny.load(zoo["a"])))  # it adapts


def test_a_tampered_adapter_file_is_refused_by_verify_and_load(cube, zoo):
    weights = cube / "parametric/lora/adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    report = cubepack.verify(cube, raise_on_failure=False)
    assert [c.subject for c in report.failures if c.name == "sha256"] == \
        ["parametric/lora/adapter_model.safetensors"]
    with pytest.raises(VerificationFailed):
        cubepack.load_adapter(tiny.load(zoo["a"]), cube, "lora")


def test_a_lock_entry_rewritten_to_other_shapes_is_refused_by_verify(cube):
    def change(lock):
        lock["adapters"]["lora"]["modules"]["model.layers.0.self_attn.q_proj"]["shape"] = [64, 32]

    reseal_lock(cube, change)
    report = cubepack.verify(cube, raise_on_failure=False)
    assert any(c.name == "adapter" and "model.layers.0.self_attn.q_proj" in c.subject
               for c in report.failures)


@pytest.mark.parametrize("change", [
    lambda e, lock: e.update(rank="4"),
    lambda e, lock: e.pop("base"),
    lambda e, lock: e.update(digest="sha256:" + "0" * 64),
    lambda e, lock: e.update(weights_file="parametric/lora/other.safetensors"),
    lambda e, lock: e["modules"].update(x={"kind": "conv", "rank": 4, "shape": [1, 1]}),
    lambda e, lock: e["base"].update(claimed=3),
    lambda e, lock: lock["models"]["adapter.lora"].update(strict=False),
    lambda e, lock: e.update(target_modules=[]),
], ids=["rank-type", "no-base", "digest", "unlisted-file", "module-kind", "claimed-type",
        "base-not-strict", "no-targets"])
def test_the_lock_adapters_section_is_parsed_strictly(cube, change):
    lock = read_lock(cube)
    change(lock["adapters"]["lora"], lock)
    resealed = lockfile.build_lock(cube_id=lock["cube_id"], files=lock["files"],
                                   models=lock["models"], activations=lock["activations"],
                                   cubepack_version=lock["cubepack_version"],
                                   adapters=lock["adapters"])
    with pytest.raises(FormatError, match="adapter 'lora'"):
        lockfile.parse(lockfile.dumps(resealed).encode())


def test_the_cli_packs_with_adapter_base_and_says_how_the_base_was_found(tmp_path, zoo,
                                                                         adapter_a):
    cube = adapter_cube(tmp_path, adapter_a)
    done = subprocess.run([sys.executable, "-m", "cubepack", "pack", str(cube), "--cube-id",
                           "ns/x", "--adapter-base", str(zoo["a"]), "--json"],
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["adapters"]["lora"]["base_source"] == "--adapter-base"
    text = subprocess.run([sys.executable, "-m", "cubepack", "pack", str(cube), "--cube-id",
                           "ns/x"],
                          capture_output=True, text=True, check=False, timeout=600).stdout
    assert "adapter lora: sha256:" in text and "base pinned as model adapter.lora" in text


def test_diff_names_a_retrained_adapter_and_a_moved_base(cube, zoo, tmp_path):
    before = tmp_path / "before.lock"
    before.write_bytes((cube / "cubepack.lock").read_bytes())
    shutil.rmtree(cube / "parametric" / "lora")
    make_adapter(zoo["a"], cube / "parametric" / "lora", seed=8)
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["b"]))  # B: A's shapes
    changes = cubepack.diff(before, cube)
    adapters = changes["sections"]["adapters"]
    assert (adapters["added"], adapters["removed"], list(adapters["changed"])) == ([], [],
                                                                                   ["lora"])
    base = changes["sections"]["models"]
    assert "identity.weights_digest" in [c["field"] for c in base["changed"]["adapter.lora"]]
    assert base["basis"]["adapter.lora"] == "claimed"  # a lock's pin is its writer's word


def test_a_hub_base_is_pinned_at_its_commit_remembered_and_checked_from_the_hf_cache(
        tmp_path, adapter_a, hub_cached, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cube = adapter_cube(tmp_path, adapter_a)
    spec = f"{hub_cached['repo_id']}@{hub_cached['commit']}"
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=spec)
    pin = read_lock(cube)["models"]["adapter.lora"]
    assert (pin["repo_id"], pin["revision"]) == (hub_cached["repo_id"], hub_cached["commit"])
    again = cubepack.pack(cube, cube_id="ns/adapter")  # the claim (a tmp path) is not needed
    assert again.adapters["lora"]["base_source"] == "the last pack's pin"
    report = cubepack.verify(cube)  # no --model: the pinned revision in the HF cache
    assert [(c.ok, c.basis) for c in report.checks if c.role == "adapter.lora"] == [
        (True, "proved"), (True, "claimed"), (True, "proved")]  # weights; dtype: the pin's word


def test_adapter_base_per_adapter_and_an_unknown_name(tmp_path, zoo, adapter_a):
    cube = adapter_cube(tmp_path, adapter_a)
    with pytest.raises(UsageError, match="names \\['other'\\]"):
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base={"other": str(zoo["a"])})
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base={"lora": str(zoo["a"])})
    assert read_lock(cube)["adapters"]["lora"]["base"]["source"] == "--adapter-base"


@pytest.mark.parametrize("config, kinds", [
    ({"target_modules": ["embed_tokens", "q_proj"]}, {"embedding", "linear"}),
    ({"use_dora": True}, {"linear"}),
    ({"lora_bias": True, "r": 2, "lora_alpha": 4}, {"linear"}),
], ids=["embedding", "dora", "lora-bias"])
def test_other_lora_tensors_are_checked_and_give_peft_logits(tmp_path, zoo, narrow, config,
                                                           kinds):
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(11)
    peft_model = get_peft_model(tiny.load(zoo["a"]), LoraConfig(
        **{"r": 4, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False,
           **config}))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(str(adapter), save_embedding_layers=False)
    cube = adapter_cube(tmp_path, adapter)
    cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
    entry = read_lock(cube)["adapters"]["lora"]
    assert {m["kind"] for m in entry["modules"].values()} == kinds
    applied = cubepack.load_adapter(tiny.load(zoo["a"]), cube, "lora")
    reference = PeftModel.from_pretrained(tiny.load(zoo["a"]), str(adapter))
    assert torch.equal(logits(applied), logits(reference))
    with pytest.raises(IdentityMismatch):
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(narrow))


@pytest.mark.parametrize("layout, match", [
    ({"parametric/x.safetensors": "adapter_model.safetensors"}, "sits directly in parametric/"),
    ({"parametric/lora/adapter_config.json": "adapter_config.json"}, "lacks adapter_model"),
    ({"parametric/lora/adapter_config.json": "adapter_config.json",
      "parametric/lora/adapter_model.safetensors": "adapter_model.safetensors",
      "parametric/lora/adapter_model_2.safetensors": "adapter_model.safetensors"},
     "an adapter's weights are one"),
    ({"parametric/bad name/adapter_config.json": "adapter_config.json",
      "parametric/bad name/adapter_model.safetensors": "adapter_model.safetensors"},
     "a plain name"),
], ids=["loose-file", "no-weights", "second-weights", "name"])
def test_the_parametric_layout_is_refused_when_it_is_not_peft_s(tmp_path, zoo, adapter_a, layout,
                                                               match):
    cube = tmp_path / "cube"
    for target, source in layout.items():
        (cube / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(adapter_a / source, cube / target)
    with pytest.raises((FormatError, cubepack.UnsafeInputError), match=match):
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))


def test_a_rank_that_contradicts_the_config_is_refused(tmp_path, zoo, adapter_a):
    cube = adapter_cube(tmp_path, adapter_a)
    config_path = cube / "parametric/lora/adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "r": 8}))
    with pytest.raises(FormatError, match="have rank 4, but adapter_config.json says r=8"):
        cubepack.pack(cube, cube_id="ns/adapter", adapter_base=str(zoo["a"]))
