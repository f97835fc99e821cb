"""Every cache layer class the installed transformers defines is judged on where it keeps its
content (issue #37 item 5). A layer that keeps it elsewhere than in ``keys``/``values`` (a
quantized layer's ``_quantized_keys``, a linear-attention layer's conv and recurrent states, a
KV-sharing ``DummyLayer`` whose tensors live in another layer) is never read as empty, so it
never reaches a model unchecked, and it is never saved.

The classes are swept from ``transformers.cache_utils`` itself, not listed by hand: a
transformers release that adds one fails :func:`test_the_sweep_finds_exactly_the_classes_of_the_table`
until it is classified here (as ``tests/memos/test_memos_cache_paths.py`` sweeps MemOS's cache
paths). Both environments run it: transformers 4.57 (memos) and 5.x (latest). A backend that is
not installed (optimum-quanto, hqq) cannot quantize: the layer is built as it holds its content
(the quantized states beside an emptied residual), with an identity codec.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch
import transformers
from transformers import cache_utils

import cubepack
from cubepack import IdentityMismatch, UnsupportedError
from cubepack.kv._torch import cache_layers, prefill, stored_kind

MAJOR = int(transformers.__version__.split(".")[0])
IDS = torch.tensor([[1, 17, 42, 7, 99, 5, 6, 8]])

STORED = "stored"  # its content is its keys and values: saved, checked by producer
ELSEWHERE = "elsewhere"  # content beside or instead of keys/values: refused, naming the class
ABSTRACT = "abstract"  # a base no layer is an instance of by itself: built through a subclass

#: Each layer class: (how cubepack treats it, the transformers major versions defining it).
LAYERS = {
    "DynamicLayer": (STORED, {4, 5}),
    "DynamicSlidingWindowLayer": (STORED, {4, 5}),
    "DynamicIndexedLayer": (ELSEWHERE, {5}),  # an indexer key cache beside keys/values
    "StaticLayer": (ELSEWHERE, {4, 5}),  # preallocated: positions past its length are zeros
    "StaticSlidingWindowLayer": (ELSEWHERE, {4, 5}),
    "StaticIndexedLayer": (ELSEWHERE, {5}),
    "SlidingWindowLayer": (ELSEWHERE, {4}),  # 4.57's deprecated alias of a static layer
    "ChunkedSlidingLayer": (ELSEWHERE, {4}),
    "BaseQuantizedLayer": (ABSTRACT, {5}),
    "QuantizedLayer": (ABSTRACT, {4, 5}),  # _quantized_keys; keys: the residual, emptied
    "QuantoQuantizedLayer": (ELSEWHERE, {4, 5}),
    "HQQQuantizedLayer": (ELSEWHERE, {4, 5}),
    "Fp8QuantizedLayer": (ELSEWHERE, {5}),  # keys never hold a position
    "LinearAttentionLayer": (ELSEWHERE, {5}),  # conv and recurrent states, no keys
    "LinearAttentionAndFullAttentionLayer": (ELSEWHERE, {5}),
    "LinearAttentionAndSlidingWindowAttentionLayer": (ELSEWHERE, {5}),
    "LinearAttentionAndStaticFullAttentionLayer": (ELSEWHERE, {5}),
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": (ELSEWHERE, {5}),
    "DummyLayer": (ELSEWHERE, {5}),  # KV sharing: its tensors are another layer's
}
#: Bases that define no layer storage of their own.
MIXINS = {"CacheLayerMixin", "LinearAttentionCacheLayerMixin"}


def swept() -> set[str]:
    """Every layer class ``transformers.cache_utils`` defines."""
    found = set()
    for name, value in vars(cache_utils).items():
        if not inspect.isclass(value) or value.__module__ != cache_utils.__name__:
            continue
        bases = [getattr(cache_utils, base, None) for base in MIXINS | {"DummyLayer"}]
        if any(base is not None and issubclass(value, base) for base in bases) \
                or name.endswith("Layer"):
            found.add(name)
    return found - MIXINS


def test_the_sweep_finds_exactly_the_classes_of_the_table():
    assert swept() == {name for name, (_, majors) in LAYERS.items() if MAJOR in majors}


# --- building each class, holding model B's content --------------------------------------------

def _identity_codec(layer):
    """The quantized states are the tensors themselves: what a backend holds, readable here."""
    layer._quantize = lambda tensor, axis=None, scale=None: (
        tensor.clone() if scale is None and axis is not None else (tensor.clone(), 1.0))
    layer._dequantize = lambda state: state[0] if isinstance(state, tuple) else state


def _quantized(cls, keys, values):
    """A KIVI-style quantized layer whose residual was just flushed into its quantized
    states (what every decode step of ``residual_length`` leaves): keys/values hold nothing."""
    layer = cls.__new__(cls)
    cache_utils.QuantizedLayer.__init__(layer, residual_length=1)
    _identity_codec(layer)
    layer.update(keys, values)
    for _ in range(3):
        if layer.keys is not None and layer.keys.dim() == 1 and layer.keys.numel() == 0:
            break
        layer.update(keys[..., :1, :], values[..., :1, :])
    return layer


def _linear(cls, keys, values):
    params = inspect.signature(cls.__init__).parameters
    kwargs = {name: 16 for name in ("max_cache_len", "sliding_window") if name in params}
    layer = cls(**kwargs)
    cache_utils.LinearAttentionLayer.lazy_initialization(
        layer, conv_states=keys.reshape(1, -1, keys.shape[-2]).clone(),
        recurrent_states=values.clone())
    return layer


def build_layer(name, keys, values):
    """A layer of class ``name`` holding ``keys``/``values`` where that class keeps them."""
    cls = getattr(cache_utils, name)
    if name in ("QuantizedLayer", "BaseQuantizedLayer"):  # abstract: a trivial concrete codec
        cls = type(f"Identity{name}", (cls,), {
            "_quantize": lambda self, tensor, axis=None: tensor.clone(),
            "_dequantize": lambda self, state: state})
        if name == "BaseQuantizedLayer":
            layer = cls()
            layer.update(keys, values)
            layer._quantized_keys, layer._quantized_values = keys.clone(), values.clone()
            layer.keys = layer.values = torch.tensor([], dtype=keys.dtype)
            return layer
        return _quantized(cls, keys, values)
    if issubclass(cls, cache_utils.QuantizedLayer):
        return _quantized(cls, keys, values)
    if name == "Fp8QuantizedLayer":
        layer = cls()
        layer.update(keys, values)
        return layer
    if "LinearAttention" in name:
        return _linear(cls, keys, values)
    if name == "DummyLayer":
        return cls()
    params = inspect.signature(cls.__init__).parameters
    kwargs = {key: 16 for key in ("max_cache_len", "sliding_window") if key in params}
    layer = cls(**kwargs)
    length = keys.shape[-2]
    layer.update(keys, values, {"cache_position": torch.arange(length),
                                "sliding_window": 16})
    return layer


def crafted(model, foreign, name):
    """A cache for ``model`` whose every layer is a ``name`` holding ``foreign``'s tensors."""
    cache = cache_utils.DynamicCache(config=model.config)
    for index, layer in enumerate(foreign.layers):
        cache.layers[index] = build_layer(name, layer.keys.clone(), layer.values.clone())
    return cache


@pytest.fixture(scope="module")
def caches(models):
    return prefill(models["b"], IDS)


def guarded(model):
    """The hook's use guard (``HFLLM._generate_with_cache`` under install()), around a call
    that reports what it was handed: driven with a real model, MemOS or not."""
    from cubepack.memos._use import guarded_use
    from cubepack.trust import TrustPolicy

    use = guarded_use(lambda self, query, kv, **kw: ("used", kv),
                      lambda self, query, **kw: ("without a cache", None),
                      lambda: TrustPolicy(on_mismatch="error"))
    llm = types.SimpleNamespace(model=model, tokenizer=None)
    return lambda kv: use(llm, "What does the user drink?", kv)


NAMES = sorted(name for name, (_, majors) in LAYERS.items() if MAJOR in majors)


@pytest.mark.parametrize("name", NAMES)
def test_another_models_content_never_reaches_the_model_whatever_its_layer_class(
        models, caches, name):
    """The break: a quantized layer whose residual was flushed, an FP8 layer, a linear-attention
    layer or a KV-sharing layer keeps its content elsewhere than in ``keys``; the guard read
    such a cache as empty ("no tokens: nothing to check") and handed model B's content to
    model A unchecked."""
    cache = crafted(models["a"], caches, name)
    with pytest.raises(IdentityMismatch) as refused:
        guarded(models["a"])(cache)
    message = str(refused.value)
    assert "produced by" not in message  # it names no producer: "produced by a different model ()"
    how, _ = LAYERS[name]
    if how == STORED:
        assert "of unknown origin" in message
    else:
        assert type(cache.layers[0]).__name__ in message and "DynamicLayer" in message


@pytest.mark.parametrize("name", [n for n in NAMES if LAYERS[n][0] != STORED])
def test_a_layer_keeping_its_content_elsewhere_is_never_saved_or_registered(
        models, caches, name, tmp_path):
    cache = crafted(models["b"], caches, name)
    kind = type(cache.layers[0]).__name__
    with pytest.raises(UnsupportedError, match=kind):
        cubepack.save_kv_cache(cache, tmp_path / "x.kv.safetensors", producer=models["b"])
    with pytest.raises(UnsupportedError, match=kind):
        cache_layers(cache)
    assert list(tmp_path.iterdir()) == []


def test_a_subclass_of_a_stored_class_is_judged_by_its_class_not_its_name(models, caches):
    """A layer class named like a stored one (a modeling file's own ``DynamicLayer`` subclass
    that keeps more state) is not transformers' class: its content is not only keys/values."""
    renamed = type("DynamicLayer", (cache_utils.DynamicLayer,), {})
    cache = cache_utils.DynamicCache(config=models["b"].config)
    for index, layer in enumerate(caches.layers):
        cache.layers[index] = renamed()
        cache.layers[index].update(layer.keys.clone(), layer.values.clone())
    with pytest.raises(UnsupportedError, match="DynamicLayer"):
        cache_layers(cache)


def test_an_empty_cache_of_stored_layers_is_still_empty(models):
    """What the emptiness rule keeps: MemOS hands an empty DynamicCache when it holds no
    memory; that reaches the model as it is."""
    empty = cache_utils.DynamicCache(config=models["a"].config)
    assert guarded(models["a"])(empty) == ("used", empty)


def test_an_offloaded_cache_is_checked_on_its_content(models):
    """``DynamicCache(offloading=True)`` (4.57's ``OffloadedCache``) moves each layer's tensors
    to the CPU between uses: new tensor objects, the same content. Its producer is found by
    content: B's cache, offloaded, is still B's (used by B, refused for A)."""
    from cubepack.memos._use import register

    own = prefill(models["b"], IDS)
    # Filled layer by layer (a forward with offloading needs an accelerator's streams)
    offloaded = cache_utils.DynamicCache(config=models["b"].config, offloading=True)
    for layer, source in zip(offloaded.layers, own.layers):
        layer.update(source.keys.clone(), source.values.clone())
    register(offloaded, "offloaded", cubepack.fingerprint(models["b"]), {})
    for index, layer in enumerate(offloaded.layers):
        offloaded.offload(index)
        # on an accelerator, offloading makes new CPU tensors: the same content
        layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    assert guarded(models["b"])(offloaded)[0] == "used"
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        guarded(models["a"])(offloaded)


# --- the cache classes: their content is their layers, or they are refused ---------------------

LAYERS_DECIDE = "its layers"  # holds its content in .layers: the layer rule above decides
REFUSED = "refused"  # keeps its content outside .layers: refused as a whole
REMOVED = "removed"  # the class only raises (transformers moved it to the Hub)

#: Each cache class: (how cubepack treats it, the transformers major versions defining it).
CACHES = {
    "Cache": (LAYERS_DECIDE, {4, 5}),
    "DynamicCache": (LAYERS_DECIDE, {4, 5}),
    "OffloadedCache": (LAYERS_DECIDE, {4}),  # DynamicCache(offloading=True)
    "MtpCache": (LAYERS_DECIDE, {5}),  # query offsets only: its keys/values are its layers'
    "DFlashCache": (LAYERS_DECIDE, {5}),
    "StaticCache": (LAYERS_DECIDE, {4, 5}),  # static layers: refused by the layer rule
    "OffloadedStaticCache": (LAYERS_DECIDE, {4}),
    "SlidingWindowCache": (LAYERS_DECIDE, {4, 5}),
    "HybridCache": (LAYERS_DECIDE, {4}),
    "HybridChunkedCache": (LAYERS_DECIDE, {4}),
    "OffloadedHybridCache": (LAYERS_DECIDE, {4}),
    "QuantizedCache": (REFUSED, {4, 5}),  # by its name too: quantized layers
    "QuantoQuantizedCache": (REFUSED, {4}),
    "HQQQuantizedCache": (REFUSED, {4}),
    "EncoderDecoderCache": (REFUSED, {4, 5}),  # two caches inside, no layers of its own
    "SinkCache": (REMOVED, {4}),
}


def swept_caches() -> set[str]:
    return {name for name, value in vars(cache_utils).items()
            if inspect.isclass(value) and value.__module__ == cache_utils.__name__
            and issubclass(value, cache_utils.Cache)}


def test_the_sweep_finds_exactly_the_cache_classes_of_the_table():
    assert swept_caches() == {name for name, (_, majors) in CACHES.items() if MAJOR in majors}


def build_cache_of(name, model):
    """A ``name`` cache holding ``model``'s prefill of IDS: its own forward where it runs here,
    else its layers filled one by one (offloading needs an accelerator's streams), else (a
    quantization backend not installed) the class built around quantized layers."""
    cls = getattr(cache_utils, name)
    params = inspect.signature(cls.__init__).parameters
    options = {key: value for key, value in (("config", model.config), ("max_cache_len", 16),
                                             ("backend", "fp8")) if key in params}
    if name == "Cache":
        options = {"layer_class_to_replicate": cache_utils.DynamicLayer}
    own = prefill(model, IDS)
    try:
        cache = cls(*(cache_utils.DynamicCache(config=model.config) for _ in range(2))) \
            if name == "EncoderDecoderCache" else cls(**options)
    except (ImportError, ValueError):  # optimum-quanto / hqq absent, or no fp8 backend (4.57)
        cache = cls.__new__(cls)
        cache.layers = [build_layer("QuantoQuantizedLayer", layer.keys.clone(),
                                    layer.values.clone()) for layer in own.layers]
        return cache
    if name == "EncoderDecoderCache":
        cache.self_attention_cache = own
        return cache
    try:
        with torch.no_grad():
            model(IDS, past_key_values=cache, use_cache=True)
        return cache
    except AssertionError:  # "Torch not compiled with CUDA enabled": offloading's streams
        layers = cache.layers  # static layers are rewritten in place; dynamic ones afresh
        if len(layers) != len(own.layers) or any(stored_kind(layer) for layer in layers):
            layers = cache.layers = [cache_utils.DynamicLayer() for _ in own.layers]
        for layer, source in zip(layers, own.layers):
            layer.update(source.keys.clone(), source.values.clone(),
                         {"cache_position": torch.arange(IDS.shape[1])})
        return cache


CACHE_NAMES = sorted(name for name, (how, majors) in CACHES.items()
                     if MAJOR in majors and how != REMOVED)


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_every_cache_class_is_checked_on_its_content(models, name):
    """Model B's content, in a cache of each class, never reaches model A; where the layers
    are transformers' dynamic ones, it is B's (registered) and reaches B."""
    from cubepack.memos._use import register

    cache = build_cache_of(name, models["b"])
    with pytest.raises((IdentityMismatch, UnsupportedError)):
        guarded(models["a"])(cache)
    layers = getattr(cache, "layers", None) or []
    if CACHES[name][0] == LAYERS_DECIDE and all(stored_kind(layer) for layer in layers):
        register(cache, name, cubepack.fingerprint(models["b"]), {})
        assert guarded(models["b"])(cache)[0] == "used"
        with pytest.raises(IdentityMismatch, match="weights_digest"):
            guarded(models["a"])(cache)


def test_a_removed_cache_class_cannot_be_made():
    for name in (n for n, (how, majors) in CACHES.items() if how == REMOVED and MAJOR in majors):
        with pytest.raises(NotImplementedError):
            getattr(cache_utils, name)()


def test_through_memos_a_quantized_cache_of_model_b_is_refused_for_model_a(zoo):
    """The same break through MemOS's own call: under install(), ``HFLLM.generate`` of model A
    answered from model B's quantized cache (residual flushed), no error."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from memos.configs.llm import HFLLMConfig
    from memos.llms.hf import HFLLM

    import cubepack.memos as hook

    from memos_live import llm

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        chat, other = (HFLLM(HFLLMConfig.model_validate(llm(zoo[name])["config"]))
                       for name in ("a", "b"))
        foreign = crafted(chat.model, other.build_kv_cache("The user likes green tea."),
                          "QuantoQuantizedLayer")
        with pytest.raises(IdentityMismatch, match="QuantoQuantizedLayer"):
            chat.generate([{"role": "user", "content": "What does the user drink?"}],
                          past_key_values=foreign)
    finally:
        hook.uninstall()
