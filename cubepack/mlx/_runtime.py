"""The MLX side: load a model remembering its folder, build and save prompt caches with their
producer, load one only after it is checked, and recompute in MLX.

MLX is imported inside each function (``cubepack --help``, ``verify`` and the conversions
never need it). An MLX model does not know the folder it was loaded from, so :func:`load`
records it on the model; the identity is then that folder's fingerprint in the dtype the
model's parameters have now (an ``nn.Module.set_dtype`` after loading counts).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.hashing import HashCache
from .._util.safetensors_header import (
    DTYPE_TAGS,
    file_state,
    header_differs,
    open_regular,
    read_header,
)
from ..errors import (
    FormatError,
    IdentityMismatch,
    RecomputationFailed,
    UnsupportedError,
    UsageError,
)
from ..identity._fingerprint import resolve_model_folder
from ..identity._identity import ModelIdentity
from ..kv import _checksum
from ..kv._format import (
    FULL,
    StoredLayer,
    check_kv_info,
    kv_metadata,
    logger,
    producer_runtime,
    read_kv_header,
    structure_problems,
    unchecked_note,
)
from ..kv._recompute import describe, recompute_layers, require_recomputed_here
from ..ops._seam import decrypted_file
from ..trust._policy import TrustPolicy
from ._convert import (
    RUNTIME,
    claimed_header,
    mlx_identity,
    prompt_cache_pieces,
    runtime_record,
)
from ._convert import import_prompt_cache as _import_prompt_cache
from ._layout import CUBEPACK_KEY, read_prompt_cache, write_prompt_cache

#: Where :func:`load` records the folder on a model (a plain attribute, not a parameter).
_FOLDER = "_cubepack_folder"
_MLX_DTYPES = ("float32", "float16", "bfloat16")


def require_mlx() -> None:
    """Raise a precise error where MLX is missing (the conversions themselves do not need it).

    Raises:
        UnsupportedError: ``mlx`` or ``mlx_lm`` is not installed.
    """
    import importlib.util

    missing = [name for name in ("mlx", "mlx_lm") if importlib.util.find_spec(name) is None]
    if missing:
        raise UnsupportedError(f"{' and '.join(missing)} is not installed here; this needs MLX "
                               "(pip install 'mlx[cpu]' mlx-lm on Linux, mlx mlx-lm on macOS).")


def load(path_or_hf_repo: str | os.PathLike[str], *, revision: str | None = None,
         dtype: str | None = None) -> tuple[Any, Any]:
    """``mlx_lm.load`` of a model folder (or a Hub id in the HF cache), in ``dtype`` when given,
    with the folder recorded on the model for :func:`model_identity`."""
    require_mlx()
    import mlx.core as mx
    from mlx_lm import load as mlx_load

    folder, _, _ = resolve_model_folder(str(path_or_hf_repo), revision)
    model, tokenizer = mlx_load(str(folder))
    if dtype is not None:
        if dtype not in _MLX_DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(_MLX_DTYPES)}, not {dtype!r}.")
        model.set_dtype(getattr(mx, dtype))
    object.__setattr__(model, _FOLDER, str(folder))
    return model, tokenizer


def model_dtype(model: Any) -> str:
    """The one floating dtype an MLX model's parameters have: the dtype it runs in.

    Raises:
        UsageError: no floating parameter, or several dtypes (a bfloat16 model with a float32
            embedding computes float32 caches from bfloat16 weights: neither name is its
            dtype, and a float32 identity would pass it off as the float32 model).
    """
    return _one_dtype(_parameter_kinds(model)[0])


def _one_dtype(floating: set[str]) -> str:
    if not floating:
        raise UsageError("This MLX model has no floating-point parameters to take a dtype from.")
    if len(floating) > 1:
        found = sorted(floating)
        raise UsageError(f"This MLX model's parameters mix {' and '.join(found)}, so no one "
                         "dtype names what it computes. Cast it whole to one "
                         f"(model.set_dtype(mx.{found[0]})), or load it with "
                         f"cubepack.mlx.load(folder, dtype='{found[0]}').")
    return floating.pop()


def _parameter_kinds(model: Any) -> tuple[set[str], bool]:
    """(the floating dtypes of the parameters, whether any module is quantized), walking the
    parameters as ``Module.parameters`` does (a module's entries not named ``_...``; a plain
    dict's or list's all) without building that tree (every checked load asks)."""
    import mlx.core as mx
    from mlx import nn

    dtypes, quantized = set(), False
    pending = [model]
    pop, push = pending.pop, pending.append  # a tight loop: 3x the speed of the plain one
    while pending:
        node = pop()
        if type(node) is mx.array:
            dtypes.add(node.dtype)
        elif isinstance(node, nn.Module):
            quantized = quantized or "scales" in node  # QuantizedLinear, QuantizedEmbedding, ...
            for key, value in node.items():
                if key[:1] != "_":
                    push(value)
        elif isinstance(node, dict):
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    names = {str(dtype).removeprefix("mlx.core.") for dtype in dtypes}
    return {name for name in names if name in _MLX_DTYPES}, quantized


def _quantized_in_folder(folder: Path) -> bool:
    """Whether the folder's config declares quantized weights (mlx_lm's ``quantization``)."""
    try:
        config = canonical.loads_strict((folder / constants.MODEL_CONFIG).read_bytes())
    except (OSError, ValueError):
        return False  # the fingerprint refuses an unreadable config; nothing declared here
    return isinstance(config, dict) and bool(
        config.get("quantization") or config.get("quantization_config"))


#: The quantized modules of a folder's weights, reused while no file in it changed.
_FOLDER_SCALES: dict[tuple, dict[str, tuple[int, ...]]] = {}


def _folder_scales(folder: Path) -> dict[str, tuple[int, ...]]:
    """{module path: its ``scales`` shape} in the folder's safetensors (headers only)."""
    files = sorted(entry for entry in folder.iterdir() if entry.name.endswith(".safetensors"))
    key = (str(folder.resolve()), tuple((f.name, HashCache.key(f)) for f in files))
    if key not in _FOLDER_SCALES:
        _FOLDER_SCALES.clear()
        _FOLDER_SCALES[key] = {
            name.removesuffix(".scales"): tensor.shape for f in files
            for name, tensor in read_header(f, aligned=False).tensors.items()
            if name.endswith(".scales")}
    return _FOLDER_SCALES[key]


def _require_folder_quantization(model: Any, folder: Path) -> None:
    """The live model's quantized modules (and their scales' shapes: bits, group size) are
    the folder's: quantizing or dequantizing after loading changes what the model computes
    but not the folder's fingerprint."""
    from mlx import nn

    stored = _folder_scales(folder)
    live = {name: tuple(module["scales"].shape) for name, module in model.named_modules()
            if isinstance(module, nn.Module) and "scales" in module}
    if live == stored:
        return
    first = sorted(set(live) ^ set(stored)) or sorted(n for n in live if live[n] != stored[n])
    name = first[0]
    raise UsageError(
        f"This MLX model's quantization is not its folder's ({name or 'the model'}: the folder "
        f"has {_scales(stored.get(name))}, the model {_scales(live.get(name))}): it was "
        f"quantized or dequantized after loading, so {folder}'s fingerprint is not its "
        "identity. Save it (mlx_lm.convert with -q, or save_weights with its config) and load "
        "that folder.")


def _scales(shape: tuple[int, ...] | None) -> str:
    return "no quantization" if shape is None else f"scales of shape {list(shape)}"


def model_identity(model: Any, folder: str | os.PathLike[str] | None = None) -> ModelIdentity:
    """The identity of a live MLX model: the fingerprint of the folder it was loaded from
    (recorded by :func:`load`, or given), in the dtype it runs in now.

    Raises:
        UsageError: a model not loaded by :func:`load` and no ``folder`` given, or a ``folder``
            other than the one :func:`load` recorded.
    """
    recorded = getattr(model, _FOLDER, None)
    if folder is not None and recorded is not None and \
            resolve_model_folder(str(folder))[0].resolve() != Path(recorded).resolve():
        raise UsageError(f"This MLX model was loaded from {recorded}, not {folder}: its identity "
                         "is the folder it was loaded from. Drop folder=, or load that folder.")
    folder = folder or recorded
    if folder is None:
        raise UsageError("cubepack cannot tell which files this MLX model was loaded from: load "
                         "it with cubepack.mlx.load(folder), or pass folder=.")
    floating, quantized = _parameter_kinds(model)
    dtype = _one_dtype(floating)
    local = resolve_model_folder(str(folder))[0]
    if quantized or _quantized_in_folder(local):
        _require_folder_quantization(model, local)
    return mlx_identity(folder, dtype)


def _live(model: Any, folder: Any) -> tuple[Any, ModelIdentity]:
    """(the MLX model, its identity): ``model`` loaded, or a folder / Hub id to load."""
    if isinstance(model, (str, os.PathLike)):
        model, _ = load(model)
    return model, model_identity(model, folder)


# --- tensors between MLX and torch --------------------------------------------------------------

def to_torch(array: Any) -> Any:
    """An MLX array as a torch tensor (bfloat16 through its bits: numpy has no bfloat16)."""
    import mlx.core as mx
    import numpy
    import torch

    if array.dtype == mx.bfloat16:
        return torch.from_numpy(numpy.array(array.view(mx.uint16))).view(torch.bfloat16)
    return torch.from_numpy(numpy.array(array))


def to_mlx(tensor: Any) -> Any:
    """A torch tensor as an MLX array (bfloat16 through its bits)."""
    import mlx.core as mx
    import torch

    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return mx.array(tensor.view(torch.int16).numpy()).view(mx.bfloat16)
    return mx.array(tensor.numpy())


def kv_caches(layers: list[tuple[Any, Any, int]]) -> list[Any]:
    """mlx_lm ``KVCache`` objects holding (keys, values, offset) per layer."""
    from mlx_lm.models.cache import KVCache

    caches = []
    for keys, values, offset in layers:
        cache = KVCache()
        cache.state = (keys, values, offset)
        caches.append(cache)
    return caches


#: id(model) -> (a weak reference to the model, its parameter arrays when copied, its float32
#: copy): one model at a time, dropped with the model (a strong reference kept the last model
#: and its copy alive for the whole process).
_REFERENCES: dict[int, tuple[Any, tuple, Any]] = {}


def _parameter_arrays(model: Any) -> tuple:
    """The model's parameter arrays, by name. MLX arrays are immutable: a weight changes by
    replacing its array (``module.weight = ...``, ``update``, ``set_dtype``), so the same
    array objects mean the same weights. Held while the copy is, so their ids cannot be reused."""
    from mlx.utils import tree_flatten

    return tuple(tree_flatten(model.parameters()))


def _forget(key: int, model: Any) -> None:
    """Drop a dead model's float32 copy (unless the key was taken by a later model)."""
    kept = _REFERENCES.get(key)
    if kept is not None and kept[0] is model:
        del _REFERENCES[key]


class MLXRuntime:
    """:class:`cubepack.kv._recompute.TorchRuntime`'s counterpart for an MLX model: the same
    checks, with MLX computing the prefill and the probe logits."""

    name = RUNTIME

    def __init__(self, model: Any):
        self.model = model

    @property
    def vocab_size(self) -> int:
        return int(self.model.args.vocab_size)

    def prefill(self, ids: list[int]) -> tuple[list[tuple], Any]:
        """(layers, ``[1, vocab]`` float32 logits of the last position)."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        logits = self.model(mx.array([ids]), cache=cache)[:, -1].astype(mx.float32)
        mx.eval(logits)
        return ([(FULL, layer.offset, to_torch(layer.keys[..., :layer.offset, :]),
                  to_torch(layer.values[..., :layer.offset, :])) for layer in cache],
                to_torch(logits))

    def prefill_layers(self, ids: list[int]) -> list[tuple]:
        return self.prefill(ids)[0]

    def reference(self) -> "MLXRuntime | None":
        """This model in float32, the reference the dtype's noise is measured against (None
        when it already computes in float32): a copy made once per model, made again once a
        weight changed (a stale copy would measure the old and new weights' difference as
        the dtype's noise)."""
        import copy
        import weakref

        import mlx.core as mx

        arrays = _parameter_arrays(self.model)
        if next(value.dtype for _, value in arrays) == mx.float32:
            return None
        kept = _REFERENCES.get(id(self.model))
        if kept is None or kept[0]() is not self.model or len(kept[1]) != len(arrays) or any(
                name != was or value is not held
                for (name, value), (was, held) in zip(arrays, kept[1])):
            _REFERENCES.clear()  # one model at a time: a float32 copy is large
            reference = copy.deepcopy(self.model)
            reference.set_dtype(mx.float32)
            kept = (weakref.ref(self.model), arrays, reference)
            _REFERENCES[id(self.model)] = kept
            weakref.finalize(self.model, _forget, id(self.model), kept[0])
        return MLXRuntime(kept[2])

    def probe_logits(self, layers: list[tuple], probes: list[int], batch: int) -> Any:
        import mlx.core as mx

        cache = kv_caches([(to_mlx(keys), to_mlx(values), int(keys.shape[-2]))
                           for _, _, keys, values in layers])
        logits = self.model(mx.array([probes] * batch), cache=cache).astype(mx.float32)
        return to_torch(logits).flatten(0, 1)


# --- prompt caches with their producer ------------------------------------------------------------

def prefill(model: Any, input_ids: Any) -> list[Any]:
    """The prompt cache (``KVCache`` per layer) ``model`` builds for ``input_ids``."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([ids]), cache=cache))
    return cache


def save_prompt_cache(path: str | os.PathLike[str], cache: list[Any], model: Any, *,
                      token_ids: Any = None, metadata: dict[str, Any] | None = None,
                      folder: str | os.PathLike[str] | None = None) -> Path:
    """Write an MLX prompt cache in mlx_lm's own format (its ``load_prompt_cache`` reads it)
    carrying its producer, ``model``'s identity, and the runtime (``mlx-lm X.Y``), atomically.

    Raises:
        IdentityMismatch: the cache's shapes contradict the model.
        UnsupportedError: a layer other than ``KVCache`` (via the format's reader).
    """
    import mlx.core as mx
    import numpy

    identity = model_identity(model, folder)
    offsets = sorted({layer.offset for layer in cache})
    if len(offsets) != 1 or type(cache[0]).__name__ != "KVCache":
        raise UsageError("A prompt cache to save is one sequence of KVCache layers.")
    used = [(layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :])
            for layer in cache]
    dtype = str(used[0][0].dtype).removeprefix("mlx.core.")
    problems = structure_problems([StoredLayer(FULL, offsets[0], tuple(k.shape), tuple(v.shape),
                                               dtype, str(v.dtype).removeprefix("mlx.core."))
                                   for k, v in used], identity)
    if problems:
        raise IdentityMismatch("This prompt cache", problems).about(
            "This prompt cache", "It was not built by this model; save it with the model that "
                                 "built it.")
    ids = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    item = {"runtime": runtime_record(), **(metadata or {})}

    def raw_bytes(array: Any) -> Any:
        bits = array.view(mx.uint16) if array.dtype in (mx.bfloat16, mx.float16) else array
        return numpy.ascontiguousarray(numpy.array(bits)).reshape(-1).view(numpy.uint8)

    layers = [(raw_bytes(k), raw_bytes(v), tuple(k.shape)) for k, v in used]
    checksums = _checksum.compute({f"layers.{i}.{part}": [data]  # the bytes written
                                   for i, (keys, values, _) in enumerate(layers)
                                   for part, data in (("keys", keys), ("values", values))})
    raw = kv_metadata(identity, [{"type": FULL, "cumulative_length": offsets[0]}] * len(cache),
                      None if ids is None else [int(t) for t in ids], item,
                      checksums=checksums)
    return write_prompt_cache(path, layers, DTYPE_TAGS[dtype], offsets[0],
                              {CUBEPACK_KEY: raw, "model": identity.model_id or ""})


def load_prompt_cache(path: str | os.PathLike[str], model: Any,
                      policy: TrustPolicy | None = None, *,
                      folder: str | os.PathLike[str] | None = None,
                      return_metadata: bool = False,
                      decrypt_with: str | os.PathLike[str] | None = None,
                      **options: Any) -> Any:
    """Load a prompt cache (written by ``cubepack export mlx`` or :func:`save_prompt_cache`)
    or a cubepack KV file into mlx_lm ``KVCache`` objects for ``model``, refusing any other
    producer before MLX reads a tensor.

    A cache another runtime computed (transformers: the header records no MLX runtime) is
    accepted only once ``model``'s own MLX prefill reproduces it, tensors and probe logits,
    within the recomputation bounds.

    Args:
        model: an MLX model loaded by :func:`load` (or with ``folder=``), or a folder to load.
        policy: a :class:`~cubepack.trust.TrustPolicy` (or its fields as ``options``), honoured
            whole: ``recompute`` proves the cache with ``model``'s MLX prefill
            (``recompute_tokens``, ``seed``: a sample); what a cube carries (a signature,
            lineage, pins) is a UsageError: verify the cube first.
        return_metadata: also return the prompt cache's user metadata (as mlx_lm does).
        decrypt_with: an identity file for an age-encrypted file (a private cube's KV file):
            decrypted into an anonymous memory file (Linux ``memfd``) that MLX reads; never
            written to a disk (elsewhere: refused, UnsupportedError).

    Raises:
        IdentityMismatch: another producer (every differing field named).
        RecomputationFailed: another runtime's cache that MLX does not reproduce, or that
            records no token ids.
        FormatError: a malformed file, or a prompt cache that records no producer.
    """
    if decrypt_with is not None:
        with decrypted_file(path, decrypt_with) as clear:
            return load_prompt_cache(clear, model, policy, folder=folder,
                                     return_metadata=return_metadata, **options)
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("the MLX load")
    require_mlx()
    import mlx.core as mx

    model, live = _live(model, folder)
    path = Path(path)
    with open_regular(path) as handle:  # held until the arrays are evaluated
        state = file_state(handle.fileno())
        header = read_header(path, aligned=False)  # which layout: each reader then checks it
        if constants.KV_METADATA_KEY in header.metadata:  # a cubepack KV file
            info = check_kv_info(read_kv_header(path), live)
            names = [(f"layers.{i}.keys", f"layers.{i}.values") for i in range(info.num_layers)]
            user: dict[str, str] = {}
            pieces = _checksum.kv_file_pieces(info.header, info.tensor_names)
        else:
            prompt_cache = read_prompt_cache(path, header)
            info = claimed_header(prompt_cache)
            if info is None:
                raise FormatError(
                    f"{path.name} is an MLX-LM prompt cache that records no producer (mlx_lm "
                    "writes a model name only), so cubepack cannot check it. Convert it with its "
                    f"producer first: cubepack import mlx {shlex.quote(str(path))} --model "
                    "MODEL, then load the KV file.")
            check_kv_info(info, live)
            names = [(f"{i}.0", f"{i}.1") for i in range(info.num_layers)]
            user = {k: v for k, v in prompt_cache.metadata.items() if k != CUBEPACK_KEY}
            pieces = prompt_cache_pieces(prompt_cache)
        sliding = [i for i, layer in enumerate(info.layers) if layer.type != FULL]
        if sliding:  # MLX keeps those in a RotatingKVCache; a KVCache would misplace them
            raise UnsupportedError(f"{path.name}: layer {sliding[0]} is a sliding-window "
                                   "layer; cubepack loads full-attention caches into MLX only.")
        # Checked: only now does MLX read the tensors, as safetensors (else MLX picks its parser
        # by the suffix: .npz, .gguf, none), from the file this process opened (not the path
        # again: a symlink or a rename can swap it), when they are evaluated, not at mx.load:
        # so evaluate them now, then require the open file unchanged and holding the header
        # checked: no later evaluation brings in bytes nobody checked.
        arrays = mx.load(_name_of(handle), format="safetensors")
        offset = info.token_count
        layers = [(arrays[k][..., :offset, :], arrays[v][..., :offset, :], offset)
                  for k, v in names]
        mx.eval([array for keys, values, _ in layers for array in (keys, values)])
        # The header the checks used, read by path (a symlink may have pointed elsewhere for
        # a moment), must be the open file's, and every layer must hold the positions claimed.
        descriptor = handle.fileno()
        differed = "it was written" if file_state(descriptor) != state else header_differs(
            descriptor, info.header, str(path))
        short = [i for i, (keys, values, _) in enumerate(layers)
                 if keys.shape[-2] != offset or values.shape[-2] != offset]
        if differed or short:
            raise FormatError(f"{path} changed while cubepack loaded it "
                              f"({differed or f'layer {short[0]} holds fewer positions'}); "
                              "nothing was loaded: load it again once nothing writes it.")
        # Unchanged since MLX read it: the open file's bytes (mapped, hashed on the pool) are
        # the ones MLX holds, and must be the ones the header records.
        _checksum.verify_descriptor(path, descriptor, info.checksums, pieces)
        note = unchecked_note(info, None if constants.KV_METADATA_KEY in header.metadata else
                              "export it again from its KV file, upgraded")
    if note:
        logger.warning("cubepack: %s", note)
    stored = None
    plan = policy.recomputation()
    if producer_runtime(info.metadata) != RUNTIME or plan.asked:
        stored = [(FULL, offset, to_torch(k), to_torch(v)) for k, v, _ in layers]
    proved = require_recomputed_here(MLXRuntime(model), info, stored, always=plan.asked,
                                     sample=plan.sample, seed=plan.seed)
    if proved is not None:  # MLX's own prefill: the stored tensors were only a claim
        layers = [(to_mlx(keys), to_mlx(values), offset)
                  for _, offset, keys, values in proved.layers]
    caches = kv_caches(layers)
    return (caches, user) if return_metadata else caches


def _name_of(handle: Any) -> Any:
    """A name that opens the file ``handle`` has open (``/proc/self/fd/N``, ``/dev/fd/N``),
    whatever happened to its path since; else the file object (MLX reads one, ~3x slower)."""
    descriptor = handle.fileno()
    for folder in ("/proc/self/fd", "/dev/fd"):
        alias = f"{folder}/{descriptor}"
        try:
            if os.path.samestat(os.stat(alias), os.fstat(descriptor)):
                return alias
        except OSError:
            continue
    return handle


def import_prompt_cache(path: str | os.PathLike[str], model: str | os.PathLike[str], *,
                        out: str | os.PathLike[str] | None = None, token_ids: Any = None,
                        revision: str | None = None, metadata: dict[str, Any] | None = None,
                        recompute: bool = False) -> Path:
    """Convert an MLX-LM prompt cache into a KV file (see
    :func:`cubepack.mlx._convert.import_prompt_cache`); with ``recompute``, MLX first runs
    ``model`` (the folder) on the token ids and must reproduce the cache (every position,
    tensors and probe logits), which proves ``model`` made it rather than naming it.

    Raises:
        RecomputationFailed: ``recompute`` and the model does not reproduce the cache, or no
            token ids are known.
    """
    proof = None
    if recompute:
        def proof(layers: list[tuple], ids: list[int] | None, kv_dtype: str) -> None:
            live, _ = load(model, revision=revision, dtype=kv_dtype)
            if not ids:
                raise RecomputationFailed(f"{Path(path).name} records no token ids, so it "
                                          "cannot be recomputed; pass them (--token-ids).")
            result = recompute_layers(None, layers, kv_dtype, ids, Path(path).name,
                                      runtime=MLXRuntime(live))
            if not result.ok:
                raise RecomputationFailed(f"{Path(path).name} is not this model's: it "
                                          f"{describe(result)}. Pass the model that made it.")
    return _import_prompt_cache(path, model, out=out, token_ids=token_ids, revision=revision,
                                metadata=metadata, proof=proof)
