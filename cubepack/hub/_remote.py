"""Pinned models checked against the Hub's file metadata, downloading no weights.

For each strict pin with a Hub revision, the identity a download of that commit would give is
computed from the Hub's metadata (:func:`cubepack.identity._hub.hub_identity`: weights digest
from the per-file LFS sha256, every other field from the small files, in the pinned dtype) and
compared with the pin field by field, as a local model is. The same function pins a vLLM
cube's producer at pack. Returns typed checks; verification decides what to do with them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._util.checks import Catalogue
from .._util.quiet import terminal_bars
from ..errors import CubepackError, HubError, VerificationFailed
from ..format.sections import Pin
from ..identity._hub import hub_identity
from ..identity._identity import compare
from ..ops import verify
from ..ops._seam import is_private, require_checked_models
from ..trust._policy import TrustPolicy
from ..trust._report import Check, VerifyReport, pin_subject
from ._client import HubClient
from ._history import add_history_check, add_skipped, pulled_repo

#: The checks this module makes.
_CHECK = Catalogue.REMOTE_MODEL


def remote_model_checks(models: Mapping[str, Pin], client: HubClient, *,
                        strict: bool = True) -> list[Check]:
    """One or more checks per strict pin in ``models`` (role -> pin, as in the lock).

    ``strict``: a pinned model the endpoint does not host (or cannot be reached for) fails the
    check; otherwise it is reported as ``unverified`` (skipped, with the reason). A pinned
    revision that no longer exists, or files that differ from the pin, always fail.
    """
    checks: list[Check] = []
    for role, pin in sorted(models.items()):
        if pin.strict and pin.identity is not None:
            checks.extend(_check_pin(role, pin, client, strict))
    return checks


def _check_pin(role: str, pin: Pin, client: HubClient, strict: bool) -> list[Check]:
    subject = pin_subject(role, pin)
    if not pin.repo_id or not pin.revision:
        return [Check(_CHECK, subject, None, "skipped: pinned by weights digest only (no Hub "
                      "revision to check)", role=role)]
    pinned = pin.identity
    repo_id, sha = pin.repo_id, pin.revision
    try:
        info = client.api.model_info(repo_id, revision=sha, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - translated below
        from huggingface_hub.errors import RevisionNotFoundError

        error = client.error(exc, repo_id, "model", sha)
        if isinstance(exc, RevisionNotFoundError):
            error = HubError(f"The pinned revision {sha} of {repo_id} no longer exists on the Hub "
                             "(was its history rewritten or squashed?); the cube cannot be "
                             "checked against its producer.")
        elif not strict:
            return [Check(_CHECK, subject, None, f"unverified: {error} Pass the model with "
                          "--model to check it locally (or --strict-models to refuse).",
                          role=role)]
        return [Check(_CHECK, subject, False, str(error), sha, None, role=role)]
    try:  # the identity a download would give, from the Hub's metadata (no weights read)
        found = hub_identity(client.api, repo_id, info, dtype=pinned.dtype)
    except (CubepackError, ValueError) as exc:  # the endpoint's files are read strictly
        return [Check(_CHECK, subject, False, f"the Hub's files at the pinned revision cannot "
                      f"be checked: {exc}", role=role)]
    problems = compare(pinned, found)
    if not problems:
        return [Check(_CHECK, subject, True, "weights (LFS sha256), tokenizer, geometry, compute "
                      "config, quantization and adapters at the pinned revision match the pin",
                      role=role)]
    return [Check(_CHECK, f"{subject} {m.field}", False, "the Hub's files at the pinned revision "
                  "differ from the pin", m.expected, m.found, role=role)
            for m in problems]


@terminal_bars
def verify_remote(cube_dir: str | Path, policy: TrustPolicy | None = None, *,
                  endpoint: str | None = None, token: str | None = None,
                  progress: bool | None = None, raise_on_failure: bool = True,
                  decrypt_with: str | os.PathLike[str] | None = None,
                  **options: Any) -> VerifyReport:
    """:func:`cubepack.verify`, plus each pinned model checked against the Hub's file metadata
    at its pinned revision (LFS sha256 of the weights, tokenizer, config; no weights are
    downloaded). ``cubepack verify --remote``.

    A private cube is opened with ``decrypt_with`` as :func:`cubepack.verify` opens it; a
    private cube a pull placed (its origin record names its lock) is also compared with the
    signed revisions in its repo's history on the endpoint (the ``replay`` check).
    """
    policy = TrustPolicy.build(policy, **options)
    report = verify(cube_dir, policy.without(Catalogue.MODEL_IDENTITY), progress=progress,
                    raise_on_failure=False, decrypt_with=decrypt_with)
    if report.lock is not None and report.intact:
        client = HubClient(endpoint, token)
        report.extend(remote_model_checks(report.lock.models, client, strict=True))
        if policy.asks(Catalogue.MODEL_IDENTITY):
            require_checked_models(report)
        pulled = pulled_repo(Path(cube_dir))
        if pulled is None:
            add_skipped(report, "this folder was not placed by a pull of this user (no "
                                "origin record such a pull wrote names its lock), so no "
                                "repo's history was walked")
        else:
            add_history_check(report, client, *pulled, policy.trusted())
    report.finish("not run: the cube's files failed the checks above",
                  [Catalogue.REMOTE_MODEL])
    if report.lock is not None and is_private(report.lock):
        report.group_scopes()
    if raise_on_failure and not report.ok:
        raise VerificationFailed(report)
    return report
