"""What ``verify`` checks of a cube's activations: each KV header against the lock and its
pinned producer, before anything is trusted (bytes and structure only: only files whose bytes
are the lock's are read); then, on a clear cube, the proofs the policy asks (recomputation by
the producer's own prefill, the provenance each label needs)."""

from __future__ import annotations

from typing import Any

from ..._util.budget import checkpoint
from ..._util.checks import Catalogue
from ..._util.paths import resolve_inside
from ...errors import CubepackError
from ...format.sections import Lock, Provenance
from ...identity._identity import compare
from ...kv._format import checksum_verdict, read_kv_header
from ...kv._recompute import describe, load_for_recompute
from ...kv._recompute import recompute as recompute_cache
from ...trust._evidence import (
    ASSERTED,
    PROVED,
    RECOMPUTED,
    RECORDED,
    STRENGTH,
    provenance_evidence,
    satisfies,
)
from ...trust._policy import TrustPolicy
from ...trust._report import VerifyReport
from . import _shards


def check_proofs(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    """Recomputation when asked; what backs each label, recorded; the provenance required."""
    recomputed = _check_recompute(report, lock, policy) if policy.asks(Catalogue.RECOMPUTE) \
        else {}
    _record_provenance(report, lock, recomputed)
    required = policy.required_provenance()
    if required is not None:
        _check_provenance(report, lock, required)


def check_headers(report: VerifyReport, lock: Lock, good: set[str]) -> None:
    if lock.private:
        for entry in (Catalogue.KV_HEADER, Catalogue.KV_CHECKSUMS):
            report.add(entry, "*", None, "skipped here: a private cube's KV files are "
                       "encrypted (with an identity they are checked once decrypted, below)")
    elif not lock.activations:
        report.add(Catalogue.KV_HEADER, "*", None, "skipped: the cube holds no activations")
    for item_id, entry in sorted(lock.activations.items()):
        subject = f"{entry.file} ({item_id})"
        if entry.file not in good:
            # Missing or not the lock's bytes: reported by the file checks, and never parsed
            # (a file whose hash failed is whoever changed it's input; load_kv_cache names the
            # tensor that changed, for a file the user chooses to open anyway).
            continue
        checkpoint(f"the KV header of {entry.file}")
        # A shard's memory whose range verify hashed: its header as parsed from those bytes
        # (and its tensors' verdict), not read and hashed again.
        proved = report.parsed_headers.get((entry.file, item_id))
        try:
            if isinstance(proved, CubepackError):
                raise proved
            info = proved[0] if proved is not None else _shards.read_header(report.cube_dir,
                                                                           entry)
        except CubepackError as exc:
            report.add(Catalogue.KV_HEADER, subject, False, str(exc))
            continue
        checkpoint(f"the tensor checksums of {entry.file}")
        ok, detail = proved[1] if proved is not None else checksum_verdict(info)
        report.add(Catalogue.KV_CHECKSUMS, subject, ok, detail)
        pinned = lock.models[entry.model_role].identity
        problems = [(f"producer.{m.field}", m.expected, m.found)
                    for m in compare(pinned, info.producer)]
        for key, expected, found in (("token_count", entry.token_count, info.token_count),
                                     ("kv_dtype", entry.kv_dtype, info.kv_dtype),
                                     ("num_layers", entry.num_layers, info.num_layers)):
            if expected != found:
                problems.append((key, expected, found))
        for key, expected, found in problems:
            report.add(Catalogue.KV_HEADER, subject, False,
                       f"{key} differs from the lock's pinned {entry.model_role} model",
                       expected, found)
        if not problems:
            report.add(Catalogue.KV_HEADER, subject, True,
                       "producer and shapes agree with the lock")


def _check_recompute(report: VerifyReport, lock: Lock,
                     policy: TrustPolicy) -> dict[str, dict[str, Any]]:
    """Recompute every activation with its producer; return what each full or sampled
    recomputation covered, for the activations it reproduced. An activation that cannot be
    recomputed (no token ids) is a refusal: recomputation was asked for."""
    if not lock.activations:
        return {}
    if any(c.name == Catalogue.MODEL_IDENTITY and c.ok is False for c in report.checks):
        report.add(Catalogue.RECOMPUTE, "*", False, "not run: the model differs from the pin")
        return {}
    loaded: dict[str, Any] = {}  # each activation by the pin of its own role, loaded once
    reproduced = {}
    plan = policy.recomputation()
    for item_id, entry in sorted(lock.activations.items()):
        checkpoint(f"the recomputation of {entry.file}")
        subject = f"{entry.file} ({item_id})"
        role = entry.model_role
        if role not in loaded:
            pin = lock.models[role]
            try:
                loaded[role] = load_for_recompute(policy.model_given(), pin.repo_id,
                                                  pin.revision, pin.identity.dtype)
            except CubepackError as exc:
                loaded[role] = exc
        live = loaded[role]
        if isinstance(live, CubepackError):
            report.add(Catalogue.RECOMPUTE, subject, False, f"cannot load the producer model "
                       f"({role}): {live}", role=role)
            continue
        info = _shards.read_header(report.cube_dir, entry)
        if not info.token_ids:
            report.add(Catalogue.RECOMPUTE, subject, False, NO_TOKEN_IDS)
            continue
        result = recompute_cache(live, info, item_id, sample=plan.sample, seed=plan.seed)
        report.add(Catalogue.RECOMPUTE, subject, result.ok, describe(result),
                   found=result.to_dict())
        if result.ok:
            # exact: the stored tensors ARE this process's prefill (what `sign` may state as
            # recomputed: inside the bound, a stored cache can still steer an answer).
            reproduced[item_id] = {"full": result.full, "positions": result.positions,
                                   "total": result.total, "seed": result.seed,
                                   "exact": result.full and result.identical}
    return reproduced


#: Why an activation without token ids is refused under recomputation, and the fix.
NO_TOKEN_IDS = ("records no token_ids, so it cannot be recomputed, and recomputation was asked "
                "for; re-pack it with `cubepack pack CUBE --recompute --model MODEL` (for MemOS "
                "caches the prompt ids are recovered through its chat template), or verify "
                "without --recompute to accept it unproven")


def _record_provenance(report: VerifyReport, lock: Lock,
                       recomputed: dict[str, dict[str, Any]]) -> None:
    for item_id, entry in sorted(lock.activations.items()):
        claimed = entry.provenance or Provenance(ASSERTED,  # lock version 1 had none
                                                 "a version-1 lock records none")
        report.provenance[item_id] = provenance_evidence(
            claimed, recomputed=recomputed.get(item_id), signed=report.signed, item=item_id)


def _check_provenance(report: VerifyReport, lock: Lock, required: str) -> None:
    for item_id, entry in sorted(lock.activations.items()):
        backing = report.provenance[item_id]
        ok = satisfies(backing, required)
        near = (backing["basis"] == PROVED and backing["kind"] == RECOMPUTED
                and backing["full"] and not backing.get("exact"))
        # "found recomputed (proved)" against "expected recomputed, proved" read as a pass:
        # say what fell short (not every position; not the prefill bit for bit).
        label = f"{backing['kind']} ({backing['basis']}" + \
            (", partial" if not backing["full"] and backing["kind"] == RECOMPUTED else
             ", within the dtype's noise, not bit for bit" if near else "") + ")"
        fix = ("the stored tensors are within the dtype's noise of the model's prefill, not "
               "that prefill (inside the bound a cache can still steer an answer): write the "
               + ("prefill into its clear source with `cubepack pack SOURCE --model MODEL "
                  "--recompute`, "
                  "then `cubepack encrypt` it again (pack refuses a private cube)"
                  if report.decrypted else
                  f"prefill with `cubepack pack {report.cube_dir} --model MODEL --recompute`")
               + ", or load with recompute=True (a recomputing load uses its own prefill)"
               if near else
               f"prove it with `cubepack verify {report.cube_dir} --recompute --model MODEL "
               f"--require-provenance {required}` (MODEL: the producer; every position), or "
               "verify a cube whose trusted signer established it (--trusted-key; a signer "
               "establishes what it proved: pack --sign-key, or cubepack sign --model MODEL "
               "--recompute)")
        report.add(Catalogue.PROVENANCE, f"{entry.file} ({item_id})", ok,
                   f"provenance is {label}: {backing['detail']}" + ("" if ok else
                   f"; {required} is required, proved now or signed: {fix}"),
                   f"{required}, proved or signed" if not ok else None,
                   label if not ok else None, basis=backing["basis"])
    if not lock.activations:
        report.add(Catalogue.PROVENANCE, "*", True, "the cube holds no activations", basis=PROVED)


def established(report: VerifyReport) -> frozenset[str]:
    """The activations whose lock labels a passed verification proved (what ``sign`` may
    state as proved): a cache recomputed bit for bit, or one whose header names a pin this
    run fingerprinted; never a label stronger than what was established."""
    activations = report.lock.activations if report.lock is not None else {}
    producers = report.proved_roles
    header_ok = {check.subject for check in report.checks
                 if check.name == Catalogue.KV_HEADER and check.ok is True}
    items = set()
    for item_id, entry in activations.items():
        label = entry.label or ASSERTED  # a version-1 lock recorded none
        backing = report.provenance.get(item_id) or {}
        if backing.get("basis") == PROVED and backing.get("kind") == RECOMPUTED \
                and backing.get("full") and backing.get("exact"):
            # Only a cache that IS the signer's prefill, bit for bit: one within the proof's
            # bound could still steer an answer, and a signature must not carry that as proved
            # (`pack --recompute` writes the prefill itself, then signs it as recomputed).
            established = RECOMPUTED
        elif entry.model_role in producers and f"{entry.file} ({item_id})" in header_ok:
            established = RECORDED  # its header names the pin this run fingerprinted
        else:
            continue
        # The lock's own label is what gets signed: proved when this run established at least
        # as much; the packer's word (asserted) is never this run's to prove.
        if label != ASSERTED and STRENGTH[established] >= STRENGTH[label]:
            items.add(item_id)
    return frozenset(items)
