"""The verification report: every check cubepack ran on a cube, with its outcome.

Shared by :mod:`cubepack.ops._verify` (local checks) and :mod:`cubepack.hub._remote` (checks
against the Hub's metadata), so both produce the same typed :class:`Check` values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.checks import Catalogue
from ..format.sections import Lock, Pin
from ..trust._evidence import PROVED, Basis, Signed


def pin_subject(role: str, pin: Pin) -> str:
    """How a report names a pinned model: ``act_mem (owner/model@<sha>)`` or a local folder."""
    if pin.where is not None:
        return f"{role} ({pin.where})"
    return f"{role} (local folder, pinned by weights digest)"




@dataclass
class Check:
    """One check and its outcome: ``ok`` is True (passed), False (failed) or None (skipped or
    not run, with the reason in ``detail``). ``name`` is the check's entry of the catalogue
    (:class:`~cubepack._util.checks.Catalogue`: a ``str``, its name, carrying its basis and
    fix). ``role`` names the model role a model check is about, so callers never parse
    ``subject``. ``basis`` says what the outcome rests on (a
    :class:`~cubepack._util.checks.Basis`; None when it did not run; by default the
    catalogue's)."""

    name: Catalogue
    subject: str
    ok: bool | None
    detail: str = ""
    expected: Any = None
    found: Any = None
    role: str | None = None
    basis: Basis | None = None
    #: For a private cube: ``public`` (checked on what anyone holds: ciphertexts, public lock,
    #: signature) or ``decrypted`` (checked on the plaintext opened in memory with an
    #: identity); None for a clear cube. Reports group the two so neither reads as the other.
    scope: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, Catalogue):  # a check is declared once, in the catalogue
            raise TypeError(f"a check is named by its entry of cubepack._util.checks.Catalogue, "
                            f"not {self.name!r}")
        if self.basis is None and self.ok is not None:
            self.basis = self.name.basis

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "subject": self.subject, "ok": self.ok, "detail": self.detail,
                "expected": self.expected, "found": self.found,
                "basis": None if self.basis is None else str(self.basis), "scope": self.scope}

    def __str__(self) -> str:
        text = f"{self.name} {self.subject}: {self.detail.rstrip('.')}"
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        return text


@dataclass
class VerifyReport:
    """Every check run on one cube; ``ok`` when none failed."""

    cube_dir: Path
    checks: list[Check] = field(default_factory=list)
    #: The cube's lock, parsed (its sections as frozen values), once its bytes were read.
    lock: Lock | None = None
    #: True once every file is proven intact (file set, sizes, sha256, content).
    intact: bool = False
    #: The trusted key whose valid signature covers the cube's files (cubepack.sig): who
    #: shipped these bytes. It makes no claim in them stronger: see ``signed``.
    signed_by: str | None = None
    #: What a trusted signer's attestation states it proved (the only ``signed`` evidence).
    signed: Signed | None = None
    #: The trusted key whose in-toto attestation names this lock and agrees with it.
    attested_by: str | None = None
    #: sha256 of the lock file's bytes as this process read and parsed them (an attestation's
    #: subject).
    lock_sha256: str | None = None
    #: Per activation: what its producer label is (``kind``) and what backs it (``basis``).
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: A private cube opened with an identity: its clear lock (from the decrypted manifest).
    #: Never serialised by ``to_dict``: it is the plaintext's description.
    private_lock: Lock | None = None
    #: This report is the decrypted pass over a private cube's plaintext (its fixes must say
    #: what works for a private cube: pack refuses one).
    decrypted: bool = False
    #: A partial pull (``pull --include``): ``{"checked": N, "memories": M, "repo_id",
    #: "commit_sha", "include"}``, the N memories present checked of the M the cube holds;
    #: None for a whole cube. A report with it is never the report of a complete cube.
    partial: dict[str, Any] | None = None
    #: Shards whose every byte this run proved through their index (each memory's range
    #: against its sha256, the padding zeros, the size the lock's) without computing the
    #: file's own sha256: the lock's digest of each is its word here (``sign`` hashes them
    #: before it signs it). Never serialised.
    index_proved: set[str] = field(default_factory=set, repr=False)
    #: Each shard memory's KV header as parsed from the range this run hashed (id -> the
    #: header and its tensors' verdict, or the error): read once. Never serialised.
    parsed_headers: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    @property
    def complete(self) -> bool:
        """Every check passed and the cube is whole: ``ok`` of a partial pull says only that
        the memories present passed (``partial`` says how many of how many)."""
        return self.ok and self.partial is None

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    @property
    def proved_roles(self) -> frozenset[str]:
        """The roles whose pinned model this verification fingerprinted itself, and found the
        pin's (what a signer may state as proved)."""
        return frozenset(check.role for check in self.checks
                         if check.name == Catalogue.MODEL_IDENTITY and check.ok is True
                         and check.basis == PROVED and check.role)

    def add(self, name: Catalogue, subject: str, ok: bool | None, detail: str = "",
            expected: Any = None, found: Any = None, role: str | None = None,
            basis: Basis | None = None) -> bool:
        self.checks.append(Check(name, subject, ok, detail, expected, found, role, basis))
        return ok is not False

    def extend(self, checks: list[Check]) -> None:
        self.checks.extend(checks)

    def finish(self, reason: str, asked: list[Catalogue]) -> None:
        """List each check that did not run as ``not run`` (with ``reason``): every mandatory
        one, and the optional ones in ``asked``; then put the report in the catalogue's
        order."""
        ran = {check.name for check in self.checks}
        order = list(Catalogue)
        for entry in order[1:]:  # the first, the folder itself, always runs
            if entry not in ran and (not entry.optional or entry in asked):
                self.add(entry, "*", None, reason)
        self.checks.sort(key=lambda check: order.index(check.name))

    def group_scopes(self) -> None:
        """A private cube's report in two parts, each in the checks' own order: what anyone
        can check (every check without a scope is one of those), then what the key opened."""
        for check in self.checks:
            check.scope = check.scope or "public"
        self.checks.sort(key=lambda check: check.scope == "decrypted")

    def to_dict(self) -> dict[str, Any]:
        return {"cube_dir": str(self.cube_dir), "ok": self.ok, "complete": self.complete,
                "digest": None if self.lock is None else self.lock.digest,
                "signed_by": self.signed_by,
                "attested_by": self.attested_by,
                "partial": self.partial,
                "checks": [c.to_dict() for c in self.checks],
                "provenance": {item: {**entry, "basis": str(entry["basis"])}
                               for item, entry in self.provenance.items()}}
