"""An activation's producer label: the one spelling of each label and the one order of their
strength.

The lock records it per activation (``activations[item].provenance.kind``), a KV header
carries it (``provenance``), an attestation states which labels its signer established. The
labels, weakest first: ``asserted`` (the packer's word only: config.json's name, ``--model``,
``--assert-producer``), ``recorded`` (the source carried an identity that agrees with the
pinned model: a KV header, a MemOS pickle's producer record from MemOS PR #2302 or #2305) and
``recomputed`` (pack or migrate ran the producer on every position and wrote that prefill).
What *backs* a label (proved, signed, claimed) is :mod:`cubepack.trust._evidence`'s to decide.

The labels are stored as plain strings (:data:`ASSERTED`, :data:`RECORDED`,
:data:`RECOMPUTED`), never as enum members, so nothing cubepack writes (a lock, a KV header,
a memory MemOS pickles) names a cubepack class. Imports nothing: the CLI reads
:data:`LEVELS` for ``--require-provenance`` without loading the lock's module.
"""

from __future__ import annotations

import enum

__all__ = ["ASSERTED", "KINDS", "LEVELS", "RECOMPUTED", "RECORDED", "STRENGTH", "Provenance"]


class Provenance(str, enum.Enum):
    """The producer labels, weakest first: the order ``--require-provenance`` compares."""

    ASSERTED = "asserted"
    RECORDED = "recorded"
    RECOMPUTED = "recomputed"

    __hash__ = str.__hash__  # a label and its member are one key

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: The labels as stored, weakest first.
KINDS: tuple[str, ...] = tuple(label.value for label in Provenance)
ASSERTED, RECORDED, RECOMPUTED = KINDS
#: How strong each label is (its rank in :data:`KINDS`).
STRENGTH = {label: rank for rank, label in enumerate(KINDS)}
#: What ``--require-provenance`` may ask for: ``asserted`` is every label's floor, so asking
#: for it would ask nothing.
LEVELS = KINDS[1:]
