"""Model identity: what a KV cache is only valid for, and how two identities are compared.

Pure logic: values in, values out. Computing an identity from a model or folder is
:mod:`cubepack.identity._fingerprint`'s job.

Strict fields decide whether a cache may be loaded; a difference in any of them means refuse.
Informational fields (model id, revision, config digest, library versions) are recorded for
humans and for pinning, but two copies of the same weights under different names are the same
producer, so they never cause a refusal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import FormatError, IdentityMismatch, Mismatch

#: Fields whose difference means "refuse", in the order messages list them.
STRICT_FIELDS = (
    "weights_digest",
    "tokenizer_digest",
    "geometry",
    "compute_config",
    "dtype",
    "kv_dtype",
    "quantization",
    "adapters",
)

#: Fields whose difference is reported as a warning: they change future prompts (chat template,
#: special tokens), not the meaning of an existing cache.
WARNING_FIELDS = ("prompt_format_digest",)
#: Fields compared key by key, so a message names ``geometry.num_layers`` or
#: ``compute_config.rope_theta``.
_KEYED_FIELDS = ("geometry", "compute_config")

#: Keys of ``geometry``, compared one by one so a message names e.g. ``geometry.num_layers``.
GEOMETRY_KEYS = (
    "model_type",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "hidden_size",
    "vocab_size",
    "layer_types",
    "sliding_window",
)


@dataclass(frozen=True)
class ModelIdentity:
    """The fingerprint of a model as it runs.

    Attributes:
        weights_digest: ``sha256:<hex>`` over sorted (relative file name, file sha256) of the
            weight files, or ``state-dict-sha256:<hex>`` for a model with no files on disk.
        tokenizer_digest: ``sha256:<hex>`` of the canonical tokenizer JSON, or ``None`` when no
            tokenizer was found.
        geometry: the shapes a KV cache depends on (see :data:`GEOMETRY_KEYS`).
        compute_config: every config value that can change the forward pass (RoPE, norm eps,
            activation, biases, softcapping...), flat, with RoPE in one canonical form; None
            only in identities read from KV format 1, which did not record it.
        dtype: dtype of the weights as the model runs (``"float32"``, ``"bfloat16"``...).
        kv_dtype: dtype of the KV tensors it produces.
        quantization: canonical quantization config, or ``None``.
        adapters: digest of the active adapters, or ``None``.
        prompt_format_digest: chat template and special tokens (a difference is a warning).
        model_id, revision, config_digest, versions: informational only.
    """

    weights_digest: str
    tokenizer_digest: str | None
    geometry: dict[str, Any]
    dtype: str
    kv_dtype: str
    quantization: dict[str, Any] | None = None
    adapters: str | None = None
    compute_config: dict[str, Any] | None = None
    prompt_format_digest: str | None = None
    model_id: str | None = None
    revision: str | None = None
    config_digest: str | None = None
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def pinned(self) -> dict[str, Any]:
        """The dict a lock pins: without the fields that describe the packing machine rather
        than the model (library versions, a config digest that includes library-written
        keys), so re-packing an unchanged cube elsewhere gives the same digests."""
        return {key: value for key, value in self.to_dict().items()
                if key not in ("versions", "config_digest")}

    def strict(self) -> dict[str, Any]:
        """Only the strict fields, as a dict (what the lock and the KV file must agree on)."""
        return {name: getattr(self, name) for name in STRICT_FIELDS}

    @classmethod
    def from_dict(cls, data: Any, *, legacy: bool = False) -> ModelIdentity:
        """Build an identity from its dict form; raise :class:`FormatError` when malformed.

        ``legacy``: the identity comes from KV format 1 / lock version 1, which had no
        ``compute_config``; it is read as None (and such an identity matches no live model).
        """
        if not isinstance(data, dict):
            raise FormatError(f"A model identity must be a JSON object, found {type(data).__name__}.")
        known = {f.name for f in fields(cls)}
        required = [name for name in STRICT_FIELDS if not (legacy and name == "compute_config")]
        missing = [name for name in required if name not in data]
        if missing:
            raise FormatError(f"The model identity lacks the strict field(s) {', '.join(missing)}.")
        if not isinstance(data["weights_digest"], str) or not isinstance(data["geometry"], dict):
            raise FormatError("The model identity has a malformed weights_digest or geometry.")
        _check_geometry(data["geometry"])
        for name in ("dtype", "kv_dtype"):
            if not isinstance(data[name], str):
                raise FormatError(f"The model identity's {name} must be a string.")
        if not isinstance(data.get("compute_config"), (dict, type(None))) or \
                (data.get("compute_config") is None and not legacy):
            raise FormatError("The model identity's compute_config must be an object.")
        for name in ("tokenizer_digest", "adapters", "model_id", "revision", "config_digest",
                     "prompt_format_digest"):
            if not isinstance(data.get(name), (str, type(None))):
                raise FormatError(f"The model identity's {name} must be a string or null.")
        if not isinstance(data.get("quantization"), (dict, type(None))) or \
                not isinstance(data.get("versions", {}), dict):
            raise FormatError("The model identity's quantization or versions is malformed.")
        values = {key: value for key, value in data.items() if key in known}
        return cls(**values)


_INT_GEOMETRY = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
                 "vocab_size", "sliding_window")


def _check_geometry(geometry: dict[str, Any]) -> None:
    """Refuse a geometry whose values are not what every reader assumes (ints, a list of layer
    type names): they come from files other people wrote."""
    for key in _INT_GEOMETRY:
        value = geometry.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise FormatError(f"The model identity's geometry.{key} must be a non-negative "
                              f"integer or null, found {value!r}.")
    layer_types = geometry.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list)
                                        and all(isinstance(t, str) for t in layer_types)):
        raise FormatError("The model identity's geometry.layer_types must be a list of names.")
    model_type = geometry.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise FormatError("The model identity's geometry.model_type must be a string or null.")


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the one spelling of a dtype in identities and files."""
    return str(dtype).removeprefix("torch.")


def compare(expected: ModelIdentity, found: ModelIdentity) -> list[Mismatch]:
    """Every strict field where ``found`` differs from ``expected`` (geometry and compute
    config key by key)."""
    mismatches: list[Mismatch] = []
    for name in STRICT_FIELDS:
        want, have = getattr(expected, name), getattr(found, name)
        if name in _KEYED_FIELDS and isinstance(want, dict) and isinstance(have, dict):
            mismatches.extend(compare_keyed(name, want, have))
        elif want != have:
            mismatches.append(Mismatch(name, want, have, of_producer=True))
    return mismatches


def compare_warnings(expected: ModelIdentity, found: ModelIdentity) -> list[Mismatch]:
    """Fields that differ but do not invalidate a cache (chat template, special tokens)."""
    return [Mismatch(name, getattr(expected, name), getattr(found, name), of_producer=True)
            for name in WARNING_FIELDS
            if getattr(expected, name) is not None and getattr(expected, name) != getattr(found, name)]


#: How a key absent from one side of a keyed comparison is shown.
ABSENT = "(absent: the library default)"


def compare_keyed(name: str, expected: dict[str, Any], found: dict[str, Any]) -> list[Mismatch]:
    """Every key of a keyed field that differs, as ``<name>.<key>`` (geometry's known keys
    first, in order, then the rest sorted)."""
    order = GEOMETRY_KEYS if name == "geometry" else ()
    keys = [k for k in order if k in expected or k in found]
    keys += sorted((set(expected) | set(found)) - set(keys))
    return [Mismatch(f"{name}.{key}", expected.get(key, ABSENT), found.get(key, ABSENT),
                     of_producer=True)
            for key in keys if expected.get(key, ABSENT) != found.get(key, ABSENT)]


def compare_geometry(expected: dict[str, Any], found: dict[str, Any]) -> list[Mismatch]:
    """Every geometry key that differs, as ``geometry.<key>``."""
    return compare_keyed("geometry", expected, found)


def require_same(expected: ModelIdentity, found: ModelIdentity, what: str) -> None:
    """Raise :class:`IdentityMismatch` naming every differing field, or return quietly."""
    mismatches = compare(expected, found)
    if mismatches:
        raise IdentityMismatch(what, mismatches)
