"""The load verbs: each honours its :class:`~cubepack.trust.TrustPolicy` whole (and verifies
the cube it loads from, decrypting a private one in memory only once it verified), then ends
with the load of the memory kind that serves it (``kinds.serving``).

- ``cubepack.load_kv_cache``: one KV file into a live transformers model: the fields a lone
  KV file can satisfy (``recompute``, ``recompute_tokens``, ``seed``: proved with the model
  given) are applied; any other (a signature, lineage, pins, provenance: things a cube
  carries) is a UsageError saying to verify the cube first;
- ``cubepack.load_adapter``: a cube's LoRA adapter applied to a live model, only if the model
  is the base the adapter was pinned to: the cube is verified (files, digests, the adapter's
  config and shapes against the lock) before the kind checks the model and PEFT applies it;
- :func:`load_verified` (through ``_seam``): a verified cube's memories into live MemOS
  memories, every check each kind runs of them done there (the hook only places them).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .._util.ramdir import ram_folder
from ..errors import UsageError
from ..identity._identity import ModelIdentity
from ..kinds import KINDS, LoadJob, serving
from ..trust._policy import TrustPolicy
from ._private import decrypted_memory, is_private, open_private
from ._private_range import PrivateRanges, local_reader
from ._verify import verify


def load_kv_cache(path: str | os.PathLike[str], model: Any, policy: TrustPolicy | None = None,
                  *, device: Any = None, copy: bool = False,
                  identity: ModelIdentity | None = None,
                  decrypt_with: str | os.PathLike[str] | None = None,
                  item: str | None = None, **options: Any) -> Any:
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

    ``item``: ``path`` is a cube folder and the memory is its item ``item``, found through
    its lock (its digests checked) and, in a sharded cube, its shard's index (checked against
    the lock); its bytes (a shard's range, or a whole file) are checked against the sha256 the
    index or lock records, and the index's checksums, before any tensor is built. The rest of
    the cube is not verified (run ``cubepack.verify`` for that, or a signature).

    ``decrypt_with``: an identity file (age or OpenSSH private key) for a private cube's KV
    file (``*.kv.safetensors.age``): it is decrypted into anonymous memory (one thread a core)
    and its tensors view it there, never written to a disk. (``identity`` names the live
    model's identity.) With ``item``, ``path`` is a private cube folder: its encrypted
    manifest is decrypted, then only the memory's own bytes (a shard's index and the 64 KiB
    chunks its range lies in, each chunk's tag checked: ``ops/_private_range.py``).

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
    kind = serving("load_kv_cache")
    if item is not None:
        if decrypt_with is not None:
            public, read = local_reader(Path(path))
            source = PrivateRanges(public, read, decrypt_with, Path(path).name)
            return kind.load(path, model, policy.recomputation(), device=device, copy=copy,
                             identity=identity, item=item, source=source)
        return kind.load(path, model, policy.recomputation(), device=device, copy=copy,
                         identity=identity, item=item)
    if decrypt_with is not None:
        # In anonymous memory, not a memory file: the tensors view the buffer (no path to
        # map), and errors name the file the caller gave.
        return kind.load(path, model, policy.recomputation(), device=device, copy=copy,
                         identity=identity, data=decrypted_memory(path, decrypt_with))
    return kind.load(path, model, policy.recomputation(), device=device, copy=copy,
                     identity=identity)


def load_adapter(model: Any, cube_dir: str | Path, name: str | None = None,
                 policy: TrustPolicy | None = None, *, adapter_name: str = "default",
                 decrypt_with: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """Verify the cube, check ``model`` is the adapter's pinned base, then apply the adapter.

    Args:
        model: a loaded transformers model (the base, as it will run: its dtype counts).
        cube_dir: a packed cube holding the adapter in ``parametric/<name>/``.
        name: the adapter's name (may be left out when the cube holds one adapter).
        policy: what the cube must prove (a :class:`TrustPolicy`, or its fields as
            ``options``), applied whole by :func:`verify`: trusted keys, a signature, lineage,
            strict models, recomputation and provenance of its activations...; the check of
            ``model`` against the adapter's pinned base is this function's own.
        adapter_name: the name PEFT gives the adapter inside the returned model.
        decrypt_with: the identity file opening a private cube: the adapter is decrypted in
            memory (PEFT reads it from a RAM folder, never a disk).

    Returns:
        ``peft.PeftModel.from_pretrained(model, <the adapter>, is_trainable=False)``.

    Raises:
        VerificationFailed: the cube is not what was packed (a tampered adapter file...).
        UsageError: the cube holds no adapter of that name.
        IdentityMismatch: ``model`` is not the pinned base (the fields named: weights digest,
            dtype, geometry..., and each LoRA module whose shape differs); peft is not
            imported.

    Example:
        ```python
        model = cubepack.load_adapter(model, "my-cube", "style")
        print(model.peft_config)
        ```
    """
    given = TrustPolicy.build(policy, **options)
    given.require_honoured("load_adapter")
    kind = serving("load_adapter")
    report = verify(cube_dir, given, decrypt_with=decrypt_with)
    if is_private(report.lock):
        if decrypt_with is None:
            raise UsageError(f"{cube_dir} is a private cube; applying its adapter needs an "
                             "identity: pass decrypt_with=KEY_FILE.")
        with open_private(cube_dir, decrypt_with, public_lock=report.lock) as opened, \
                ram_folder() as private:
            return kind.load(model, opened.folder, opened.lock, name, adapter_name,
                             Path(private), str(cube_dir))
    with tempfile.TemporaryDirectory(prefix="cubepack-adapter-") as private:
        assert report.lock is not None  # verified (verify raised otherwise)
        return kind.load(model, Path(cube_dir), report.lock, name, adapter_name,
                         Path(private), str(cube_dir))



def load_verified(job: LoadJob) -> tuple[Any, ...]:
    """Every kind's memories of the verified cube ``job.cube`` for the live MemOS memories in
    ``job.memories``: each kind, in the registry's order, checks its memories against them as
    ``job.policy`` asks and places them, or hands them back typed (each carrying its producer,
    its provenance label and its seals). Returns what the kinds handed back, for the caller
    (the MemOS hook) to place; a refusal raises before anything was handed back.

    The caller decided trust and opened a private cube before: this runs only on a cube that
    verified under the policy (its files the lock's, its signature and pins checked). Called
    with ``job.built`` False before MemOS builds anything, it runs the kinds'
    ``check_memos_config`` on ``job.config`` instead, and hands back nothing.

    Example::

        placed = load_verified(LoadJob(folder, report.lock, policy, {"act_mem": memory}, hook))
    """
    if not job.built:  # before MemOS builds anything: what its config decides, refused
        for kind in KINDS:
            kind.check_memos_config(job)
        return ()
    return tuple(loaded for kind in KINDS for loaded in kind.load_memos(job))
