"""What a model's config says about its identity: geometry, compute config, quantization. Pure.

The *compute config* is every config value that can change the forward pass. It is built as a
denylist: every key counts except those known not to affect outputs (names, versions, dtype
keys, generation defaults, output flags, label maps, training-only settings) and those compared
elsewhere (geometry, quantization). So a model type cubepack has never seen is covered by
default. RoPE is put in one canonical form, so transformers 4.57's ``rope_theta``/``rope_scaling``
and 5.x's ``rope_parameters`` give the same value for the same model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._util import canonical
from ..errors import FormatError

#: Keys known not to change a forward pass in inference (or compared under another field).
NOT_COMPUTE = frozenset({
    # names, versions, bookkeeping
    "_name_or_path", "name_or_path", "transformers_version", "architectures", "_commit_hash",
    "model_type", "auto_map", "custom_pipelines", "_attn_implementation_autoset",
    "_attn_implementation", "attn_implementation", "_attn_implementation_internal",
    "_experts_implementation", "base_config_key", "sub_configs",
    # the dtype the weights run in is the identity's own ``dtype`` field
    "torch_dtype", "dtype", "use_bfloat16",
    # generation defaults and output flags
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "use_cache", "output_attentions",
    "output_hidden_states", "return_dict", "torchscript", "tf_legacy_loss",
    "chunk_size_feed_forward",
    # task heads, labels, tokenizer names
    "id2label", "label2id", "problem_type", "finetuning_task", "task_specific_params", "prefix",
    "tokenizer_class", "is_encoder_decoder", "is_decoder", "add_cross_attention",
    "cross_attention_hidden_size", "tie_encoder_decoder",
    # training only: weight initialisation
    "initializer_range", "initializer_factor",
    # compared as geometry
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_size", "vocab_size", "layer_types", "sliding_window",
    # compared as quantization
    "quantization_config",
})
#: Dropout rates: inactive in inference (``model.eval()``), whatever their value.
_DROPOUT = re.compile(r"(^|_)(dropout|pdrop)(_|$)|dropout_(prob|rate)$")
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")


#: Largest geometry value a config may give (a config from elsewhere must not make cubepack
#: build a billion-entry layer list or divide by a string).
MAX_GEOMETRY = 1 << 24


def geometry_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """The KV-relevant shape of a model, from its config dict (text config for multimodal).

    Raises:
        FormatError: the config is not an object, or a shape value is not a reasonable integer.
    """
    if not isinstance(config, dict):
        raise FormatError(f"A model config must be a JSON object, found {type(config).__name__}.")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(text, "num_attention_heads", "n_head")
    kv_heads = _first(text, "num_key_value_heads", "num_kv_heads") or heads
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    for key, value in (("num_hidden_layers", layers), ("num_attention_heads", heads),
                       ("num_key_value_heads", kv_heads), ("hidden_size", hidden),
                       ("head_dim", text.get("head_dim")), ("vocab_size", text.get("vocab_size")),
                       ("sliding_window", text.get("sliding_window"))):
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_GEOMETRY):
            raise FormatError(f"The model config's {key} must be an integer in 0..{MAX_GEOMETRY}, "
                              f"found {str(value)[:40]!r}.")
    layer_types = text.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and len(layer_types) <=
                                        MAX_GEOMETRY and all(isinstance(t, str)
                                                             for t in layer_types)):
        raise FormatError("The model config's layer_types must be a list of layer type names.")
    head_dim = text.get("head_dim") or (hidden // heads if hidden and heads else None)
    window = text.get("sliding_window") or text.get("attention_chunk_size")
    layer_types = text.get("layer_types")
    if not layer_types and layers:
        sliding = window is not None and text.get("use_sliding_window", True) is not False
        layer_types = ["sliding_attention" if sliding else "full_attention"] * layers
    layer_types = list(layer_types or [])
    if not any(kind in ("sliding_attention", "chunked_attention") for kind in layer_types):
        window = None
    return {
        "model_type": text.get("model_type") or config.get("model_type"),
        "num_layers": layers,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_size": hidden,
        "vocab_size": text.get("vocab_size") or config.get("vocab_size"),
        "layer_types": layer_types,
        "sliding_window": window,
    }


def declared_context(config: Any) -> tuple[int | None, str]:
    """(positions, what declares them): how many positions a model's config (a dict, or a
    transformers config object) says it attends over; (None, "") when it states no limit.

    ``max_position_embeddings`` (``n_positions``), unless a RoPE scaling extends it: YaRN,
    dynamic NTK, LongRoPE, linear and Llama 3 scalings run the model past that field, to
    ``factor x original_max_position_embeddings`` (the original defaulting to
    ``max_position_embeddings``, as transformers reads it; the larger of the two counts). A
    scaling with no factor (LongRoPE's Phi-3 form) declares ``max_position_embeddings``.
    """
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        return None, ""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    declared = _first(text, "max_position_embeddings", "n_positions")
    if type(declared) is not int or declared <= 0:
        return None, ""
    best, how = declared, f"max_position_embeddings {declared}"
    params = text.get("rope_parameters")
    nested = isinstance(params, dict) and params and all(isinstance(v, dict)
                                                        for v in params.values())
    scalings = list(params.values()) if nested else [_canonical_rope(text)]
    for scaling in scalings:
        merged = {**(scaling.get("rope_scaling") or {}), **scaling} \
            if isinstance(scaling.get("rope_scaling"), dict) else scaling
        factor = merged.get("factor")
        original = merged.get("original_max_position_embeddings") or \
            text.get("original_max_position_embeddings") or declared
        if isinstance(factor, (int, float)) and type(original) is int and factor > 0:
            extended = int(factor * original)
            if extended > best:
                kind = merged.get("rope_type") or merged.get("type") or "scaled"
                best, how = extended, (f"{kind} RoPE scaling: factor {factor} x "
                                       f"{original} positions, past max_position_embeddings "
                                       f"{declared}")
    return best, how


def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def quantization_from_config(config: dict[str, Any]) -> dict[str, Any] | None:
    quant = config.get("quantization_config")
    if not quant:
        return None
    return json.loads(canonical.dumps(canonical.json_safe(quant), compact=True))


def config_digest(config: dict[str, Any]) -> str:
    """Digest of the whole config without names and versions (informational)."""
    volatile = ("transformers_version", "_name_or_path", "_commit_hash", "torch_dtype", "dtype",
                "_attn_implementation_autoset", "architectures")
    stable = {k: v for k, v in config.items() if k not in volatile}
    return "sha256:" + canonical.digest(canonical.json_safe(stable))


def compute_config(config: dict[str, Any]) -> dict[str, Any]:
    """The compute config of a config dict: flat ``{key: value}``, nested configs as dotted keys
    (``text_config.rope_theta``), RoPE canonical, JSON values only."""
    flat: dict[str, Any] = {}
    _collect(canonical.json_safe(config), "", flat)
    return flat


def _collect(config: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in _canonical_rope(config).items():
        if key in NOT_COMPUTE or _DROPOUT.search(key):
            continue
        if isinstance(value, dict) and (key.endswith("_config") or key == "rope_parameters"):
            _collect(value, f"{prefix}{key}.", out)
        else:
            out[prefix + key] = value


def _canonical_rope(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its RoPE keys replaced by ``rope_theta``, ``rope_type`` and
    ``rope_scaling`` (the remaining parameters, or None)."""
    if not any(key in config for key in _ROPE_KEYS):
        return config
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        return config  # per-layer-type RoPE (5.x only): compared as given, key by key
    merged: dict[str, Any] = {}
    if isinstance(config.get("rope_scaling"), dict):
        merged.update(config["rope_scaling"])
    if isinstance(params, dict):
        merged.update(params)
    if config.get("rope_theta") is not None:
        merged.setdefault("rope_theta", config["rope_theta"])
    if "type" in merged:
        merged.setdefault("rope_type", merged.pop("type"))
    result = {key: value for key, value in config.items() if key not in _ROPE_KEYS}
    if "partial_rotary_factor" in merged:  # 5.x may move it into the RoPE parameters
        result.setdefault("partial_rotary_factor", merged.pop("partial_rotary_factor"))
    if merged.get("rope_theta") is not None:
        result["rope_theta"] = float(merged.pop("rope_theta"))
    merged.pop("rope_theta", None)
    result["rope_type"] = merged.pop("rope_type", None) or "default"
    result["rope_scaling"] = dict(sorted(merged.items())) or None
    return result
