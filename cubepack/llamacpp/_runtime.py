"""The llama.cpp side (llama-cpp-python): load a GGUF, save a context's state as a pinned KV
file, load one only after it is checked, and recompute in llama.cpp.

``llama_cpp`` is imported inside each function (``cubepack --help``, ``verify`` and the
conversions never need it). A ``Llama`` knows the GGUF it was loaded from (``model_path``):
that file's sha256 is what a state is pinned to.
"""

from __future__ import annotations

import ctypes
import os
import random
import secrets
import struct
import tempfile
from pathlib import Path
from typing import Any

from ..errors import (
    FormatError,
    RecomputationFailed,
    UnsupportedError,
    UsageError,
)
from ..format._provenance import RECOMPUTED, RECORDED
from ..identity._fingerprint import fingerprint, resolve_model_folder
from ..identity._identity import ModelIdentity, require_same
from ..kv._format import read_kv_header
from ..kv._recompute import (
    LOGIT_BOUND,
    PROBES,
    TOLERANCE,
    _Comparison,
    compare_layer_wide,
    describe,
    load_model,
    recompute_layers,
)
from ..kv._torch import mapped_layers
from ._convert import (
    RUNTIME,
    described_pin,
    layers_session,
    pin_path,
    require_gguf,
    session_layers,
    state_bytes,
)
from ._convert import import_state as _import_state
from ._layout import GGML_IDS, MAGIC, read_session

_KV_DTYPES = ("float32", "float16")


def require_llama_cpp() -> None:
    """Raise a precise error where llama-cpp-python is missing.

    Raises:
        UnsupportedError: ``llama_cpp`` is not importable.
    """
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise UnsupportedError("llama_cpp is not installed here; this needs llama-cpp-python "
                               "(built from source: make test-llamacpp builds it).")


def load(gguf: str | os.PathLike[str], *, kv_dtype: str = "float32", n_ctx: int = 512,
         flash_attn: bool = False, **kwargs: Any) -> Any:
    """``llama_cpp.Llama`` of ``gguf`` on CPU with a ``kv_dtype`` cache (f32 or f16), quiet,
    keeping every position's logits (``logits_all``: the probe checks read them)."""
    require_llama_cpp()
    from llama_cpp import Llama

    if kv_dtype not in _KV_DTYPES:
        raise UsageError(f"kv_dtype must be one of {', '.join(_KV_DTYPES)}, not {kv_dtype!r}.")
    ggml = GGML_IDS[kv_dtype][0]
    kwargs.setdefault("logits_all", True)
    return Llama(model_path=str(gguf), n_ctx=n_ctx, flash_attn=flash_attn, type_k=ggml,
                 type_v=ggml, verbose=False, seed=0, **kwargs)


def _v_trans(llm: Any) -> bool:
    import llama_cpp

    return llm.context_params.flash_attn_type != llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED


def session_of(llm: Any) -> bytes:
    """The context's state as llama.cpp session file bytes (``llama_state_save_file``)."""
    import llama_cpp

    tokens = [int(t) for t in llm.input_ids[:llm.n_tokens]]
    with tempfile.TemporaryDirectory(prefix="cubepack-llamacpp-") as folder:
        path = Path(folder) / "state.bin"
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        if not llama_cpp.llama_state_save_file(llm.ctx, str(path).encode(), array, len(tokens)):
            raise UnsupportedError("llama.cpp could not save this context's state.")
        return path.read_bytes()


def save_state(llm: Any, path: str | os.PathLike[str], model: str | os.PathLike[str], *,
               revision: str | None = None, metadata: dict[str, Any] | None = None,
               recompute: bool = False, seed: int | None = None) -> Path:
    """Save ``llm``'s state (its evaluated tokens' KV cache) as a KV file pinned to its GGUF
    and to ``model``, the Hugging Face folder the GGUF was converted from (a claim unless
    ``recompute``: then transformers must reproduce it from that folder)."""
    with tempfile.TemporaryDirectory(prefix="cubepack-llamacpp-") as folder:
        session = Path(folder) / "state.bin"
        session.write_bytes(session_of(llm))
        return import_state(session, llm.model_path, model, out=path, revision=revision,
                            metadata=metadata, recompute=recompute, seed=seed)


def import_state(path: str | os.PathLike[str], gguf: str | os.PathLike[str],
                 model: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None,
                 revision: str | None = None, metadata: dict[str, Any] | None = None,
                 recompute: bool = False, seed: int | None = None) -> Path:
    """Convert a llama.cpp session file into a KV file (see
    :func:`cubepack.llamacpp._convert.import_state`); with ``recompute``, transformers first
    runs ``model`` (the folder) on the state's tokens and must reproduce it (every position,
    tensors and probe logits, within the recomputation bounds of the cache's dtype), which
    proves the GGUF computes what ``model`` computes rather than naming it. ``seed``: the
    probe tokens' seed (default: drawn at random by this process), to repeat a check.

    Raises:
        RecomputationFailed: ``recompute`` and the model does not reproduce the state.
    """
    proof = None
    if recompute:
        def proof(layers: list[tuple], ids: list[int], kv_dtype: str, identity: Any) -> str:
            folder, _, _ = resolve_model_folder(str(model), revision)
            live = load_model(folder, kv_dtype)
            result = recompute_layers(live, layers, kv_dtype, ids, Path(path).name, seed=seed)
            if not result.ok:
                raise RecomputationFailed(f"{Path(path).name} is not this model's: it "
                                          f"{describe(result)}. Pass the Hugging Face folder "
                                          "the GGUF was converted from.")
            # `recomputed` only for the prefill bit for bit (never, in practice, across two
            # runtimes): within the bound, stored tensors can still steer an answer
            # (docs/explanation/proof-bound.md), so the label is `recorded`, proved.
            return {"kind": RECOMPUTED if result.identical else RECORDED,
                    "detail": f"transformers {describe(result)}"}
    return _import_state(path, gguf, model, out=out, revision=revision, metadata=metadata,
                         proof=proof)


def load_state(llm: Any, path: str | os.PathLike[str], *,
               model: str | os.PathLike[str] | None = None,
               seed: int | None = None) -> dict[str, Any]:
    """Load a KV file (pinned by ``cubepack import llamacpp`` / :func:`save_state`, or a
    transformers cache) or a session file with its pin (``cubepack export llamacpp``) into
    ``llm``, refusing another GGUF or model before llama.cpp sees the state.

    - a state llama.cpp computed must pin ``llm``'s GGUF (sha256);
    - a cache another runtime computed (transformers) is accepted only once ``llm`` reproduces
      it: llama.cpp prefills its tokens and the tensors and probe logits must agree within the
      recomputation bounds (this also proves the GGUF computes what the producer computed),
      and the context then holds llama.cpp's own prefill of the cache's ids, not the stored
      tensors (a tolerance on tensors does not bind an answer: docs/explanation/proof-bound.md);
    - ``model``: also require the producer to be this Hugging Face folder;
    - ``seed``: the probe tokens' seed for that recomputation (default: drawn at random).

    Returns what was checked (``{"gguf": ..., "recomputed": ...}``).

    Raises:
        IdentityMismatch: another GGUF, or another producer than ``model``.
        RecomputationFailed: another runtime's cache llama.cpp does not reproduce.
        FormatError: a malformed file, or a session file without its pin.
    """
    require_llama_cpp()
    path = Path(path)
    with open(path, "rb") as handle:
        head = handle.read(4)
    if len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC:
        return _load_pinned_session(llm, path, model)
    info = read_kv_header(path)  # a KV file, or FormatError
    if model is not None:
        _require_producer(info.producer.to_dict(), model, f"KV cache {path.name}")
    checked: dict[str, Any] = {"gguf": None, "recomputed": None}
    if str(info.metadata.get("runtime", "")).split()[:1] == [RUNTIME]:
        require_gguf(info.metadata.get("gguf"), llm.model_path, f"KV cache {path.name}")
        checked["gguf"] = info.metadata["gguf"]["sha256"]
    else:
        checked["recomputed"] = _require_reproduced(llm, info, mapped_layers(info), seed)
        # The context gets llama.cpp's own prefill of the ids, never the stored tensors: inside
        # the tolerance an attacker can still steer an answer (docs/explanation/proof-bound.md).
        llm.reset()
        llm.eval(list(info.token_ids))
        return checked
    data, _ = state_bytes(path, v_trans=_v_trans(llm))
    _set_state(llm, data)
    return checked


def _load_pinned_session(llm: Any, path: Path, model: Any) -> dict[str, Any]:
    what = f"llama.cpp state {path.name}"
    data = path.read_bytes()
    pin = described_pin(path, data)
    if pin is None:
        raise FormatError(f"{what} has no pin ({pin_path(path).name}): llama.cpp records no "
                          "model in it, so cubepack cannot check it. Convert it with its GGUF "
                          f"and model first: cubepack import llamacpp {path} --gguf GGUF "
                          "--model MODEL")
    require_gguf(pin.get("gguf"), llm.model_path, what)
    if model is not None:
        _require_producer(pin.get("producer") or {}, model, what)
    read_session(path)  # a layout cubepack reads (one sequence, f32/f16)
    _set_state(llm, data)
    return {"gguf": pin["gguf"]["sha256"], "recomputed": None}


def _require_producer(producer: dict[str, Any], model: Any, what: str) -> None:
    claimed = ModelIdentity.from_dict(producer)
    require_same(claimed, fingerprint(model, dtype=claimed.dtype), what)


def _set_state(llm: Any, session: bytes) -> None:
    """Give ``llm`` a session file's state (the bytes after the token list) and its tokens."""
    import llama_cpp

    n_tokens = struct.unpack_from("<I", session, 8)[0]
    tokens = list(struct.unpack_from(f"<{n_tokens}i", session, 12))
    if n_tokens > llm.n_ctx():
        raise UsageError(f"The state holds {n_tokens} tokens; this context holds {llm.n_ctx()}.")
    state = session[12 + 4 * n_tokens:]
    buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    llm.reset()
    if llama_cpp.llama_state_set_data(llm.ctx, buffer, len(state)) != len(state):
        raise FormatError("llama.cpp refused the state (its log says why: another layer count, "
                          "cache type or V transposition than this context's).")
    llm.input_ids[:n_tokens] = tokens
    llm.n_tokens = n_tokens


class LlamaCppRuntime:
    """:class:`cubepack.kv._recompute.TorchRuntime`'s counterpart for a ``llama_cpp.Llama``
    (the same three things: ``vocab_size``, ``prefill_layers``, ``probe_logits``): llama.cpp
    computes the prefill and the probe logits; layers are in transformers' layout, converted
    as :func:`import_state` converts them."""

    name = RUNTIME

    def __init__(self, llm: Any, identity: ModelIdentity):
        self.llm, self.identity = llm, identity

    @property
    def vocab_size(self) -> int:
        return int(self.llm.n_vocab())

    def prefill_layers(self, ids: list[int]) -> list[tuple]:
        self.llm.reset()
        self.llm.eval(ids)
        with tempfile.TemporaryDirectory(prefix="cubepack-llamacpp-") as folder:
            session = Path(folder) / "state.bin"
            session.write_bytes(session_of(self.llm))
            return session_layers(read_session(session), self.identity)

    def probe_logits(self, layers: list[tuple], probes: list[int], batch: int = 1) -> Any:
        """float32 logits, ``[len(probes), vocab]``, of ``probes`` fed after ``layers`` (one
        sequence: a llama.cpp state holds one)."""
        import torch

        if batch != 1:
            raise UnsupportedError("A llama.cpp state holds one sequence, not a batch.")
        cells = int(layers[0][2].shape[-2])
        _set_state(self.llm, layers_session(layers, [0] * cells, v_trans=_v_trans(self.llm)))
        rows = []
        for token in probes:
            self.llm.eval([token])
            rows.append(torch.tensor(self.llm.scores[self.llm.n_tokens - 1], dtype=torch.float32))
        return torch.stack(rows)


def _require_reproduced(llm: Any, info: Any, stored: list[tuple], seed: int | None) -> str:
    """llama.cpp's own prefill of the cache's tokens must match it (every position, within the
    dtype's tensor tolerance) and so must the next-token logits of random probe tokens, top-1
    included unless the recomputed logits tie the two tokens within the bound (the rule of
    :mod:`cubepack.kv._recompute`)."""
    what = f"KV cache {info.path.name}"
    made_by = str(info.metadata.get("runtime") or "transformers").split()[0]
    if not info.token_ids:
        raise RecomputationFailed(f"{what} was computed by {made_by} and is being loaded into "
                                  "llama.cpp: it is accepted only once llama.cpp reproduces it, "
                                  "but it records no token ids.")
    if info.kv_dtype not in _KV_DTYPES:
        raise RecomputationFailed(f"{what} is a {info.kv_dtype} cache; llama.cpp here runs f32 "
                                  "or f16 caches.")
    runtime = LlamaCppRuntime(llm, info.producer)
    tolerance = TOLERANCE[info.kv_dtype]
    fresh = runtime.prefill_layers(list(info.token_ids))
    comparison = _Comparison()
    for index, (new, old) in enumerate(zip(fresh, stored)):
        compare_layer_wide(index, new, old, tolerance, comparison)
    if comparison.first is not None or len(fresh) != len(stored):
        raise RecomputationFailed(
            f"{what} was computed by {made_by}; llama.cpp, loading it, computes something else: "
            f"it differs at layer {(comparison.first or {}).get('layer')}, position "
            f"{(comparison.first or {}).get('position')} (max relative error "
            f"{comparison.max_rel:.3g} > tolerance {tolerance:g}). Load it into the model that "
            "made it, or recompute it here.")
    rng = random.Random(secrets.randbits(32) if seed is None else seed)
    probes = [rng.randrange(runtime.vocab_size) for _ in range(PROBES)]
    fresh_logits = runtime.probe_logits(fresh, probes)
    stored_logits = runtime.probe_logits(stored, probes)
    scale = max(fresh_logits.abs().max().item(), 1e-12)
    gap = float((stored_logits - fresh_logits).abs().max().item() / scale)
    bound = LOGIT_BOUND[info.kv_dtype]
    top_stored, top_fresh = stored_logits.argmax(-1), fresh_logits.argmax(-1)
    tie = (fresh_logits.gather(-1, top_fresh[:, None]) -
           fresh_logits.gather(-1, top_stored[:, None]))[:, 0] / scale <= bound
    flipped = bool(((top_stored != top_fresh) & ~tie).any())
    if gap > bound or flipped:
        raise RecomputationFailed(f"{what}: llama.cpp reproduces its tensors but not their "
                                  f"behaviour: probe logits differ by {gap:.3g} (bound {bound:g})"
                                  + (", top token flipped" if flipped else "") + ".")
    return (f"llama.cpp recomputed all {info.token_count} positions: max relative error "
            f"{comparison.max_rel:.3g} (tolerance {tolerance:g}); next-token logits of "
            f"{len(probes)} probes within {gap:.3g} (bound {bound:g})")
