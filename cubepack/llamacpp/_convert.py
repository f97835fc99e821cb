"""llama.cpp session files to cubepack KV files and back, without llama.cpp (torch moves the
bytes).

- :func:`import_state`: a session file (``llama_state_save_file``) becomes a KV file in
  transformers' layout: ``[1, kv_heads, tokens, head_dim]`` per layer, the keys' head
  dimension put back in Hugging Face order (llama.cpp's converter permutes the q/k rows of a
  llama model for its interleaved RoPE, so its cached keys are the same numbers in another
  order), the values untransposed. Its producer is the fingerprint of the Hugging Face folder
  the GGUF was converted from, in the cache's dtype; the GGUF itself is pinned by its sha256.
- :func:`export_state`: a KV file becomes a session file that ``llama_state_load_file`` reads,
  with a pin beside it (``<file>.cubepack.json``: the GGUF digest, the producer, the session's
  digest) that :func:`cubepack.llamacpp.load_state` checks before llama.cpp sees the state.

Neither runs a model.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.hashing import hash_files, sha256_file, shared_cache
from ..errors import FormatError, IdentityMismatch, Mismatch, UnsupportedError
from ..format._provenance import ASSERTED
from ..identity._fingerprint import fingerprint, installed_versions
from ..identity._identity import ModelIdentity, require_same
from ..kinds.activations._shards import memory_file
from ..kv._format import FULL, read_kv_header, require_checksums
from ..kv._torch import mapped_layers, write_kv_layers
from ._layout import SessionInfo, read_session, session_bytes

#: The runtime's name, as a KV header's ``runtime`` record starts.
RUNTIME = "llama.cpp"
#: Architectures whose converter permutes the key rows (``LlamaModel.permute`` in
#: ``convert_hf_to_gguf.py``): cubepack converts these only.
PERMUTED_ARCHS = ("llama",)
PIN_SUFFIX = ".cubepack.json"
PIN_FORMAT = "cubepack-llamacpp-pin"


def runtime_record() -> str:
    """``llama.cpp (llama-cpp-python X.Y)``, or ``llama.cpp`` when it is not installed."""
    version = installed_versions("llama_cpp_python").get("llama_cpp_python")
    return f"{RUNTIME} (llama-cpp-python {version})" if version else RUNTIME


def gguf_pin(gguf: str | os.PathLike[str]) -> dict[str, Any]:
    """What pins a GGUF: its sha256 and size (its name is informational). Hashed once per
    file version through the file-hash cache that model weights use (keyed by device, inode,
    size and times), so loading a state does not re-read gigabytes of weights."""
    path = Path(gguf)
    if not path.is_file():
        raise FormatError(f"GGUF file {path} does not exist.")
    digest = hash_files([path], cache=shared_cache(), progress=False)[path]
    return {"sha256": digest, "size": path.stat().st_size, "file": path.name}


def require_gguf(pinned: dict[str, Any], gguf: str | os.PathLike[str], what: str) -> None:
    """Refuse a GGUF other than the pinned one (by digest), before llama.cpp reads a byte.

    Raises:
        IdentityMismatch: another GGUF.
        FormatError: no GGUF pin.
    """
    if not isinstance(pinned, dict) or not isinstance(pinned.get("sha256"), str):
        raise FormatError(f"{what} pins no GGUF (metadata.gguf.sha256); import it with its "
                          "GGUF: cubepack import llamacpp FILE --gguf GGUF --model MODEL")
    found = gguf_pin(gguf)
    if found["sha256"] != pinned["sha256"]:
        raise IdentityMismatch(what, [Mismatch("gguf.sha256", pinned["sha256"], found["sha256"],
                                               of_producer=True)],
                               f"It was computed with {pinned.get('file', 'another GGUF')}; load "
                               "it into a llama.cpp model loaded from that file.")


def import_state(path: str | os.PathLike[str], gguf: str | os.PathLike[str],
                 model: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None,
                 revision: str | None = None, metadata: dict[str, Any] | None = None,
                 proof: Any = None) -> Path:
    """Convert the llama.cpp session file at ``path`` into a KV file (default: beside it,
    ``<stem>.kv.safetensors``); return its path.

    Args:
        gguf: the GGUF llama.cpp ran: pinned by its sha256.
        model: the Hugging Face folder (or Hub id) the GGUF was converted from: its
            fingerprint, in the cache's dtype, is the producer. A claim (nothing in a GGUF
            records its source's digest) unless ``proof`` recomputes it.
        proof: a callable ``(layers, ids, kv_dtype, identity) -> {"kind", "detail"}`` that
            proves the cache (transformers' recomputation from ``model``) and returns the
            provenance it established (``recomputed`` only bit for bit); raises to refuse.

    Raises:
        IdentityMismatch: the state's shapes contradict the model; or the pin an export wrote
            beside it (``FILE.cubepack.json``) names another producer or GGUF, or other bytes.
        UnsupportedError: another architecture, a quantised cache, several sequences.
        FormatError: not a session file of the version cubepack reads.
    """
    info = read_session(path)
    if info.arch not in PERMUTED_ARCHS:
        raise UnsupportedError(f"{info.path.name} is a llama.cpp state of a {info.arch!r} model; "
                               f"cubepack converts {', '.join(PERMUTED_ARCHS)} states (it must "
                               "know how the converter reordered the key rows).")
    pin = gguf_pin(gguf)
    live = fingerprint(model, revision=revision, dtype=info.kv_dtype)
    exported = described_pin(info.path)
    if exported is not None:  # cubepack exported it: its pin names the producer it came from
        what = f"The llama.cpp state {info.path.name}"
        require_gguf(exported.get("gguf"), gguf, what)
        claimed = ModelIdentity.from_dict(exported.get("producer") or {})
        require_same(claimed, fingerprint(model, revision=revision, dtype=claimed.dtype), what)
    layers = session_layers(info, live)
    item: dict[str, Any] = {
        "runtime": runtime_record(), "gguf": pin,
        "converted_from": {"format": "llama.cpp session", "version": info.version,
                           "file": info.path.name, "v_trans": info.v_trans},
        "provenance": {"kind": ASSERTED, "detail": (
            "cubepack import llamacpp: the GGUF is pinned by digest; the Hugging Face model "
            "given names the folder it was converted from (a GGUF records no source digest)")}}
    if proof is not None:
        item["provenance"] = proof(layers, info.tokens, info.kv_dtype, live)
    item.update(metadata or {})
    target = Path(out) if out is not None else _default_out(info.path)
    try:
        return write_kv_layers(layers, target, producer=live, token_ids=info.tokens,
                               metadata=item)
    except IdentityMismatch as exc:
        raise exc.about(f"The llama.cpp state {info.path.name}",
                        "Its shapes are not this model's: give the Hugging Face folder the "
                        "GGUF was converted from.") from None


def session_layers(info: SessionInfo, identity: ModelIdentity) -> list[tuple[str, int, Any, Any]]:
    """(type, cumulative_length, keys, values) per layer in transformers' layout: copies
    (the head dimension is reordered), ``[1, kv_heads, tokens, head_dim]``."""
    import numpy
    import torch

    heads, dim = identity.geometry.get("num_kv_heads"), identity.geometry.get("head_dim")
    cells = info.cell_count
    mapped = numpy.memmap(info.path, dtype=numpy.uint8, mode="r")
    layers = []
    for index, layer in enumerate(info.layers):
        if not heads or not dim or layer.row_elements != heads * dim:
            raise IdentityMismatch(f"The llama.cpp state {info.path.name}", [Mismatch(
                f"layers[{index}].kv_heads * head_dim", (heads or 0) * (dim or 0),
                layer.row_elements, of_producer=True)],
                "Its shapes are not this model's: give the Hugging Face folder the GGUF was "
                "converted from.")
        parts = []
        for dtype, offset, transposed in ((layer.k_type, layer.k_offset, False),
                                          (layer.v_type, layer.v_offset, info.v_trans)):
            size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            raw = numpy.array(mapped[offset:offset + cells * layer.row_elements * size])
            flat = torch.from_numpy(raw).view(getattr(torch, dtype))
            rows = (flat.view(layer.row_elements, cells).t() if transposed
                    else flat.view(cells, layer.row_elements))
            parts.append(rows.reshape(cells, heads, dim).transpose(0, 1))  # [heads, cells, dim]
        keys = parts[0].reshape(heads, cells, dim // 2, 2).transpose(-1, -2).reshape(
            heads, cells, dim)  # llama.cpp's (i, half) pairs back to HF's (half, i)
        layers.append((FULL, cells, keys.unsqueeze(0).contiguous(),
                       parts[1].unsqueeze(0).contiguous()))
    return layers


def state_bytes(path: str | os.PathLike[str], *, v_trans: bool) -> tuple[bytes, Any]:
    """A KV file as llama.cpp session bytes (with ``v_trans``: values transposed, as a
    context without flash attention stores them); also returns its header."""
    info = read_kv_header(path)
    if any(layer.type != FULL for layer in info.layers) or info.num_layers == 0:
        raise UnsupportedError(f"{info.path.name}: cubepack exports full-attention caches "
                               "to llama.cpp only.")
    if info.kv_dtype not in ("float32", "float16"):
        raise UnsupportedError(f"{info.path.name} is a {info.kv_dtype} cache; llama.cpp caches "
                               "are f32 or f16 here.")
    if not info.token_ids or len(info.token_ids) != info.token_count:
        raise FormatError(f"{info.path.name} records no token ids; a llama.cpp state needs them.")
    return layers_session(mapped_layers(info), list(info.token_ids), v_trans=v_trans,
                          what=info.path.name), info


def layers_session(layers: list[tuple], tokens: list[int], *, v_trans: bool,
                   what: str = "This cache") -> bytes:
    """(type, cumulative_length, keys, values) layers in transformers' layout (one sequence,
    f32 or f16) as llama.cpp session bytes: :func:`session_layers` reversed."""
    out, width = [], 0
    for _, _, keys, values in layers:
        if keys.shape[0] != 1:
            raise UnsupportedError(f"{what} holds a batch of {keys.shape[0]}; a llama.cpp state "
                                   "holds one sequence.")
        heads, cells, dim = keys.shape[1:]
        width = heads * dim
        k = keys[0].reshape(heads, cells, 2, dim // 2).transpose(-1, -2).reshape(heads, cells,
                                                                                  dim)
        k = k.transpose(0, 1).contiguous()  # [cells, heads, dim]: one row per cell
        v = values[0].transpose(0, 1).reshape(cells, heads * dim)
        v = (v.t() if v_trans else v).contiguous()
        out.append((str(keys.dtype).removeprefix("torch."), _bytes(k), _bytes(v)))
    return session_bytes(tokens, PERMUTED_ARCHS[0], v_trans, out, int(width))


def _bytes(tensor: Any) -> bytes:
    import torch

    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def export_state(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                 gguf: str | os.PathLike[str] | None = None, v_trans: bool = True,
                 item: str | None = None) -> Path:
    """Write the KV file at ``path`` as a llama.cpp session file at ``out`` and its pin at
    ``out`` + ``.cubepack.json`` (both atomically; the pin last).

    Args:
        gguf: when given, refuse unless it is the GGUF the KV file pins.
        v_trans: values transposed, as a llama.cpp context without flash attention (the
            llama-cpp-python default) stores them; False for one with flash attention.
        item: ``path`` is a cube folder and the memory is its item ``item`` (a shard's range
            or its own file), checked against the cube's lock and its shard's index first.

    Raises:
        IdentityMismatch: ``gguf`` is not the pinned GGUF.
        FormatError: the KV file pins no GGUF or records no token ids.
        UsageError, IntegrityError: ``item`` is not a memory of the cube, or not its bytes.
    """
    if item is not None:
        with memory_file(Path(path), item) as memory:
            return export_state(memory, out, gguf=gguf, v_trans=v_trans)
    info = read_kv_header(path)
    # The pin seals the session's bytes (session_sha256), which a later import writes as
    # format 3: a format-2 file's bytes were never checked.
    require_checksums(info, "cubepack export llamacpp")
    pinned = info.metadata.get("gguf")
    what = f"KV cache {info.path.name}"
    if gguf is not None:
        require_gguf(pinned, gguf, what)
    elif not isinstance(pinned, dict) or not isinstance(pinned.get("sha256"), str):
        require_gguf(pinned, "", what)  # raises FormatError: no pin
    data, _ = state_bytes(path, v_trans=v_trans)
    out = Path(out)
    atomic.write_bytes(out, data)
    pin = {"format": PIN_FORMAT, "version": 1, "session_sha256": sha256_file(out),
           "gguf": pinned, "producer": info.producer.to_dict(),
           "kv_metadata": info.header.metadata[constants.KV_METADATA_KEY]}
    atomic.write_text(pin_path(out), canonical.dumps(pin))
    return out


def described_pin(session: str | os.PathLike[str],
                  data: bytes | None = None) -> dict[str, Any] | None:
    """The pin an export wrote beside the session file ``session`` (its GGUF and producer),
    or None when there is none. A pin is a claim about exactly the session's bytes (``data``
    when the caller read them: what is checked is what it uses): one that describes other
    bytes raises IdentityMismatch (never read as this state's, never ignored).
    """
    pin_file = pin_path(session)
    if not pin_file.is_file():
        return None
    what = f"llama.cpp state {Path(session).name}"
    pin = canonical.loads_strict(pin_file.read_text(encoding="utf-8"))
    found = hashlib.sha256(data).hexdigest() if data is not None else sha256_file(session)
    if not isinstance(pin, dict) or found != pin.get("session_sha256"):
        raise IdentityMismatch(what, [Mismatch("session_sha256", pin.get("session_sha256")
                                               if isinstance(pin, dict) else None, found)],
                               "The state is not the one its pin describes; export it again.",
                               finding="is not the state its pin describes")
    return pin


def pin_path(session: str | os.PathLike[str]) -> Path:
    session = Path(session)
    return session.with_name(session.name + PIN_SUFFIX)


def _default_out(path: Path) -> Path:
    return path.with_name(path.stem + constants.KV_SUFFIX)
