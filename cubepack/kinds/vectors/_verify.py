"""What ``verify`` checks of a text memory's vectors: memories re-embedded by the embedder
the policy names, compared with the stored vectors (``_check``)."""

from __future__ import annotations

from ..._util.checks import Catalogue
from ...errors import CubepackError
from ...format.sections import Lock
from ...memos_format._layout import read_config
from ...trust._policy import TrustPolicy
from ...trust._report import VerifyReport
from ._check import embedder_checks
from ._embedder import embed
from ._vectors import EMBEDDER_ROLE


def check_proofs(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    """The embedder check, when the policy asks for it."""
    if policy.asks(Catalogue.EMBEDDER):
        _check_embedder(report, lock, policy)


def _check_embedder(report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
    asked = policy.reembedding()
    spec = asked.embedder
    assert spec is not None  # only called when the policy asks for the embedder check
    try:
        config = read_config(report.cube_dir, list(lock.files))
        report.extend(embedder_checks(report.cube_dir, config, list(lock.files),
                                      lock.vectors_record(EMBEDDER_ROLE),
                                      lambda texts: embed(spec, texts), label=spec,
                                      seed=asked.seed, size=asked.sample,
                                      alone=not lock.preferences))
    except CubepackError as exc:
        report.add(Catalogue.EMBEDDER, "*", False, str(exc), role=EMBEDDER_ROLE)
