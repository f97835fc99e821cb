"""The packed cube: a MemOS cube folder (or a plain bundle of KV files) with its pins, lock,
card and signature, and the verbs on it. Nothing here pushes or pulls: a Hub id is only resolved
to a folder (through the HF cache, as transformers does) when a model is fingerprinted.

- :func:`pack` (``_pack``), :func:`verify` (``_verify``), :func:`diff`, :func:`upgrade`,
  :func:`sign`, :func:`load_adapter` (``_load_adapter``: a cube's LoRA adapter applied to its
  pinned base only), :func:`migrate` (``_migrate``: a new cube for a new model or embedder,
  re-prefilled by ``_reprefill``, its ``_lineage`` recorded);
- the formats: ``_lock`` (``cubepack.lock``), ``_cubeconfig`` (``cubepack.yaml``), ``_card``
  (the model card), ``_content`` (what a cube may hold), ``_provenance``, ``_vectors`` and
  ``_embedder`` (text memories and their embedder), ``_adapters`` (LoRA adapters and their
  base), ``_report`` (checks);
- MemOS's side of a folder: ``_memos_layout`` (its config.json, pure) and ``_memos_pickle``
  (the allowlist reader for its pickles).
"""

from ._diff import diff
from ._load_adapter import load_adapter
from ._migrate import MigrateResult, migrate
from ._pack import PackResult, pack
from ._policy import POLICIES, TrustPolicy
from ._report import Check, VerifyReport
from ._sign import sign
from ._upgrade import UpgradeResult, upgrade
from ._verify import verify

__all__ = ["POLICIES", "Check", "MigrateResult", "PackResult", "TrustPolicy", "UpgradeResult",
           "VerifyReport", "diff", "load_adapter", "migrate", "pack", "sign", "upgrade", "verify"]
