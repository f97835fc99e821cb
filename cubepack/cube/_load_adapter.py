"""``cubepack.load_adapter``: apply a cube's LoRA adapter to a live model, only if the model is
the base the adapter was pinned to.

Order matters: the cube is verified (files, digests, the adapter's config and shapes against
the lock), then the live model is fingerprinted and compared with the adapter's base pin, and
its parameter shapes with the adapter's, and only then is peft imported. PEFT reads a private
copy of the bytes this process just hashed against the lock, so a file changed after the check
is never the one applied.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.paths import resolve_inside
from .._util.quiet import quiet_libraries
from ..errors import IntegrityError, UsageError
from ..identity._fingerprint import fingerprint
from . import _adapters as adapters_mod
from ._policy import TrustPolicy
from ._verify import verify


def load_adapter(model: Any, cube_dir: str | Path, name: str | None = None,
                 policy: TrustPolicy | None = None, *, adapter_name: str = "default",
                 **options: Any) -> Any:
    """Verify the cube, check ``model`` is the adapter's pinned base, then apply the adapter.

    Args:
        model: a loaded transformers model (the base, as it will run: its dtype counts).
        cube_dir: a packed cube holding the adapter in ``parametric/<name>/``.
        name: the adapter's name (may be left out when the cube holds one adapter).
        policy: trusted keys / a required signature for the cube (or those fields as
            ``options``); the model checks are this function's own.
        adapter_name: the name PEFT gives the adapter inside the returned model.

    Returns:
        ``peft.PeftModel.from_pretrained(model, <the adapter>, is_trainable=False)``.

    Raises:
        VerificationFailed: the cube is not what was packed (a tampered adapter file...).
        UsageError: the cube holds no adapter of that name.
        IdentityMismatch: ``model`` is not the pinned base (the fields named: weights digest,
            dtype, geometry..., and each LoRA module whose shape differs); peft is not
            imported.
    """
    given = TrustPolicy.build(policy, **options)
    report = verify(cube_dir, TrustPolicy(trusted_keys=given.trusted_keys,
                                          require_signature=given.require_signature))
    lock = report.lock or {}
    adapters = lock.get("adapters") or {}
    if name is None and len(adapters) == 1:
        name = next(iter(adapters))
    if name not in adapters:
        raise UsageError(f"{cube_dir} holds no adapter {name!r}; its adapters: "
                         f"{sorted(adapters) or 'none'}. Pass one of them as name.")
    entry = adapters[name]
    adapters_mod.check_live_base(name, entry, lock["models"][entry["model_role"]],
                                 fingerprint(model), adapters_mod.model_shapes(model))
    with tempfile.TemporaryDirectory(prefix="cubepack-adapter-") as private:
        for key, filename in (("config_file", constants.ADAPTER_CONFIG),
                              ("weights_file", constants.ADAPTER_WEIGHTS)):
            data = resolve_inside(Path(cube_dir), entry[key]).read_bytes()
            expected = lock["files"][entry[key]]["sha256"]
            if hashlib.sha256(data).hexdigest() != expected:
                raise IntegrityError(f"{entry[key]} changed after it was verified (its sha256 is "
                                     f"no longer {expected}); refusing to apply it.")
            (Path(private) / filename).write_bytes(data)
        from peft import PeftModel

        with quiet_libraries():
            return PeftModel.from_pretrained(model, private, adapter_name=adapter_name,
                                             is_trainable=False)
