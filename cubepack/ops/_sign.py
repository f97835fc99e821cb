"""``cubepack sign``: verify a cube, then sign it (a signature never blesses a cube that does not
verify), stating what that verification proved and nothing more.

The attestation ``sign`` writes puts in its ``proved`` block only what this run established:
a pin whose model it fingerprinted (``--model``, or the pinned revision in the HF cache), an
activation it recomputed (``--recompute``: every position, and the stored tensors its own
prefill bit for bit: one merely within the proof's bound is signed as ``recorded`` at most),
or one whose KV header names a pin it proved. Every other statement of the lock (a label a pusher wrote, a lineage a re-pack
carried) goes to the ``claimed`` block: a claim does not gain strength by being signed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .._util.quiet import terminal_bars
from ..format import _lock as lockfile
from ..format import _partial as partialformat
from ..kinds import KINDS
from ..trust import _generation as generations
from ..trust._attestation import Proved
from ..trust._policy import TrustPolicy
from ..trust._report import VerifyReport
from ..trust._signing import check_key, write_signature
from ._verify import require_file_digests, verify

logger = logging.getLogger("cubepack")


@terminal_bars
def sign(cube_dir: str | Path, key: str | os.PathLike[str], policy: TrustPolicy | None = None, *,
         password: str | None = None, **options: Any) -> Path:
    """Verify the packed cube at ``cube_dir`` under ``policy`` (or its fields as ``options``,
    e.g. ``model=..., recompute=True`` to prove more), then write ``cubepack.sig`` with ``key``
    (an ECDSA P-256/P-384 private key, PEM) in the OpenSSF model-signing format, and the
    attestation of what that verification proved; return the signature's path.

    Raises:
        VerificationFailed: the cube does not verify (nothing is written).
        UsageError: the key is unreadable or not ECDSA P-256/P-384; a bad policy.

    Returns:
        the path of the signature written (``cubepack.sig`` in the cube).

    Example:
        ```python
        cubepack.sign("my-cube", "signing.pem", model="org/model-a")
        ```
    """
    policy = TrustPolicy.build(policy, **options)
    partialformat.refuse(cube_dir, "sign", "would sign a lock committing to memories this "
                         "signer never checked")
    check_key(key, private=True, password=password)  # fail before any work
    report = verify(cube_dir, policy)
    # The signature states every file's sha256 as the lock records it: each is computed
    # here, those verify proved through their index only included.
    require_file_digests(report)
    path = write_signature(cube_dir, key, proved_by(report), password=password)
    lock = report.lock
    if lock is not None and lockfile.series(lock) is not None \
            and lockfile.generation(lock) is not None:
        # A private cube's generation this key just signed is one this user has seen signed:
        # a later rekey (or load) of an older one of its series is a replay.
        note = generations.record(generations.of_series(lockfile.series(lock)),
                                  generations.keyid(key, password),
                                  generations.Known(lockfile.generation(lock), SIGNED_HERE))
        if note:
            logger.warning("cubepack: signed %s%s", cube_dir, note)
    return path


#: How a generation ``sign`` signed is recorded as seen.
SIGNED_HERE = "signed by cubepack sign on this machine"


def proved_by(report: VerifyReport) -> Proved:
    """What a passed verification established itself, as a signer may state it: the pins it
    fingerprinted, and each memory kind's items it proved."""
    items = frozenset().union(*(kind.established(report) for kind in KINDS))
    return Proved("sign", report.proved_roles, items, lineage=False)
