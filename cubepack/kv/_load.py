"""Loading a KV file into a live transformers model: the producer check first, then, for a
cache another runtime computed, a recomputation here, then the zero-copy ``DynamicCache``, each
tensor's bytes checked against its checksum as they are mapped (KV format 3; a version-2 file,
which records none, loads with a warning on the ``cubepack`` logger saying its bytes were not
checked and how to add checksums)."""

from __future__ import annotations

import os
from typing import Any

from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity
from ._format import check_kv_file, logger, unchecked_note
from ._recompute import TorchRuntime, require_recomputed_here
from ._torch import build_dynamic_cache, cache_from_layers


def load_kv_cache(path: str | os.PathLike[str], model: Any, *, device: Any = None,
                  copy: bool = False, identity: ModelIdentity | None = None,
                  recompute: bool = False, sample: int | None = None,
                  seed: int | None = None, data: Any = None) -> Any:
    """Load a KV file into a ``DynamicCache`` for ``model``, refusing any other producer.

    The header is validated and the producer's strict fields compared with the live model's
    identity before any tensor is read; only then is the cache built, zero-copy from the
    memory-mapped file unless ``copy`` (or a ``device`` other than CPU) asks otherwise, once
    every tensor's mapped bytes match the checksum its header records (XXH3-64, hashed in
    place on a pool of threads). A version-2 file records no checksums: it loads unchecked,
    and a warning on the ``cubepack`` logger says so.

    Args:
        model: the live ``PreTrainedModel`` the cache will be used with.
        device: where to place the tensors (default: CPU, zero-copy).
        copy: clone the tensors so they do not keep the file mapped.
        identity: the live model's identity, when already computed (saves a fingerprint).
        recompute: prove the cache with ``model`` before it is returned (its prefill must
            reproduce it: ``sample`` positions drawn with ``seed``, None: every position);
            the cache returned is then that prefill, not the file's tensors (a bound on
            tensors does not bind an answer; the prefill this process ran does).
            ``cubepack.load_kv_cache`` sets it from a :class:`~cubepack.trust.TrustPolicy`.
        data: the file's bytes, already in memory (a private file decrypted there): read
            from this buffer, the tensors views of it (zero-copy); ``path`` only names it.

    A cache another runtime computed (its header records ``runtime``, e.g. ``mlx-lm 0.32.2``)
    is accepted only once this model's own prefill reproduces it within the recomputation
    bounds (:func:`require_recomputed_here`): kernels differ between runtimes; the cache
    returned is then this model's prefill.

    Raises:
        IdentityMismatch: the cache was produced by a different model (every field named).
        RecomputationFailed: another runtime's cache that this model does not reproduce, or
            that records no token ids to recompute it from.
        IntegrityError: a tensor's bytes differ from its checksum (bit rot, a bad copy, an
            edit): the tensor, the file and both checksums named.
        FormatError: the file is corrupt, truncated or of an unknown version.
    """
    live = identity or fingerprint(model)
    info = check_kv_file(path, live, data=data)
    note = unchecked_note(info)
    if note:
        logger.warning("cubepack: %s", note)
    proved = require_recomputed_here(TorchRuntime(model), info, always=recompute,
                                     sample=sample, seed=seed)
    if proved is not None:  # this process's own prefill: the stored tensors were only a claim
        return cache_from_layers(proved.layers, model.config, device=device,
                                 source=info.path.name)
    return build_dynamic_cache(info, model.config, device=device, copy=copy)
