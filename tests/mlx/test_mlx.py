"""MLX-LM prompt caches: transformers -> cubepack -> MLX -> cubepack -> transformers, with
another model (B: same shapes, other weights) refused at every step, and a cache crossing
runtimes accepted only once the loading runtime recomputes it (real mlx and mlx_lm, the tiny
models' own safetensors folders)."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import numpy
import pytest
import torch
from mlx_lm.models.cache import load_prompt_cache as mlx_load_prompt_cache
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.cache import save_prompt_cache as mlx_save_prompt_cache

import cubepack
import cubepack.mlx
from cubepack.cli import main
from cubepack.kv._torch import forward
from cubepack.mlx._runtime import to_torch

from helpers import build_cache

IDS = [1, 17, 42, 7, 99, 5, 300, 12]


def cli(capsys, *args):
    code = main([*map(str, args), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] == (code == 0)
    return code, data


def mlx_continue(model, caches, tokens):
    """Feed ``tokens`` after ``caches`` in MLX (extending them); the last logits."""
    logits = model(mx.array([tokens]), cache=caches)
    mx.eval(logits)
    return numpy.array(logits[0, -1].astype(mx.float32))


def test_round_trip_with_refusal_at_every_step(zoo, models, mlx_models, tmp_path, capsys):
    # transformers: A's cache, refused for B
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS])),
                                tmp_path / "a.kv.safetensors", producer=models["a"], token_ids=IDS)
    with pytest.raises(cubepack.IdentityMismatch, match="weights_digest"):
        cubepack.load_kv_cache(kv, models["b"])
    # -> MLX: exported (refused for B's name), read by mlx_lm itself, checked by cubepack
    code, refused = cli(capsys, "export", "mlx", kv, "--out", tmp_path / "x.safetensors",
                        "--model", zoo["b"])
    assert code == 1 and "weights_digest" in refused["error"]["message"]
    code, exported = cli(capsys, "export", "mlx", kv, "--out", tmp_path / "p.safetensors")
    assert code == 0
    theirs, metadata = mlx_load_prompt_cache(exported["path"], return_metadata=True)
    assert [c.offset for c in theirs] == [len(IDS)] * 2 and "cubepack" in metadata
    # Recomputed in MLX. A fixed probe draw: float32's probe-logit bound sits within ~1.1x of
    # MLX's honest difference from transformers on some draws (docs/explanation/runtimes.md
    # states it; #30 item 3 replaces that bound), and this test is about the round trip.
    # The load recomputed (another runtime's cache), so it hands back MLX's own prefill, which
    # reproduces the file's tensors within the bound (a bound binds no answer; a prefill does).
    from cubepack.mlx._runtime import MLXRuntime

    ours = cubepack.mlx.load_prompt_cache(exported["path"], mlx_models["a"], seed=0)
    own = MLXRuntime(mlx_models["a"]).prefill_layers(IDS)
    assert numpy.array_equal(numpy.array(ours[0].keys), own[0][2].numpy())
    assert numpy.allclose(numpy.array(ours[0].keys), numpy.array(theirs[0].keys[..., :8, :]),
                          atol=1e-4)
    for other in ("b", "deep"):
        with pytest.raises(cubepack.IdentityMismatch):
            cubepack.mlx.load_prompt_cache(exported["path"], mlx_models[other])
    # MLX continues the cache and saves it with its producer (A as MLX runs it)
    more = [33, 44]
    mlx_logits = mlx_continue(mlx_models["a"], ours, more)
    saved = cubepack.mlx.save_prompt_cache(tmp_path / "m.safetensors", ours, mlx_models["a"],
                                           token_ids=IDS + more)
    assert [c.offset for c in mlx_load_prompt_cache(str(saved))] == [len(IDS) + 2] * 2
    # -> cubepack: imported (refused for B), the runtime recorded
    code, refused = cli(capsys, "import", "mlx", saved, "--model", zoo["b"], "--out",
                        tmp_path / "b.kv.safetensors")
    assert code == 1 and "weights_digest" in refused["error"]["message"]
    code, imported = cli(capsys, "import", "mlx", saved, "--model", zoo["a"])
    assert code == 0 and imported["runtime"].startswith("mlx-lm ")
    assert imported["producer"]["weights_digest"] == cubepack.fingerprint(zoo["a"]).weights_digest
    # -> transformers: recomputed here before it is accepted; refused for B
    back = cubepack.load_kv_cache(imported["path"], models["a"])
    assert back.get_seq_length() == len(IDS) + 2
    with pytest.raises(cubepack.IdentityMismatch, match="weights_digest"):
        cubepack.load_kv_cache(imported["path"], models["b"])
    # and the continuation agrees across runtimes
    prefix = cubepack.load_kv_cache(kv, models["a"], copy=True)
    with torch.no_grad():
        logits = forward(models["a"], torch.tensor([more]), prefix).logits[0, -1]
    assert numpy.abs(logits.numpy() - mlx_logits).max() / numpy.abs(mlx_logits).max() < 1e-5


def test_mlx_lm_own_cache_imports_with_token_ids_and_recomputation(zoo, mlx_models, models,
                                                                  tmp_path, capsys):
    cache = make_prompt_cache(mlx_models["a"])
    mx.eval(mlx_models["a"](mx.array([IDS]), cache=cache))
    native = tmp_path / "native.safetensors"
    mlx_save_prompt_cache(str(native), cache, {"model": "some/name"})  # padded to 256 positions
    ids = json.dumps(IDS)
    code, refused = cli(capsys, "import", "mlx", native, "--model", zoo["b"], "--token-ids", ids,
                        "--recompute", "--out", tmp_path / "b.kv.safetensors")
    assert code == 1 and refused["error"]["type"] == "RecomputationFailed"
    assert not (tmp_path / "b.kv.safetensors").exists()
    code, imported = cli(capsys, "import", "mlx", native, "--model", zoo["a"], "--token-ids", ids,
                         "--recompute")
    assert code == 0 and imported["token_count"] == len(IDS)
    info = cubepack.read_kv_header(imported["path"])
    assert info.metadata["converted_from"]["metadata"] == {"model": "some/name"}
    assert "provenance" not in info.metadata  # proved, so not lowered to asserted
    assert cubepack.load_kv_cache(imported["path"], models["a"]).get_seq_length() == len(IDS)
    # without ids: labelled asserted, and no other runtime can accept it
    code, bare = cli(capsys, "import", "mlx", native, "--model", zoo["a"], "--out",
                     tmp_path / "bare.kv.safetensors")
    assert code == 0
    assert cubepack.read_kv_header(bare["path"]).metadata["provenance"]["kind"] == "asserted"
    with pytest.raises(cubepack.RecomputationFailed, match="no token ids"):
        cubepack.load_kv_cache(bare["path"], models["a"])
    code, refused = cli(capsys, "import", "mlx", native, "--model", zoo["deep"])
    assert code == 1 and "num_layers" in refused["error"]["message"]


def test_a_check_refuses_before_mlx_reads_a_tensor(zoo, models, mlx_models, tmp_path,
                                                   monkeypatch):
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS])),
                                tmp_path / "a.kv.safetensors", producer=models["a"], token_ids=IDS)
    exported = cubepack.mlx.export_prompt_cache(kv, tmp_path / "p.safetensors")
    read = []
    real_load = mx.load
    monkeypatch.setattr(mx, "load", lambda *a, **k: read.append(a) or real_load(*a, **k))
    for path in (kv, exported):  # a KV file loads into MLX too
        with pytest.raises(cubepack.IdentityMismatch):
            cubepack.mlx.load_prompt_cache(path, mlx_models["b"])
    assert read == []
    assert len(cubepack.mlx.load_prompt_cache(kv, mlx_models["a"])) == 2 and len(read) == 1
    cache = make_prompt_cache(mlx_models["a"])
    mx.eval(mlx_models["a"](mx.array([IDS]), cache=cache))
    mlx_save_prompt_cache(str(tmp_path / "native.safetensors"), cache)
    with pytest.raises(cubepack.FormatError, match="records no producer"):
        cubepack.mlx.load_prompt_cache(tmp_path / "native.safetensors", mlx_models["a"])
    with pytest.raises(cubepack.UsageError, match="cubepack.mlx.load"):
        cubepack.mlx.load_prompt_cache(kv, cubepack.mlx.load(zoo["a"])[0].__class__(
            mlx_models["a"].args))


def _perturbed(layers, scale):
    return [(kind, length, keys + scale * torch.randn_like(keys), values)
            for kind, length, keys, values in layers]


def test_a_cache_changed_in_another_runtime_is_refused_where_it_is_loaded(
        zoo, models, mlx_models, tmp_path):
    """The header is right (A, MLX) but the values are not what A computes: transformers
    recomputes it on load and refuses; and a transformers cache altered the same way is refused
    by MLX."""
    from cubepack.kv._torch import write_kv_layers
    from cubepack.mlx._runtime import MLXRuntime

    torch.manual_seed(0)
    made = MLXRuntime(mlx_models["a"]).prefill_layers(IDS)
    identity = cubepack.mlx.model_identity(mlx_models["a"])
    altered = write_kv_layers(_perturbed(made, 0.5), tmp_path / "m.kv.safetensors",
                              producer=identity, token_ids=IDS,
                              metadata={"runtime": "mlx-lm 0.32.2"})
    with pytest.raises(cubepack.RecomputationFailed, match="computed by mlx-lm"):
        cubepack.load_kv_cache(altered, models["a"])
    honest = write_kv_layers(made, tmp_path / "h.kv.safetensors", producer=identity,
                             token_ids=IDS, metadata={"runtime": "mlx-lm 0.32.2"})
    assert cubepack.load_kv_cache(honest, models["a"]).get_seq_length() == len(IDS)
    from cubepack.kv._torch import cache_layers

    theirs = cache_layers(build_cache(models["a"], torch.tensor([IDS])))
    bad = write_kv_layers(_perturbed(theirs, 0.5), tmp_path / "t.kv.safetensors",
                          producer=cubepack.fingerprint(models["a"]), token_ids=IDS)
    with pytest.raises(cubepack.RecomputationFailed, match="computed by transformers"):
        cubepack.mlx.load_prompt_cache(cubepack.mlx.export_prompt_cache(
            bad, tmp_path / "t.safetensors"), mlx_models["a"])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cross_runtime_error_per_dtype_is_within_the_bounds(zoo, dtype):
    """The numbers the README states: an MLX prefill checked by transformers, and a
    transformers prefill checked by MLX, on the tiny models (large weights: a worst case), 2
    random prompts of 16 and 64 tokens, in the dtype both run in (``pytest -s`` prints them;
    bench/runtimes.py measures longer ones)."""
    from cubepack.kv._recompute import TorchRuntime, recompute_layers
    from cubepack.mlx._runtime import MLXRuntime
    from cubepack.testing import tiny

    torch_model = tiny.load(zoo["a"], dtype=getattr(torch, dtype))
    mlx_model, _ = cubepack.mlx.load(zoo["a"], dtype=dtype)
    assert cubepack.mlx.model_identity(mlx_model).strict() == \
        cubepack.fingerprint(torch_model).strict()
    worst = {"mlx->transformers": [0.0, 0.0], "transformers->mlx": [0.0, 0.0]}
    rng = numpy.random.default_rng(0)
    for length in (16, 64):
        ids = [int(t) for t in rng.integers(2, 1000, size=length)]
        mlx_made = MLXRuntime(mlx_model).prefill_layers(ids)
        torch_made = TorchRuntime(torch_model).prefill_layers(ids)
        for direction, stored, runtime in (
                ("mlx->transformers", mlx_made, TorchRuntime(torch_model)),
                ("transformers->mlx", torch_made, MLXRuntime(mlx_model))):
            result = recompute_layers(None, stored, dtype, ids, direction, seed=length,
                                      runtime=runtime)
            assert result.ok, (direction, length, result.to_dict())
            worst[direction][0] = max(worst[direction][0], result.max_rel_error)
            worst[direction][1] = max(worst[direction][1], result.max_logit_error)
    print(f"\ncross-runtime {dtype}: " + "; ".join(
        f"{d}: tensors {t:.2g}, logits {g:.2g}" for d, (t, g) in worst.items()))


def test_bf16_values_survive_every_hop_bit_exactly(zoo, models, mlx_models, tmp_path):
    """No conversion rounds: a bf16 cache goes KV file -> prompt cache -> KV file unchanged."""
    bf16 = models["a_as_bf16"]
    kv = cubepack.save_kv_cache(build_cache(bf16, torch.tensor([IDS])), tmp_path / "a.kv.safetensors",
                                producer=bf16, token_ids=IDS)
    exported = cubepack.mlx.export_prompt_cache(kv, tmp_path / "p.safetensors")
    back = cubepack.mlx.import_prompt_cache(exported, zoo["a"], out=tmp_path / "b.kv.safetensors")
    first, second = (cubepack.load_kv_cache(p, bf16) for p in (kv, back))
    assert torch.equal(first.layers[1].values, second.layers[1].values)
    loaded = mlx_load_prompt_cache(str(exported))
    assert torch.equal(to_torch(loaded[1].values), first.layers[1].values)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_dtype_an_mlx_model_runs_in_is_the_one_its_parameters_have(zoo, dtype, tmp_path):
    """The producer's dtype is the one floating dtype of the parameters (arrays a module keeps
    under ``_`` names or in tuples are none); a model mixing dtypes, or quantized after
    loading (its folder's fingerprint no longer its weights), has no identity to give."""
    from mlx import nn

    from cubepack.mlx._runtime import model_dtype, model_identity

    class Odd(nn.Module):
        def __init__(self, last):
            super().__init__()
            self._private = mx.zeros(2, dtype=mx.float16)  # not a parameter
            self.held = (mx.zeros(2, dtype=mx.bfloat16),)  # a tuple: not a parameter
            self.table = {"_kept": [mx.zeros(1, dtype=mx.int32),
                                    mx.zeros(1, dtype=getattr(mx, dtype))]}
            self.last = mx.zeros(1, dtype=last)

    model, _ = cubepack.mlx.load(zoo["a"], dtype=dtype)
    assert model_dtype(model) == model_dtype(Odd(getattr(mx, dtype))) == dtype
    assert model_identity(model).dtype == dtype
    other = "float32" if dtype != "float32" else "bfloat16"
    with pytest.raises(cubepack.UsageError, match=f"mix .*{other}|mix {other}"):
        model_dtype(Odd(getattr(mx, other)))
    model.model.embed_tokens.set_dtype(getattr(mx, other))  # one module cast back
    with pytest.raises(cubepack.UsageError, match="Cast it whole") as refused:
        model_identity(model)
    advice = re.search(r"model\.set_dtype\(mx\.(\w+)\)", str(refused.value)).group(1)
    model.set_dtype(getattr(mx, advice))  # the fix it names works
    assert model_identity(model).dtype == advice
    with pytest.raises(cubepack.UsageError, match="no floating-point parameters"):
        model_dtype(nn.Module())
    quantized, _ = cubepack.mlx.load(zoo["a"], dtype=dtype)
    nn.quantize(quantized, group_size=32, bits=4)
    with pytest.raises(cubepack.UsageError, match="quantized after loading"):
        model_identity(quantized)
    honest, _ = cubepack.mlx.load(zoo["a"], dtype=dtype)
    saved = cubepack.mlx.save_prompt_cache(tmp_path / "c.safetensors",
                                           cubepack.mlx.prefill(honest, IDS), honest, token_ids=IDS)
    with pytest.raises(cubepack.UsageError, match="quantized after loading"):
        cubepack.mlx.load_prompt_cache(saved, quantized)


def test_a_quantized_folder_is_its_own_identity_and_quantizing_more_is_refused(zoo, tmp_path):
    """A folder mlx_lm quantized (whole, or its MLP layers only) loads and round-trips under
    its own fingerprint; quantizing the rest in memory gives a model whose quantization is
    not its folder's: refused, naming the module."""
    from mlx import nn
    from mlx_lm import convert

    from cubepack.mlx._runtime import model_identity

    for name, predicate in (("whole", None), ("mlp", lambda path, module, *_: "mlp" in path)):
        folder = tmp_path / name
        convert(str(zoo["a"]), mlx_path=str(folder), quantize=True, q_group_size=32, q_bits=4,
                **({"quant_predicate": predicate} if predicate else {}))
        model, _ = cubepack.mlx.load(folder)
        saved = cubepack.mlx.save_prompt_cache(tmp_path / f"{name}.safetensors",
                                               cubepack.mlx.prefill(model, IDS), model,
                                               token_ids=IDS)
        assert [c.offset for c in cubepack.mlx.load_prompt_cache(saved, model)] == [len(IDS)] * 2
    nn.quantize(model, group_size=32, bits=2,  # the MLP-only folder's model: the rest now
                class_predicate=lambda path, module: hasattr(module, "to_quantized"))
    with pytest.raises(cubepack.UsageError, match="quantization is not its folder's"):
        model_identity(model)
