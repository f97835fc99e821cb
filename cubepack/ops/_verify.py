"""``cubepack verify``: prove a cube is exactly what its producer packed.

Every check is recorded with its outcome, so a report (or ``--json``) shows what passed as well
as what failed. Order matters for safety: the lock is parsed and its paths checked before any
file is opened, sizes are compared before bytes are hashed, and a model is only fingerprinted
after the files it will be compared with are proven intact. No torch import: KV headers are
read as JSON.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.budget import checkpoint
from .._util.checks import Catalogue
from .._util.hashing import hash_files
from .._util.paths import hf_snapshot_blobs, resolve_inside, scan_cube
from .._util.quiet import terminal_bars
from ..errors import (
    CubepackError,
    IntegrityError,
    ModelNotFoundError,
    UnsafeInputError,
    UsageError,
    VerificationFailed,
)
from ..format import _cubeconfig as cubeconfig
from ..format import _lock as lockfile
from ..format import _partial as partialformat
from ..format._content import file_problem
from ..format._diff import leaves
from ..format._fileset import is_tolerated
from ..format.sections import Lock, Pin, shards
from ..identity._fingerprint import fingerprint, resolve_model_folder
from ..identity._identity import compare
from ..kinds import KINDS, counted
from ..memos_format._layout import memos_config_problems, read_config
from ..trust import _age as age
from ..trust import _generation as generations
from ..trust._attestation import (attestation_check, chain_checks, signed_statements,
                                  signs_memories_only)
from ..trust._evidence import CLAIMED, PROVED, SIGNED, backs_a_pin
from ..trust._policy import TrustPolicy
from ..trust._report import Check, VerifyReport, pin_subject
from ..trust._signing import verify_signature
from . import _partial
from ._private import is_private, open_private, recipient_stanzas

__all__ = ["Check", "VerifyReport", "require_file_digests", "verify", "verify_for_upgrade"]

@terminal_bars
def verify(cube_dir: str | Path, policy: TrustPolicy | None = None, *,
           progress: bool | None = None, raise_on_failure: bool = True,
           hashed: dict[str, str] | None = None,
           decrypt_with: str | os.PathLike[str] | None = None, **options: Any) -> VerifyReport:
    """Verify the cube at ``cube_dir`` against its ``cubepack.lock``, locally.

    Args:
        policy: what must hold beyond the lock (see :class:`TrustPolicy`): the model to check
            the pins against (without one, a pinned revision in the HF cache is checked;
            otherwise that check is reported as skipped), trusted keys, recomputation,
            provenance, the embedder. ``options`` are its fields, for convenience
            (``verify(cube, model=..., recompute=True)``).
        raise_on_failure: raise :class:`VerificationFailed` when any check fails.
        hashed: sha256 of files this process has just hashed itself from the very bytes in
            the cube (``pull`` hashes each file as its download completes, overlapping hashing
            with the network); those files are not read twice. Never pass digests you did not
            compute.
        decrypt_with: an identity file (age or OpenSSH private key) opening a private cube:
            its files are decrypted in memory (a RAM folder, never a disk) and every check a
            clear cube gets runs on them. Without it a private cube's structure, ciphertext
            digests and signature are checked, and what needs its plaintext is reported so.

    Checks against a Hub's file metadata are :func:`cubepack.hub.verify_remote`'s.

    Returns:
        a ``VerifyReport``: every check with its outcome and basis (proved, signed or
        claimed), the signer, and what backs each activation's producer label. With
        ``raise_on_failure`` (the default) a failed check raises instead.

    Example:
        ```python
        report = cubepack.verify("my-cube", model="org/model-a", recompute=True)
        for check in report.checks:
            print(check.name, check.ok)
        ```
    """
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("verify")
    return _verify(Path(cube_dir), policy, progress, raise_on_failure, hashed or {},
                   decrypt_with=decrypt_with)


def verify_for_upgrade(cube_dir: str | Path, *, progress: bool | None = None) -> VerifyReport:
    """What ``cubepack upgrade`` proves before it touches a cube: everything :func:`verify`
    checks without options, for a lock of version 2 or of version 1 (cubepack 0.1: the same
    layout, pins without a compute config, activations without provenance), as far as version 1
    allows: the lock's structure, paths and digests, the file set, sizes, sha256, content, each
    KV header against the lock's pin, ``cubepack.yaml``. A version-1 pin cannot be compared with
    a model (it has no compute config); upgrade checks each KV file against its model instead.

    Raises:
        VerificationFailed: naming every check that failed.
    """
    return _verify(Path(cube_dir), TrustPolicy(), progress, True, {}, accept_version_1=True)


def verify_fetched_later(cube_dir: str | Path, policy: TrustPolicy,
                         origin: tuple[str, str, str]) -> VerifyReport:
    """What a load on first use (the MemOS hook's ``on_demand``) verifies before anything is
    built: ``cube_dir`` holds every file of its cube but the activation memories, which the
    caller fetches from ``origin`` (repo id, repo type, commit) and checks when each is first
    used. Every check runs on the files here; that the memories are absent is the partial
    cube's rule (``_partial.later``: a memory file here is refused), and the ``partial`` check
    says they are fetched later, never that they passed.

    Raises:
        VerificationFailed: a check failed.
    """
    return _verify(Path(cube_dir), policy, None, True, {}, later=origin)


def _verify(cube_dir: Path, policy: TrustPolicy, progress: bool | None, raise_on_failure: bool,
            hashed: dict[str, str], *, accept_version_1: bool = False,
            decrypt_with: str | os.PathLike[str] | None = None,
            decrypted: bool = False, later: tuple[str, str, str] | None = None) -> VerifyReport:
    report = VerifyReport(cube_dir, decrypted=decrypted)
    lock = _check_lock(report, accept_version_1)
    reason = "not run: the lock could not be read"
    if lock is not None and decrypt_with is not None and is_private(lock):
        _check_identity(report, decrypt_with)
    if lock is not None:
        report.lock = lock
        # A partial pull (its marker): the memories it lacks are absent by design, and every
        # byte it holds is checked as a whole cube's (ops/_partial.py).
        partial = None if decrypted else (_partial.plan(report, lock) if later is None
                                          else _partial.later(report, lock, later))
        report.intact, good = _check_files(report, lock, progress, hashed, partial)
        parsed, lock = lock, _check_shards(report, lock, good, partial)
        report.lock = lock
        if partial is not None:
            report.intact = report.intact and not partial.failed
            if not partial.failed:
                _partial.summary(report, parsed, partial, policy.asked_checks())
        # A file whose bytes are not the lock's is attacker input: never parsed further.
        checkpoint("the files' hashes")
        for kind in KINDS:
            kind.check_bytes(report, lock, good)
        _check_config(report, lock, good)
        checkpoint("the KV headers, adapters and cubepack.yaml")
        reason = "not run: the cube's files failed the checks above"
        if report.intact:
            _check_signature(report, policy)
            _check_attestation(report, lock, policy)
            checkpoint("the signature and attestations")
            if is_private(lock):
                _check_public_private(report, lock, policy)
            failed_trust = sorted({c.name for c in report.checks
                                   if c.name.trust and c.ok is False})
            if is_private(lock) and decrypt_with is not None and failed_trust:
                # SECURITY.md: refused before anything is decrypted. The sender the policy
                # asked to authenticate was not (or sent an older revision, or other
                # readers): the reader's key never opens their bytes.
                report.add(Catalogue.PRIVATE, "*", None,
                           f"not decrypted: the {' and '.join(failed_trust)} check failed, so "
                           f"nothing in the cube was opened with {Path(decrypt_with).name}.")
            elif is_private(lock):
                _check_private(report, lock, policy, progress, decrypt_with)
            elif lock.version == 1:
                report.add(Catalogue.MODEL_IDENTITY, "*", None, "skipped: a version-1 pin "
                           "records no compute config (upgrade checks each KV file against its "
                           "model)")
            else:
                _check_models(report, lock, policy)
            if not is_private(lock):
                _check_clear(report, lock, policy)
    report.finish(reason, policy.asked_checks())
    if lock is not None and is_private(lock):
        report.group_scopes()  # the public pass, then the decrypted one
    if raise_on_failure and not report.ok:
        raise VerificationFailed(report)
    return report


def _check_identity(report: VerifyReport, identity: str | os.PathLike[str]) -> None:
    """The reader's own key file, before any check of the cube: a typo or a key others can
    read is the reader's mistake (UsageError, UnsafeInputError), never a refused cube."""
    try:
        age.load_identities(identity)
    except (UsageError, UnsafeInputError) as exc:
        report.add(Catalogue.PRIVATE, "*", False, f"not decrypted: {exc}")
        report.finish(f"not run: the identity file {identity} cannot be used", [])
        exc.report = report  # type: ignore[attr-defined] - the CLI's --json carries it
        raise


def _check_clear(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    """What a clear cube's contents prove, once its files are intact and its pins checked."""
    if policy.asks(Catalogue.MODEL_IDENTITY):
        require_checked_models(report)
    checkpoint("the model checks")
    for kind in KINDS:
        kind.check_proofs(report, lock, policy)
    checkpoint("the proofs asked for")


#: How a verify's record of a generation says where it was seen.
SEEN_HERE = "in a verify or pull on this machine"


def _check_public_private(report: VerifyReport, lock: Lock,
                          policy: TrustPolicy) -> None:
    """What anyone can check of a private cube's readers and revision, without a key: every
    ciphertext's age header names as many recipients as the public lock counts (a reader
    added to, or removed from, the files is seen), and its signed generation is not older
    than one this user has seen (a replay)."""
    expected = lock.encryption.counts.recipients
    try:
        stanzas = recipient_stanzas(report.cube_dir, lock)
    except CubepackError as exc:
        report.add(Catalogue.RECIPIENTS, "*", False, str(exc))
    else:
        wrong: dict[tuple[int, tuple[str, ...]], list[str]] = {}
        for name, (count, others) in sorted(stanzas.items()):
            if count != expected or others:
                wrong.setdefault((count, tuple(others)), []).append(name)
        for (count, others), names in sorted(wrong.items()):
            more = f" and {len(names) - 1} more ciphertext(s)" if len(names) > 1 else ""
            report.add(Catalogue.RECIPIENTS, names[0] + more, False,
                       f"{'their' if more else 'its'} age header names other readers than the "
                       "public lock counts"
                       + (f" (and stanzas of a kind cubepack never writes: "
                          f"{', '.join(others)})" if others else "")
                       + ": someone added or removed a reader, or changed the count",
                       expected, count)
        if not wrong:
            report.add(Catalogue.RECIPIENTS, "*", True, f"every ciphertext's age header names "
                       f"{expected} recipient(s), as the public lock counts them (who they "
                       "are is not public for age keys)")
    report.checks.append(generations.seen_check(lock, report.signed_by,
                                                list(policy.trusted()), where=SEEN_HERE))


def _check_private(report: VerifyReport, lock: Lock, policy: TrustPolicy,
                   progress: bool | None, identity: str | os.PathLike[str] | None) -> None:
    """A private cube, its ciphertexts intact and its signature checked. Without an identity:
    its public pins are checked, and what needs the plaintext is skipped (or refused, when the
    policy asked for it). With one: the cube is decrypted in memory and verified as the clear
    cube it is, every check run (the pins, recomputation, provenance, the embedder...)."""
    needs_plaintext = [entry for entry in policy.asked_checks() if entry.plaintext]
    if identity is None:
        _check_models(report, lock, policy)
        if policy.asks(Catalogue.MODEL_IDENTITY):
            require_checked_models(report)
        counts = lock.encryption.counts
        report.add(Catalogue.PRIVATE, "*", False if needs_plaintext else None,
                   f"{'refused' if needs_plaintext else 'skipped'}: a private cube ("
                   f"{counted(counts.files, counts.to_dict())}, encrypted to "
                   f"{counts.recipients} recipient(s)); its contents "
                   + (f"are needed for {', '.join(needs_plaintext)}, which was asked for"
                      if needs_plaintext else "were not checked")
                   + ". Pass an identity (--identity KEY or CUBEPACK_IDENTITY) to decrypt them "
                   "in memory and check them.")
        return
    try:
        with open_private(report.cube_dir, identity, public_lock=lock) as opened:
            # Who sent the cube was the public pass's to check (it checked the ciphertexts).
            inner_policy = policy.without(Catalogue.SIGNATURE, Catalogue.LINEAGE)
            # The digests open_private took of the very plaintexts it wrote: not hashed twice.
            inner = _verify(opened.folder, inner_policy, progress, False, dict(opened.digests),
                            decrypted=True)
            folder = str(opened.folder)
    except CubepackError as exc:
        report.add(Catalogue.PRIVATE, "*", False, str(exc))
        return
    report.add(Catalogue.PRIVATE, "*", True, f"decrypted in memory with {Path(identity).name}: "
               f"{len(opened.manifest['names'])} ciphertexts, each the plaintext its manifest "
               "records; the public lock agrees with the private one")
    report.checks[-1].scope = "decrypted"  # heads the checks run on the plaintext
    for check in inner.checks:
        if check.name.public_only:  # the outer pass ran it on what anyone holds
            continue
        check.detail = check.detail.replace(folder, str(report.cube_dir))
        check.subject = check.subject.replace(folder, str(report.cube_dir))
        check.scope = "decrypted"
        report.checks.append(check)
    report.provenance = inner.provenance
    report.private_lock = inner.lock


def _check_lock(report: VerifyReport, accept_version_1: bool) -> Lock | None:
    path = report.cube_dir / constants.LOCK_FILENAME
    if not report.cube_dir.is_dir() or report.cube_dir.is_symlink():
        report.add(Catalogue.CUBE, str(report.cube_dir), False, "is not a folder (or is a symlink)")
        return None
    blobs = hf_snapshot_blobs(report.cube_dir)
    cached = path.is_symlink() and blobs is not None and path.resolve().parent == blobs.resolve()
    if (path.is_symlink() and not cached) or not path.is_file():
        report.add(Catalogue.LOCK, constants.LOCK_FILENAME, False,
                   "missing: this folder was not packed by cubepack (run `cubepack pack`)")
        return None
    data = path.read_bytes()
    try:
        lock = lockfile.parse(data, accept_version_1=accept_version_1)
    except CubepackError as exc:
        report.add(Catalogue.LOCK, constants.LOCK_FILENAME, False, str(exc))
        return None
    report.lock_sha256 = hashlib.sha256(data).hexdigest()
    report.add(Catalogue.LOCK, constants.LOCK_FILENAME, True,
               f"version {lock.version}, digest {lock.digest}")
    return lock


def _check_files(report: VerifyReport, lock: Lock, progress: bool | None,
                 hashed: dict[str, str],
                 partial: _partial.Plan | None = None) -> tuple[bool, set[str]]:
    """File set, then sizes, then sha256 (parallel), then each file's content parser (only
    files whose bytes are the lock's, and the tolerated ones). (every file intact, the listed
    files whose size and sha256 matched)."""
    on_disk, problems = scan_cube(report.cube_dir)
    for where, what in problems:
        report.add(Catalogue.PATH, where, False, what)
    if not problems:
        report.add(Catalogue.PATH, "*", True, "no symlinks, special files or unsafe names")
    listed = lock.files
    absent = partial.absent if partial is not None else set()
    sparse = partial.sparse if partial is not None else set()
    if partial is not None:
        _partial.check_present(report, partial, set(on_disk))
    missing = sorted(set(listed) - set(on_disk) - absent)
    unlisted = sorted(name for name in set(on_disk) - set(listed) if not is_tolerated(name))
    for name in missing:
        report.add(Catalogue.FILE_SET, name, False, "missing from the cube", "present", "absent")
    for name in unlisted:
        report.add(Catalogue.FILE_SET, name, False, "not listed in the lock", "absent", "present")
    if not missing and not unlisted and not problems:
        report.add(Catalogue.FILE_SET, "*", True,
                   f"the {len(listed)} files listed in the lock, no other" if not absent else
                   f"the {len(set(listed) - absent)} of the lock's {len(listed)} files a "
                   f"partial cube holds ({len(absent)} memory files absent, "
                   + ("fetched on first use" if partial is not None and partial.later
                      else "as its marker says") + "), no other")
    to_hash = []
    here = (set(listed) & set(on_disk)) - absent
    for name in sorted(here):
        size = resolve_inside(report.cube_dir, name).stat().st_size
        if size != listed[name].size:
            report.add(Catalogue.SIZE, name, False, "size differs", listed[name].size, size)
        else:
            to_hash.append(name)
    sized = len(to_hash) == len(here)
    sparse_here = sparse & set(to_hash)  # of the lock's size: their ranges are checked below
    # A shard without dead bytes is every byte its index lays out (the memories tile it): its
    # ranges, hashed once against the index (_check_shards), prove it; its own sha256 is not
    # computed as well (a second pass over every byte). Where this process hashed it already
    # (a pull), that digest is compared as any file's.
    by_index = {shard.path for shard in lock.shards.values()
                if shard.dead == 0 and shard.path not in hashed} & set(to_hash)
    report.index_proved = by_index - sparse
    to_hash = [name for name in to_hash if name not in sparse]  # their ranges: _check_shards
    if sized:
        report.add(Catalogue.SIZE, "*", True,
                   f"the {len(to_hash)} files listed in the lock have the sizes it records")
    to_hash = [name for name in to_hash if name not in by_index]
    digests = hash_files([resolve_inside(report.cube_dir, n) for n in to_hash if n not in hashed],
                         progress=progress, description="verifying")
    by_name = {path.relative_to(report.cube_dir).as_posix(): d for path, d in digests.items()}
    by_name.update({name: hashed[name] for name in to_hash if name in hashed})
    bad = 0
    for name in to_hash:
        if by_name[name] != listed[name].sha256:
            bad += 1
            report.add(Catalogue.SHA256, name, False, "content differs", listed[name].sha256,
                       by_name[name])
    if to_hash and not bad:
        report.add(Catalogue.SHA256, "*", True,
                   f"the {len(to_hash)} files listed in the lock hashed, all match"
                   + (f" (and {len(report.index_proved)} shard(s) proved byte by byte through "
                      "their index instead: see the shards checks)"
                      if report.index_proved else ""))
    good = {name for name in to_hash if by_name[name] == listed[name].sha256}
    pickles = _check_content(report, sorted(name for name in on_disk
                                            if name in good or (name not in listed
                                                                and is_tolerated(name))))
    good |= sparse_here
    return not (missing or unlisted or problems or bad or pickles or not sized), good


def _check_shards(report: VerifyReport, lock: Lock, good: set[str],
                  partial: _partial.Plan | None = None) -> Lock:
    """A sharded cube: each index (its bytes and its shard's the lock's) checked against the
    lock and its shard, each memory's range against its sha256; the lock returned with the
    memories of every shard that passed (what the kinds' checks then read). A partial cube:
    its absent shards skipped, its sparse ones checked range by range (``_partial``), and
    the lock returned with the memories present only."""
    own = lock if partial is None else partialformat.present(lock, partial.marker)
    if not lock.shards:
        return own
    fetch = shards.local_fetch(report.cube_dir)
    to_prove: list[tuple[Any, Any]] = []  # each shard and its index, proved in one pool
    held: dict[str, Any] = {}
    seen: dict[str, Any] = {}  # every memory of the indexes read: each listed once
    failed = False
    for shard in lock.shards.values():
        subject = f"{shard.index} ({shard.path})"
        if partial is not None and shard.path in partial.absent:
            continue  # not pulled: neither it nor its index is here (checked above)
        if partial is not None and shard.path in partial.sparse:
            if shard.path not in good or shard.index not in good:
                report.add(Catalogue.PARTIAL, f"{shard.path} (partial)", None, "not run: the "
                           "shard or its index is missing or not the lock's (reported above)")
                continue
            try:
                index = shards.load_index(shard, fetch, lock.models)
                shards.add_memories(seen, index, lock)
            except CubepackError as exc:
                report.add(Catalogue.SHARDS, subject, False, str(exc))
                failed = True
                continue
            held.update(_partial.check_sparse(report, lock, partial, shard, index))
            continue
        by_index = shard.path in report.index_proved
        if (shard.path not in good and not by_index) or shard.index not in good:
            report.add(Catalogue.SHARDS, subject, None, "not run: the shard or its index is "
                       "missing or not the lock's bytes (reported above)")
            if by_index:
                _not_proved(report, shard, "its index is missing or not the lock's bytes")
            continue
        try:
            index = shards.load_index(shard, fetch, lock.models)
            shards.add_memories(seen, index, lock)
        except CubepackError as exc:
            report.add(Catalogue.SHARDS, subject, False, str(exc))
            failed = True
            if by_index:
                _not_proved(report, shard, "its index was refused (see the shards check)")
            continue
        to_prove.append((shard, index))
    proofs: dict[str, Any] = {}
    for kind in KINDS:  # the kind owning the indexed files proves their bytes
        proofs.update(kind.prove_indexed(report.cube_dir, [index for _, index in to_prove]))
    for shard, index in to_prove:
        subject = f"{shard.index} ({shard.path})"
        proof = proofs[shard.path]
        if proof.error is not None:
            report.add(Catalogue.SHARDS, subject, False, str(proof.error))
            failed = True
            if shard.path in report.index_proved:
                _not_proved(report, shard, "its bytes are not the ones its index lays out "
                            "(see the shards check)")
            continue
        report.parsed_headers.update({(shard.path, item): header
                                  for item, header in proof.headers.items()})
        held.update(index.memories)
        if shard.path in report.index_proved:
            good.add(shard.path)
            report.add(Catalogue.SHA256, shard.path, True, "every byte proved through its "
                       f"index: its {len(index.memories)} memories' ranges hash to the sha256 "
                       "the index records (the index is the lock's bytes), the padding between "
                       "them is zeros and its size is the lock's; the file's own sha256 was "
                       f"not computed (the lock's {shard.locator.sha256} is its word here; "
                       "sign and pull compute it)", basis=CLAIMED)
        report.add(Catalogue.SHARDS, subject, True,
                   f"{len(index.memories)} memories: the index agrees with the lock and its "
                   "shard, every range inside it, in order, each hashing to its sha256"
                   + (", the padding zeros: every byte of the shard"
                      if shard.path in report.index_proved else ""))
    if failed:
        report.intact = False
    return shards.with_memories(own, held)


def require_file_digests(report: VerifyReport, progress: bool | None = None) -> None:
    """Hash the shards ``report`` proved through their index only, against the lock's sha256
    of each: a step that states the lock's file digests (a signature over them) rests on no
    digest this process did not compute. IntegrityError naming the first that differs."""
    if report.lock is None or not report.index_proved:
        return
    names = sorted(report.index_proved)
    digests = hash_files([resolve_inside(report.cube_dir, name) for name in names],
                         progress=progress, description="hashing")
    for name in names:
        found = digests[resolve_inside(report.cube_dir, name)]
        expected = report.lock.files[name].sha256
        if found != expected:
            raise IntegrityError(f"{name} hashes to {found}; the lock says {expected}, while "
                                 "every byte of it is the one its index lays out: the lock "
                                 "misstates the shard's digest. Nothing was signed. Pack the "
                                 "cube again (pack writes the digest of the bytes it wrote).")
    report.index_proved = set()


def _not_proved(report: VerifyReport, shard: Any, why: str) -> None:
    """The sha256 row of a shard verify meant to prove through its index, and could not: not
    run (the failure is the one named, once; the cube is not intact)."""
    report.add(Catalogue.SHA256, shard.path, None, f"not run: {why}; the file's own sha256 "
               "was not computed either")


def _check_content(report: VerifyReport, names: list[str]) -> bool:
    """Every file is read by a strict parser for its kind, tolerated files included, and none
    is or holds a pickle, whatever the lock says. True when a file was refused."""
    problems = [(name, reason) for name in names
                if (reason := file_problem(resolve_inside(report.cube_dir, name), name))]
    config = _memos_config(report.cube_dir, names, problems)
    problems += memos_config_problems(config, names)
    for name, reason in problems:
        report.add(Catalogue.CONTENT, name, False, reason)
    if not problems:
        listed = sum(1 for name in names
                     if report.lock is not None and name in report.lock.files)
        report.add(Catalogue.CONTENT, "*", True, f"the {listed} files listed in the lock and "
                   f"{len(names) - listed} more it tolerates (the lock, a signature, tool "
                   "bookkeeping) read by a strict parser for their kind; none is or holds a pickle")
    return bool(problems)


def _memos_config(cube: Path, names: list[str], problems: list[tuple[str, str]]) -> dict[str, Any]:
    """MemOS's config.json when present and valid (already checked as JSON), else {}."""
    if any(refused == constants.MEMOS_CONFIG for refused, _ in problems):
        return {}
    return read_config(cube, names)




def _check_config(report: VerifyReport, lock: Lock, good: set[str]) -> None:
    path = report.cube_dir / constants.CONFIG_FILENAME
    if constants.CONFIG_FILENAME not in lock.files:
        report.add(Catalogue.CUBE_CONFIG, "*", None, "skipped: the lock lists no cubepack.yaml")
        return
    if constants.CONFIG_FILENAME not in good:
        report.add(Catalogue.CUBE_CONFIG, constants.CONFIG_FILENAME, None,
                   "not run: the file is missing or not the lock's bytes (reported above)")
        return
    try:
        config = cubeconfig.parse(path.read_text(encoding="utf-8"))
    except (CubepackError, UnicodeDecodeError) as exc:
        report.add(Catalogue.CUBE_CONFIG, constants.CONFIG_FILENAME, False, str(exc))
        return
    # Every field cubepack.yaml states, as the one view build writes (format/_cubeconfig).
    expected = {"cube_id": lock.cube_id,
                "models": {role: cubeconfig.pin_view(pin) for role, pin in lock.models.items()},
                **{kind.section: cubeconfig.section_view(kind.section, lock.entries(kind.section))
                   for kind in KINDS if kind.in_config and kind.section}}
    stated = {"cube_id": config.get("cube_id"), "models": config.get("models") or {},
              **{key: config.get(key) or {} for key in expected if key not in ("cube_id",
                                                                             "models")}}
    agree = True
    for change in leaves(expected, stated):
        agree = report.add(Catalogue.CUBE_CONFIG, change["field"], False,
                           "cubepack.yaml disagrees with cubepack.lock", change["old"],
                           change["new"])
    if agree:
        report.add(Catalogue.CUBE_CONFIG, constants.CONFIG_FILENAME, True,
                   "pins agree with the lock")


def _check_signature(report: VerifyReport, policy: TrustPolicy) -> None:
    signed = (report.cube_dir / constants.SIGNATURE_FILENAME).is_file()
    trusted_keys = list(policy.trusted())
    if not policy.asks(Catalogue.SIGNATURE):
        report.add(Catalogue.SIGNATURE, constants.SIGNATURE_FILENAME, None,
                   "skipped: no trusted key given" if signed else "skipped: the cube is unsigned")
        return
    try:
        # A partial cube's files are not the signed ones (its sparse shards): the signature is
        # checked over its lock, whose digests bind every file, each byte here checked against
        # them (ops/_partial.py).
        key = verify_signature(report.cube_dir, trusted_keys) if report.partial is None \
            else _partial.verify_lock_signature(report.cube_dir, trusted_keys)
    except CubepackError as exc:  # unsigned or untrusted: nothing trusted stands behind it
        key = _memories_signer(report, policy) if report.partial is None else None
        if key is None:
            report.add(Catalogue.SIGNATURE, constants.SIGNATURE_FILENAME, False, str(exc),
                       basis=PROVED)
            return
        # Compacted since signing: the memories are signed, the layout is not; said so.
        report.signed_by = key
        report.add(Catalogue.SIGNATURE, constants.SIGNATURE_FILENAME, True,
                   f"the cube's memories are signed by trusted key {key} (its attestation names "
                   "every memory, the pins and every other file by sha256, and each is this "
                   "cube's), not its layout: the lock, shards and indexes were re-laid out "
                   f"since signing, as compact does, and {constants.SIGNATURE_FILENAME}, which "
                   f"named those files, does not cover them ({exc})", basis=SIGNED)
        return
    report.signed_by = str(key)
    report.add(Catalogue.SIGNATURE, constants.SIGNATURE_FILENAME, True,
               f"signed by trusted key {key}")


def _memories_signer(report: VerifyReport, policy: TrustPolicy) -> str | None:
    """The trusted key of a version-4 attestation that verifies over this whole cube's
    memories, pins and files but names another lock (a compacted cube), or None."""
    if report.lock is None:
        return None
    _, envelope, key = attestation_check(report.cube_dir, report.lock, report.lock_sha256 or "",
                                         policy.trusted(), False)
    return key if signs_memories_only(envelope, report.lock_sha256 or "") else None


def _check_attestation(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    """The lock's signed attestation, when present and keys are given (required with
    ``require_lineage``), then the chain of its ancestors' attestations when asked."""
    checks, envelope, key = attestation_check(report.cube_dir, lock, report.lock_sha256 or "",
                                              policy.trusted(),
                                              policy.asks(Catalogue.LINEAGE),
                                              _partial.present(report))
    report.extend(checks)
    report.attested_by = key
    report.signed = (signed_statements(envelope, key) if envelope is not None and key is not None
                     else None)
    if policy.asks(Catalogue.LINEAGE):
        report.extend(chain_checks(report.cube_dir, lock, envelope, policy.trusted()))


def _check_models(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    model, recompute = policy.model_given(), policy.asks(Catalogue.RECOMPUTE)
    if not any(pin.strict and pin.pinned for pin in lock.models.values()):
        report.add(Catalogue.MODEL_IDENTITY, "*", None,
                   "skipped: the cube pins no producer (it holds no activations)")
    for role, pin in sorted(lock.models.items()):
        if not pin.strict or pin.identity is None:
            continue
        pinned = pin.identity
        subject = pin_subject(role, pin)
        try:
            if model is not None:
                # A folder does not say what dtype it will run in; we check it as run in the
                # pinned dtype (different weights still differ). A loaded model reports its own.
                live = fingerprint(model) if not isinstance(model, (str, Path)) \
                    else fingerprint(str(model), revision=None, dtype=pinned.dtype)
                base = model if not isinstance(model, (str, Path)) \
                    else resolve_model_folder(str(model))[0]
            elif pin.repo_id and pin.revision:
                folder, _, _ = resolve_model_folder(pin.repo_id, pin.revision,
                                                    local_files_only=True)
                live = fingerprint(folder, dtype=pinned.dtype)
                base = folder
            else:
                _signed_pin_or_skip(report, role, pin, subject,
                                    "no model given (--model) and the pin has no Hub revision")
                continue
        except ModelNotFoundError:
            if model is not None:  # the caller's --model names nothing: their input, not the cube
                raise
            _signed_pin_or_skip(report, role, pin, subject, "the pinned revision is not in "
                                "the HF cache (pass --model, or use verify --remote)")
            continue
        except CubepackError as exc:
            if model is not None or isinstance(exc, IntegrityError):  # a corrupt cached blob
                report.add(Catalogue.MODEL_IDENTITY, subject, False, str(exc), role=role)
            else:
                _signed_pin_or_skip(report, role, pin, subject, "the pinned revision is not in "
                                    "the HF cache (pass --model, or use verify --remote)")
            continue
        mismatches = compare(pinned, live)
        for mismatch in mismatches:
            report.add(Catalogue.MODEL_IDENTITY, f"{subject} {mismatch.field}", False,
                       "the model differs from the pin"
                       + "".join(kind.model_note(role) for kind in KINDS),
                       mismatch.expected, mismatch.found, role=role)
        if not mismatches:
            report.add(Catalogue.MODEL_IDENTITY, subject, True, "the model matches the pin",
                       role=role)
            if model is None or isinstance(model, (str, Path)):
                # A folder's bytes were fingerprinted as run in the pinned dtype: what it runs
                # in is a setting, not in its files, so that field is the pin's own word.
                advice = ("--recompute ran it in that dtype: see the recompute check"
                          if recompute else "verify with the loaded model, or --recompute, "
                          "which runs it in that dtype")
                report.add(Catalogue.MODEL_IDENTITY, f"{subject} dtype", True,
                           f"not proved: a folder does not say which dtype it runs in; the "
                           f"pin says {pinned.dtype} ({advice})", role=role, basis=CLAIMED)
        for kind in KINDS:
            kind.check_base(report, lock, role, base)


def _signed_pin_or_skip(report: VerifyReport, role: str, pin: Pin, subject: str,
                        why: str) -> None:
    """No model here to fingerprint: the pin is backed by a trusted signer's own fingerprint
    when its attestation states it proved it (signed), else the check is skipped."""
    signed = report.signed
    if signed is not None and role in signed.producers:
        report.add(Catalogue.MODEL_IDENTITY, subject, True, f"not checked here ({why}); the "
                   f"pin is the fingerprint the signer of trusted key {signed.key} took of the "
                   "model",
                   role=role, basis=SIGNED)
    else:
        report.add(Catalogue.MODEL_IDENTITY, subject, None, f"skipped: {why}", role=role)


def require_checked_models(report: VerifyReport) -> None:
    """``strict_models``: a pinned producer that no model was fingerprinted against (here, or
    by a trusted signer) is a refusal, not a skip. The Hub's file metadata (``remote model``)
    is the Hub's claim and does not satisfy it."""
    for role, pin in sorted(report.lock.models.items() if report.lock is not None else ()):
        if not pin.strict or pin.identity is None:
            continue
        if not any(c.role == role and backs_a_pin(c) for c in report.checks):
            report.add(Catalogue.MODEL_IDENTITY, pin_subject(role, pin), False,
                       "unverified: no model was fingerprinted against the pin, here or by a "
                       "trusted signer, and strict models were required (pass --model with the "
                       "producer; the Hub's file metadata is its claim, not a proof)",
                       role=role, basis=PROVED)



