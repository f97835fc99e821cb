"""``cubepack.load_kv_cache``: one KV file into a live transformers model under a
:class:`~cubepack.trust.TrustPolicy`, honoured whole: the fields a lone KV file can satisfy
(``recompute``, ``recompute_tokens``, ``seed``: proved with the model given) are applied;
any other (a signature, lineage, pins, provenance: things a cube carries) is a UsageError
saying to verify the cube first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import CubepackError
from ..identity._identity import ModelIdentity
from ..kv._load import load_kv_cache as _load_checked
from ..trust._policy import TrustPolicy
from ._private import decrypted_file


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
    file (``*.kv.safetensors.age``): it is decrypted into an anonymous memory file and mapped
    from there, never written to a disk. (``identity`` names the live model's identity.)
    """
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("load_kv_cache")
    if decrypt_with is not None:
        with decrypted_file(path, decrypt_with) as clear:
            try:
                return _load_checked(clear, model, device=device, copy=copy, identity=identity,
                                     recompute=policy.recompute,
                                     sample=policy.recompute_tokens, seed=policy.seed)
            except CubepackError as exc:
                _name_the_source(exc, clear, Path(path))
                raise
    return _load_checked(path, model, device=device, copy=copy, identity=identity,
                         recompute=policy.recompute, sample=policy.recompute_tokens,
                         seed=policy.seed)


def _name_the_source(exc: CubepackError, clear: Path, source: Path) -> None:
    """A refusal of a decrypted KV file names the file the caller gave, not the anonymous
    memory file it was read from (``/proc/self/fd/N``, which tells no two files apart)."""
    def renamed(text: str) -> str:
        return (text.replace(str(clear), str(source))
                .replace(f"KV cache {clear.name} ", f"KV cache {source.name} ")
                .replace(f"KV cache {clear.name}:", f"KV cache {source.name}:"))

    exc.args = tuple(renamed(arg) if isinstance(arg, str) else arg for arg in exc.args)
    if isinstance(getattr(exc, "what", None), str):
        exc.what = renamed(exc.what)  # type: ignore[attr-defined]

