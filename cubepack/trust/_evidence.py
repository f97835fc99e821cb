"""What a statement about a cube rests on: the one place a basis is decided.

Every statement a report makes, a signature carries or a decision reads has a basis
(:class:`Basis`, the vocabulary, declared with the check catalogue on the floor,
:mod:`cubepack._util.checks`, which gives each check's):

- :attr:`Basis.PROVED`: this process established it now, from inputs it chose: bytes it hashed,
  a model it fingerprinted, a prefill it ran, vectors it re-embedded;
- :attr:`Basis.SIGNED`: a key the caller trusts signed an attestation in which *its signer*
  states that it proved it (the attestation's ``proved`` block, version 2);
- :attr:`Basis.CLAIMED`: read from the cube, which whoever pushed last wrote. Shown, never
  relied on. A claim stays a claim through every later step: a signature over a lock whose
  label was carried (not proved by the signer) is a signed *claim*, and still ``claimed``.

Decisions read the basis from here: :func:`satisfies` (``--require-provenance``),
:func:`backs_a_pin` (``--strict-models``). Nothing else compares basis strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._util.checks import CLAIMED, PROVED, SIGNED, STRONG, Basis, Catalogue
from ..format._provenance import ASSERTED, KINDS, RECOMPUTED, RECORDED, STRENGTH
from ..format.sections import Provenance

__all__ = ["ASSERTED", "CLAIMED", "KINDS", "PROVED", "RECOMPUTED", "RECORDED", "SIGNED",
           "STRENGTH", "STRONG", "Basis", "Signed", "backs_a_pin", "provenance_evidence",
           "satisfies"]


# --- provenance: who produced an activation -------------------------------------------------

# The labels themselves (recorded, asserted, recomputed) are the lock's format.


@dataclass(frozen=True)
class Signed:
    """What a trusted signer's attestation states it proved (its ``proved`` block), for the
    lock it names: the only source of :attr:`Basis.SIGNED`. Empty for an attestation of the
    first version, whose "proved" block restated lock labels (read as claims)."""

    key: str
    #: roles whose pinned identity the signer fingerprinted from the model itself
    producers: frozenset[str] = frozenset()
    #: item -> the provenance label the signer established
    provenance: dict[str, str] = field(default_factory=dict)
    #: the lineage section the signer derived (migrate), or None
    lineage: dict[str, Any] | None = None


def provenance_evidence(claimed: Provenance, *, recomputed: dict[str, Any] | None = None,
                        signed: Signed | None = None, item: str | None = None
                        ) -> dict[str, Any]:
    """What backs an activation's producer label ``claimed`` (the lock's): a recomputation run
    now (``recomputed``: ``{"full", "positions", "total", "seed"}``) is proved; a label a
    trusted signer states it established (``signed.provenance[item]``) is signed; anything else
    is the lock's claim, whoever signed the lock."""
    if recomputed is not None:
        scope = ("all positions" if recomputed["full"] else
                 f"{recomputed['positions']} of {recomputed['total']} positions sampled "
                 f"(seed {recomputed['seed']})")
        exact = bool(recomputed.get("exact"))
        if recomputed.get("rebuilt"):  # the item was replaced by the loading model's prefill
            return {"kind": RECOMPUTED, "basis": PROVED, "full": True, "exact": True,
                    "detail": "rebuilt now by the loading model (on_mismatch='rebuild'): its "
                              "own prefill, in place of the cube's cache"}
        return {"kind": RECOMPUTED, "basis": PROVED, "full": recomputed["full"], "exact": exact,
                "detail": f"recomputed now by the producer: {scope}, "
                          + ("bit for bit" if exact else "within the dtype's noise")}
    kind = claimed.kind
    if signed is not None and item is not None and signed.provenance.get(item) == kind:
        return {"kind": kind, "basis": SIGNED, "full": kind == RECOMPUTED,
                "detail": claimed.detail + f" (established by the signer of "
                                           f"trusted key {signed.key})"}
    carried = (f" (the lock says so; trusted key {signed.key} signed it as a claim, not as "
               "proved)" if signed is not None else " (the lock says so)")
    return {"kind": kind, "basis": CLAIMED, "full": kind == RECOMPUTED,
            "detail": claimed.detail + carried}


def satisfies(backing: dict[str, Any], required: str) -> bool:
    """Does this evidence meet ``--require-provenance required``? Only proved or signed
    evidence of that level does; ``recomputed`` needs every position checked and, proved now,
    the stored tensors bit for bit the prefill this process ran."""
    if backing["basis"] not in STRONG:
        return False
    if required == RECOMPUTED:
        # Proved now: the stored tensors must BE this process's prefill (a cache within the
        # proof's bound can still steer an answer; docs/explanation/proof-bound.md). Signed:
        # a signer states `recomputed` only under that same rule
        # (kinds/activations/_verify.established).
        return backing["kind"] == RECOMPUTED and backing["full"] and (
            backing["basis"] != PROVED or bool(backing.get("exact")))
    return STRENGTH[backing["kind"]] >= STRENGTH[required]


def backs_a_pin(check: Any) -> bool:
    """Does a passed check prove (or carry a trusted signer's proof of) a pinned model?
    Only a ``model identity`` check does: a model fingerprinted here, or by a trusted signer;
    the Hub's metadata (``remote model``) is the Hub's claim."""
    return check.name == Catalogue.MODEL_IDENTITY and check.ok is True and check.basis in STRONG
