"""Trust: what a statement about a cube rests on, and what must hold before it is accepted.

- ``_evidence``: the basis of every statement (proved now / signed by a trusted key /
  claimed) and the decisions that read it: the only module that decides a basis;
- ``_policy``: :class:`TrustPolicy`, the one policy every consumer applies whole;
- ``_report``: :class:`VerifyReport` and its :class:`Check` values;
- ``_keys``, ``_signing`` (``cubepack.sig``), ``_attestation`` (the in-toto predicate: what a
  signer proved, what it carried) and ``_lineage`` (the section, the chain rule, the origin
  record, a claim until followed);
- ``_age`` (with ``_age_stream``, ``_age_ssh``): the age format for private cubes, natively,
  for every identity type; :func:`unlock_identity` unlocks a passphrase-protected SSH key
  for the process, as ``ssh-add`` does.
"""

from ._age import unlock_identity
from ._policy import POLICIES, TrustPolicy
from ._report import Check, VerifyReport

__all__ = ["POLICIES", "Check", "TrustPolicy", "VerifyReport", "unlock_identity"]
