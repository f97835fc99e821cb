"""``cubepack.load_kv_cache``: one KV file into a live transformers model under a
:class:`~cubepack.trust.TrustPolicy`, honoured whole: the fields a lone KV file can satisfy
(``recompute``, ``recompute_tokens``, ``seed``: proved with the model given) are applied;
any other (a signature, lineage, pins, provenance: things a cube carries) is a UsageError
saying to verify the cube first."""

from __future__ import annotations

import os
from typing import Any

from ..identity._identity import ModelIdentity
from ..kv._load import load_kv_cache as _load_checked
from ..trust._policy import TrustPolicy
from ._private import decrypted_memory


def load_kv_cache(path: str | os.PathLike[str], model: Any, policy: TrustPolicy | None = None,
                  *, device: Any = None, copy: bool = False,
                  identity: ModelIdentity | None = None,
                  decrypt_with: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """Load a KV file into a ``DynamicCache`` for ``model``, refusing any other producer (see
    :func:`cubepack.kv._load.load_kv_cache`), and proving it with ``model`` when the policy
    asks (``recompute=True``; ``recompute_tokens=N`` samples N positions, ``seed`` repeats a
    draw).

    Raises:
        IdentityMismatch: the cache was produced by a different model (every field named).
        RecomputationFailed: ``model`` does not reproduce it (asked, or another runtime's).
        UsageError: a policy field a lone KV file cannot satisfy.
        IntegrityError: a tensor's bytes, or the header, differ from the checksum the header
            records (the tensor named).
        FormatError: the file is corrupt, truncated or of an unknown version.
        RefusedError: ``decrypt_with`` is not a recipient of the (age-encrypted) file.

    ``decrypt_with``: an identity file (age or OpenSSH private key) for a private cube's KV
    file (``*.kv.safetensors.age``): it is decrypted into anonymous memory (one thread a core)
    and its tensors view it there, never written to a disk. (``identity`` names the live
    model's identity.)

    Returns:
        the cache, a transformers ``DynamicCache`` on ``device`` whose tensors view the checked
        file (refused, never returned, when a check fails).

    Example:
        ```python
        cache = cubepack.load_kv_cache("my-cube/activations/item-1.kv.safetensors", model)
        output = model.generate(input_ids, past_key_values=cache)
        ```
    """
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("load_kv_cache")
    plan = policy.recomputation()
    if decrypt_with is not None:
        # In anonymous memory, not a memory file: the tensors view the buffer (no path to
        # map), and errors name the file the caller gave.
        return _load_checked(path, model, device=device, copy=copy, identity=identity,
                             recompute=plan.asked, sample=plan.sample, seed=plan.seed,
                             data=decrypted_memory(path, decrypt_with))
    return _load_checked(path, model, device=device, copy=copy, identity=identity,
                         recompute=plan.asked, sample=plan.sample, seed=plan.seed)
