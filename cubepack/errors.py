"""Every exception cubepack raises, in one tree whose branches decide the CLI's exit code.

::

    CubepackError                      3  anything else
    ├── RefusedError                   1  the input exists and was read, but is not what was promised
    │   ├── IdentityMismatch              a memory belongs to another model, or does not fit it
    │   ├── IntegrityError                bytes differ from what the lock records
    │   │   ├── VerificationFailed        a cube failed verification (``.report``)
    │   │   └── RecomputationFailed       the producer does not reproduce a cache
    │   ├── SignatureError                unsigned, untrusted, or not covering the content
    │   ├── FormatError (ValueError)      malformed, or of an unknown version
    │   └── UnsafeInputError              unsafe to read: a pickle global, a path that escapes
    ├── UsageError (ValueError)        2  the request is wrong: bad arguments, a malformed id
    │   └── ModelNotFoundError (FileNotFoundError)   a model folder or Hub id that is not there
    ├── UnsupportedError               3  well-formed, but cubepack cannot honour it
    ├── HubError                       3  the Hub (or endpoint) refused or failed
    │   └── PushConflict                  another push landed a different cube first
    └── PartialCube                    4  a partial pull (``--include``): verified as far as it
                                          goes, or refused by a verb that needs the cube whole

Outside the tree, as ``KeyboardInterrupt`` is: ``Terminated`` (a ``BaseException``), raised by
the SIGTERM handler a RAM folder of plaintext (and the CLI) installs, so ``finally`` blocks
remove what they must and no ``except Exception`` swallows the stop; the CLI exits 143.

Callers catch a branch (``except cubepack.RefusedError``) or a stdlib base (``except
ValueError``). Messages are sentences a user can act on: what differed (expected vs found) and
what to do about it.
"""

from dataclasses import dataclass as _dataclass
from dataclasses import field as _field
from typing import Any as _Any

__all__ = ["CubepackError", "FormatError", "HubError", "IdentityMismatch", "IntegrityError",
           "Mismatch", "ModelNotFoundError", "PartialCube", "PushConflict",
           "RecomputationFailed", "RefusedError", "SignatureError", "Terminated",
           "UnsafeInputError", "UnsupportedError", "UsageError", "VerificationFailed"]


class CubepackError(Exception):
    """Root of every error cubepack raises on purpose."""

    #: Exit code the CLI uses for this error class (1: refused, 2: usage, 3: other).
    exit_code = 3


class RefusedError(CubepackError):
    """Verification refused: the thing exists and was read, but it is not what was promised."""

    exit_code = 1


@_dataclass(frozen=True)
class Mismatch:
    """One field that differs between what was recorded (expected) and what is here (found).

    ``of_producer``: the field is part of a producer's identity (two model identities compared,
    a cache's shape against its producer's geometry), so the difference means another model
    made it. Set only where that comparison is made; everything else (a length, a batch, ids,
    bytes against a pin) is refused for what it is.
    """

    field: str
    expected: _Any
    found: _Any
    of_producer: bool = _field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.field}: expected {_show(self.expected)}, found {_show(self.found)}"


def _show(value: _Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


class IdentityMismatch(RefusedError):
    """A memory does not match the model (or pin) it is offered to: produced by another model,
    or unusable by this one (a length, a batch, ids outside its vocabulary).

    ``mismatches`` lists every differing field with expected and found values. The message
    says the memory "was produced by a different model" only when every mismatch is a field of
    the producer's identity (:attr:`of_producer`); a caller's ``finding`` replaces it.
    """

    #: The finding when every mismatch is a producer field (and the only one that says so).
    ANOTHER_MODEL = "was produced by a different model"

    def __init__(self, what: str, mismatches: list[Mismatch], advice: str | None = None, *,
                 finding: str | None = None):
        self.what = what
        self.mismatches = list(mismatches)
        fields = "; ".join(str(m) for m in self.mismatches)
        if finding is None:
            finding = self.ANOTHER_MODEL if self.of_producer else "does not match"
        self.finding = finding
        self.advice = advice or (
            "Load it into the model that produced it, or rebuild the cache with this model."
            if self.of_producer else
            "Nothing was loaded from it; use a memory made for this model, as it was made.")
        super().__init__(f"{what} {finding} ({fields}). {self.advice}")

    @property
    def fields(self) -> list[str]:
        return [m.field for m in self.mismatches]

    def about(self, what: str, producer_advice: str) -> "IdentityMismatch":
        """The same refusal, of ``what``: ``producer_advice`` when it is the producer's (a
        caller's "give the model that made it" never answers a cache's own faults), else
        this refusal's own finding and advice."""
        if self.of_producer:
            return IdentityMismatch(what, self.mismatches, producer_advice)
        return IdentityMismatch(what, self.mismatches, self.advice, finding=self.finding)

    @property
    def of_producer(self) -> bool:
        """Every mismatch is a field of the producer's identity: another model made it."""
        return bool(self.mismatches) and all(m.of_producer for m in self.mismatches)


class IntegrityError(RefusedError):
    """Bytes on disk or on the Hub are not the ones the lock records (hash, size, file set)."""


class VerificationFailed(IntegrityError):
    """A cube failed verification. ``report`` lists every check (passed, failed, skipped);
    ``failures`` the failed ones, each naming the file or field with expected and found."""

    def __init__(self, report: _Any):
        self.report = report
        failures = report.failures
        shown = "; ".join(str(check) for check in failures[:8])
        more = f"; and {len(failures) - 8} more" if len(failures) > 8 else ""
        plural = "s" if len(failures) != 1 else ""
        # Each check carries its entry of the check catalogue (cubepack/_util/checks.py, a
        # floor above this module): damaged bytes are fixed by fetching or packing them again,
        # once; a policy's refusal (model, signature, recompute, embedder) names its own fix,
        # which another pull would not be.
        entries = list(dict.fromkeys(check.name for check in failures))
        fixes = [entry.fix for entry in entries if entry.damage][:1]
        fixes += [entry.fix for entry in entries if not entry.damage]
        super().__init__(f"Cube {report.cube_dir} failed verification ({len(failures)} problem"
                         f"{plural}): {shown}{more}. Do not load it; {'; '.join(fixes)}.")

    @property
    def failures(self) -> list[_Any]:
        return self.report.failures


class RecomputationFailed(IntegrityError):
    """The producer model does not reproduce a KV cache: its values were altered, it came from
    another model, or it was built at other positions. Names the first layer and position."""


class SignatureError(RefusedError):
    """A cube's signature is missing, untrusted, or does not cover its content."""


class FormatError(RefusedError, ValueError):
    """A file cubepack reads (KV file, lock, cube config) is malformed or of an unknown version."""


class UnsafeInputError(RefusedError):
    """Input that would be unsafe to read: a pickle global outside the allowlist, a path that
    escapes its folder, a symlink, an oversized header."""


class UsageError(CubepackError, ValueError):
    """The request contradicts itself or names nothing: two revisions, conflicting options, a
    path that does not exist, a malformed repo id. The CLI exits with 2, as for a bad flag."""

    exit_code = 2


class UnsupportedError(CubepackError):
    """The request is well-formed but cubepack cannot honour it (e.g. a quantized KV cache)."""


class ModelNotFoundError(UsageError, FileNotFoundError):
    """A model folder, Hub id or revision cannot be found (locally or, offline, in the HF cache).
    Like any missing input it is a usage error (CLI exit 2)."""


class HubError(CubepackError):
    """The Hub (or the local endpoint) refused or failed a request: unknown repo or revision,
    missing credentials, a server error, a stalled transfer, or a commit absent from the
    offline cache."""

    #: What a script may read besides the message (``--json`` prints it as ``error.details``),
    #: e.g. ``{"stall": {...}}``: the stalled request, its bytes and rate. None: nothing more.
    details: dict[str, _Any] | None = None


class PartialCube(CubepackError):
    """The cube is a partial pull (``cubepack pull --include``): only some of its memories are
    here. ``verify`` of one whose present memories all check out ends with this error, saying
    "N of M memories checked" (``report``: the report; never a complete cube's exit 0); ``pack``,
    ``push``, ``upgrade``, ``sign``, ``migrate``, ``encrypt`` and ``rekey`` refuse one, naming the
    pull that makes it whole. The CLI exits with 4."""

    exit_code = 4

    def __init__(self, message: str, report: _Any = None):
        super().__init__(message)
        self.report = report


class PushConflict(HubError):
    """A push's branch moved to another cube while it pushed (its parent commit went stale and
    the branch's lock changed): nothing of it is presented as the cube. Pull, re-pack the
    changes onto the new cube, push again."""


class Terminated(BaseException):
    """The process got SIGTERM (or SIGHUP, SIGQUIT, SIGUSR1: ``signum``): unwinding so
    ``finally`` blocks run (a BaseException, as KeyboardInterrupt is, so no ``except
    Exception`` or ``except CubepackError`` stops it)."""

    exit_code = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended

    def __init__(self, message: str = "terminated", signum: int = 15) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum  # what a shell reports for a process the signal ended

