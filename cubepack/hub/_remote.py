"""Pinned models checked against the Hub's file metadata, downloading no weights.

For each strict pin with a Hub revision: the weights digest is recomputed from the per-file LFS
sha256 the Hub reports (``files_metadata=True``), the tokenizer digest from ``tokenizer.json``
and the geometry and compute config from ``config.json`` (both small). Returns typed checks; verification decides
what to do with them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .._util.canonical import loads_strict
from ..cube._policy import TrustPolicy
from ..cube._report import Check, VerifyReport, pin_subject
from ..cube._verify import require_checked_models, verify
from ..errors import CubepackError, HubError, VerificationFailed
from ..identity._fingerprint import (
    compute_config,
    digest_of_file_hashes,
    geometry_from_config,
    select_weight_names,
    tokenizer_digest_from_json,
)
from ..identity._identity import ModelIdentity, compare_keyed
from ._client import HubClient, lfs_sha256

CHECK = "remote model"


def remote_model_checks(models: dict[str, dict[str, Any]], client: HubClient, *,
                        strict: bool = True) -> list[Check]:
    """One or more checks per strict pin in ``models`` (role -> pin, as in the lock).

    ``strict``: a pinned model the endpoint does not host (or cannot be reached for) fails the
    check; otherwise it is reported as ``unverified`` (skipped, with the reason). A pinned
    revision that no longer exists, or files that differ from the pin, always fail.
    """
    checks: list[Check] = []
    for role, pin in sorted(models.items()):
        if pin.get("strict") and pin.get("identity"):
            checks.extend(_check_pin(role, pin, client, strict))
    return checks


def _check_pin(role: str, pin: dict[str, Any], client: HubClient, strict: bool) -> list[Check]:
    subject = pin_subject(role, pin)
    if not pin.get("repo_id") or not pin.get("revision"):
        return [Check(CHECK, subject, None, "skipped: pinned by weights digest only (no Hub "
                      "revision to check)", role=role)]
    pinned = ModelIdentity.from_dict(pin["identity"])
    repo_id, sha = pin["repo_id"], pin["revision"]
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
            return [Check(CHECK, subject, None, f"unverified: {error} Pass the model with "
                          "--model to check it locally (or --strict-models to refuse).",
                          role=role)]
        return [Check(CHECK, subject, False, str(error), sha, None, role=role)]
    siblings = {s.rfilename: s for s in info.siblings or []}
    entries, missing = [], []
    for name in select_weight_names(list(siblings)):
        sha256 = lfs_sha256(siblings[name])
        if sha256 is None:
            missing.append(name)
        else:
            entries.append((name, sha256))
    if missing:
        return [Check(CHECK, subject, False, "weight files without an LFS sha256 on the Hub "
                      f"cannot be checked without downloading them: {missing}", role=role)]
    problems = []
    found_digest = digest_of_file_hashes(entries)
    if found_digest != pinned.weights_digest:
        problems.append(("weights_digest", pinned.weights_digest, found_digest))
    try:
        if "tokenizer.json" in siblings:
            text = client.download(repo_id, "tokenizer.json", repo_type="model",
                                   revision=sha).read_text(encoding="utf-8")
            found = tokenizer_digest_from_json(text)
            if found != pinned.tokenizer_digest:
                problems.append(("tokenizer_digest", pinned.tokenizer_digest, found))
        raw = client.download(repo_id, "config.json", repo_type="model", revision=sha)
    except CubepackError as exc:
        return [Check(CHECK, subject, False, str(exc), role=role)]
    except Exception as exc:  # noqa: BLE001 - translated
        return [Check(CHECK, subject, False, str(client.error(exc, repo_id, "model", sha)),
                      role=role)]
    try:  # the endpoint's files are read as strictly as a cube's
        config = loads_strict(raw.read_bytes())
        problems += [(m.field, m.expected, m.found) for m in
                     compare_keyed("geometry", pinned.geometry, geometry_from_config(config))
                     + compare_keyed("compute_config", pinned.compute_config or {},
                                     compute_config(config))]
    except (CubepackError, ValueError) as exc:
        return [Check(CHECK, subject, False, f"the Hub's config.json at the pinned revision is "
                      f"unusable: {exc}", role=role)]
    if not problems:
        return [Check(CHECK, subject, True, "weights (LFS sha256), tokenizer, geometry and "
                      "compute config at the pinned revision match the pin", role=role)]
    return [Check(CHECK, f"{subject} {key}", False, "the Hub's files at the pinned revision "
                  "differ from the pin", expected, found, role=role)
            for key, expected, found in problems]


def verify_remote(cube_dir: str | Path, policy: TrustPolicy | None = None, *,
                  endpoint: str | None = None, token: str | None = None,
                  progress: bool | None = None, raise_on_failure: bool = True,
                  **options: Any) -> VerifyReport:
    """:func:`cubepack.verify`, plus each pinned model checked against the Hub's file metadata
    at its pinned revision (LFS sha256 of the weights, tokenizer, config; no weights are
    downloaded). ``cubepack verify --remote``.
    """
    policy = TrustPolicy.build(policy, **options)
    report = verify(cube_dir, replace(policy, strict_models=False), progress=progress,
                    raise_on_failure=False)
    if report.lock is not None and report.intact:
        report.extend(remote_model_checks(report.lock["models"], HubClient(endpoint, token),
                                          strict=True))
        if policy.strict_models:
            require_checked_models(report)
    report.finish("not run: the cube's files failed the checks above", ["remote model"])
    if raise_on_failure and not report.ok:
        raise VerificationFailed(report)
    return report
