"""The verbs on a packed cube: orchestration only. Each verb keeps the order of its phases
(bytes checked before anything is parsed, trust decided before anything is decrypted or
loaded) and runs each phase for every memory kind (``cubepack.kinds.KINDS``); each step calls
the owners of the rules below it (the file-set rule, the lock's sections, the evidence, the
policy, the kinds) and holds none of its own (``tests/kinds/test_ops_holds_no_kind.py``). Nothing here pushes or pulls: a Hub id is only resolved to a folder (through the HF
cache, as transformers does) when a model is fingerprinted.

- :func:`pack` (``_pack``): pin, lock and card a cube folder, in place and atomically;
- :func:`verify` (``_verify``): every check of a cube under a :class:`TrustPolicy`;
- :func:`sign` (``_sign``): verify, then sign what that verification proved;
- :func:`migrate` (``_migrate``): a new cube for a new model or embedder, its lineage derived;
- :func:`upgrade` (``_upgrade``): older formats brought to the current one;
- :func:`compact` (``_compact``): rewrite the shards whose dead share passes a bound;
- :func:`diff` (``_diff``): every change between two locks, with what backs each pin;
- :func:`load_kv_cache`, :func:`load_adapter` (``_load``): one KV file into a live model, a
  cube's LoRA adapter applied to its pinned base, under a policy (the kind's own load last);
- :func:`encrypt`, :func:`rekey` (``_encrypt``, ``_private``): private cubes, encrypted to recipients (age),
  opened in memory only;
- ``_seam``: what the parts above (the Hub side, the runtimes, the hook) use of these modules
  beyond this face, declared once (``tests/test_architecture.py`` holds them to it).
"""

from ..kinds import MigrateOptions, MigrateResult, PackOptions, PackResult
from ._compact import CompactResult, compact
from ._diff import diff
from ._encrypt import EncryptOptions, RekeyOptions, encrypt, rekey
from ._load import load_adapter, load_kv_cache
from ._migrate import migrate
from ._pack import pack
from ._sign import sign
from ._upgrade import UpgradeResult, upgrade
from ._verify import verify

__all__ = ["CompactResult", "EncryptOptions", "MigrateOptions", "MigrateResult", "PackOptions",
           "PackResult", "RekeyOptions", "UpgradeResult", "compact", "diff", "encrypt",
           "load_adapter", "load_kv_cache", "migrate", "pack", "rekey", "sign", "upgrade",
           "verify"]
