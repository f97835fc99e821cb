"""The check catalogue: every check a verification runs, declared once, with what it rests on.

A check is declared here and nowhere else. Each entry of :class:`Catalogue` is one row: its name
(what a report and ``--json`` print: the entry *is* that string), its basis (what a pass or a
failure rests on: :class:`Basis`), whether its failure means damaged bytes (fixed by fetching
or packing them again) or else what to do when it refused, whether it runs only when asked
or only for what a cube holds (``optional``), whether a private cube's decrypted pass leaves
it to the public pass (``public_only``), whether it is a check of who sent a cube (``trust``:
when one fails, nothing is decrypted), and whether, asked of a private cube, it needs the
plaintext (``plaintext``). The entries' order is a report's. Code names a check by its entry
(``Catalogue.SHA256``), never by its string; a :class:`~cubepack.trust.Check` carries its
entry, so a refusal reads its fix from there (:class:`~cubepack.errors.VerificationFailed`,
on the floor below, cannot import this module). ``tests/test_owners.py`` fails when a check's
name is spelled anywhere else.

Why on the floor: the report and the evidence are ``trust``'s (layer 7), but a check is named
by parts below it (a memory kind's checks: the embedder's in ``memory``, the KV file's in
``kv``) and above it (``ops``, ``hub``, the MemOS hook). The lowest user must be able to import
the catalogue, so it sits in ``_util`` with the basis as data: the vocabulary :class:`Basis` is
defined here, and what a basis *decides* (``--require-provenance``, ``--strict-models``)
stays :mod:`cubepack.trust._evidence`'s.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["CLAIMED", "DAMAGE_FIX", "PROVED", "SIGNED", "STRONG", "Basis", "Catalogue"]


class Basis(str, enum.Enum):
    """What a statement rests on (a ``str``, so reports serialise it as its value):

    - ``proved``: this process established it now, from inputs it chose: bytes it hashed, a
      model it fingerprinted, a prefill it ran, vectors it re-embedded;
    - ``signed``: a key the caller trusts signed an attestation in which *its signer* states
      that it proved it;
    - ``claimed``: read from the cube, which whoever pushed last wrote. Shown, never relied on.
    """

    PROVED = "proved"
    SIGNED = "signed"
    CLAIMED = "claimed"

    def __str__(self) -> str:
        return self.value


PROVED, SIGNED, CLAIMED = Basis.PROVED, Basis.SIGNED, Basis.CLAIMED
#: Bases a decision may rest on: this process's own proof, or a trusted signer's.
STRONG = (PROVED, SIGNED)

#: What to do when the bytes are not the packed ones (a check with ``damage``).
DAMAGE_FIX = "pull or pack it again"


class _Row(NamedTuple):
    name: str
    #: the basis of the check when it passes or fails (a skipped check has none). A check
    #: about bytes or models this process read is proved; a check that only compares two
    #: things the cube says (a KV header against the lock's pin, cubepack.yaml against the
    #: lock, the Hub's metadata against a pin) is a claim; a signature check rests on the key.
    basis: Basis
    #: what to do when it refused: :data:`DAMAGE_FIX` for a check of the bytes; a check of
    #: the policy (model, signature, recompute, embedder) names its own fix, which another
    #: pull would not be.
    fix: str = DAMAGE_FIX
    #: listed only when asked for, or only for what a cube holds (``adapter``: a cube with
    #: LoRA adapters; ``preferences``: a preference memory; ``adapter base``: and a base
    #: model at hand; ``recipients``, ``replay``, ``private``: a private cube).
    optional: bool = False
    #: of the clear cube, but a private cube's verification leaves it to the outer (public)
    #: pass: its decrypted pass does not repeat it.
    public_only: bool = False
    #: a check of who sent the cube, and which revision to which readers: when one fails,
    #: nothing is decrypted.
    trust: bool = False
    #: asked of a private cube opened without an identity, it is refused: it needs the
    #: plaintext.
    plaintext: bool = False


class Catalogue(str, enum.Enum):
    """Every check a verification runs, in a report's order (see the module's docstring).

    Each entry is a ``str`` equal to the check's name (``Catalogue.SHA256 == "sha256"``, and
    hashed as that string), with the row's fields as attributes."""

    basis: Basis
    fix: str
    optional: bool
    public_only: bool
    trust: bool
    plaintext: bool

    def __new__(cls, name: str, basis: Basis, fix: str, optional: bool, public_only: bool,
                trust: bool, plaintext: bool) -> Catalogue:
        entry = str.__new__(cls, name)
        entry._value_ = name
        entry.basis, entry.fix, entry.optional = basis, fix, optional
        entry.public_only, entry.trust, entry.plaintext = public_only, trust, plaintext
        return entry

    # A name and its entry are one key: the enum's default hash (of the member's Python name)
    # would put "sha256" and Catalogue.SHA256 in different buckets of one set.
    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def damage(self) -> bool:
        """Its failure means the cube's bytes are not the packed ones."""
        return self.fix == DAMAGE_FIX

    CUBE = _Row("cube", PROVED, public_only=True)
    LOCK = _Row("lock", PROVED)
    PATH = _Row("path", PROVED)
    FILE_SET = _Row("file set", PROVED)
    SIZE = _Row("size", PROVED)
    SHA256 = _Row("sha256", PROVED)
    CONTENT = _Row("content", PROVED)
    SHARDS = _Row("shards", PROVED, optional=True)
    PARTIAL = _Row("partial", PROVED, optional=True)
    KV_HEADER = _Row("kv header", CLAIMED)
    KV_CHECKSUMS = _Row("kv checksums", PROVED)
    ADAPTER = _Row("adapter", CLAIMED, optional=True)
    PREFERENCES = _Row("preferences", PROVED, optional=True)
    CUBE_CONFIG = _Row("cube config", CLAIMED)
    SIGNATURE = _Row(
        "signature", SIGNED, public_only=True, trust=True,
        fix="have it signed (cubepack sign) by a key you pass with --trusted-key, or drop "
            "--require-signature")
    ATTESTATION = _Row(
        "attestation", SIGNED, public_only=True, trust=True,
        fix="sign it again (cubepack sign): its attestation does not match its lock")
    LINEAGE = _Row(
        "lineage", SIGNED, optional=True, public_only=True, trust=True,
        fix="have each ancestor signed by a trusted key, or drop --require-lineage")
    RECIPIENTS = _Row(
        "recipients", PROVED, optional=True, trust=True,
        fix="ask the cube's owner for the revision they wrote (signed: cubepack rekey "
            "--sign-key): its files name other readers than its lock counts")
    REPLAY = _Row(
        "replay", SIGNED, optional=True, trust=True,
        fix="get the newest revision the replay check names (an older one pushed back can "
            "still be read by a reader removed since)")
    PRIVATE = _Row(
        "private", PROVED, optional=True,
        fix="pass an identity the cube is encrypted to (--identity KEY or CUBEPACK_IDENTITY), "
            "or drop the checks that need its plaintext")
    MODEL_IDENTITY = _Row(
        "model identity", PROVED,
        fix="load it with the model it was packed for, or rebuild it for this one (cubepack "
            "migrate --model)")
    ADAPTER_BASE = _Row(
        "adapter base", PROVED, optional=True,
        fix="load the adapter on the base model it was trained on, or migrate the cube "
            "(cubepack migrate --model)")
    REMOTE_MODEL = _Row(
        "remote model", CLAIMED, optional=True,
        fix="pass the pinned model with --model, or pin it again (cubepack pack --model)")
    RECOMPUTE = _Row(
        "recompute", PROVED, optional=True, plaintext=True,
        fix="rebuild the caches with the model that produced them (cubepack pack "
            "--recompute, or cubepack migrate --model)")
    PROVENANCE = _Row(
        "provenance", CLAIMED, optional=True, plaintext=True,
        fix="prove the caches (cubepack pack --recompute), or ask for less with "
            "--require-provenance")
    EMBEDDER = _Row(
        "embedder", PROVED, optional=True, plaintext=True,
        fix="re-embed the memory's vectors (text or preferences) with this embedder "
            "(cubepack migrate --embedder), or pass the embedder that made them")
