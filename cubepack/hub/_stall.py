"""The low-speed rule of a pull or push: a request that moves fewer than ``limit`` bytes/s for
``seconds`` seconds has stalled (curl's ``--speed-limit`` / ``--speed-time``).

Why a rule beside the overall deadline: the deadline (an hour by default) is sized for large
honest transfers, and huggingface_hub's timeouts apply to each read, so an endpoint that sends a
byte every 2 s would keep a pull or push going for the whole hour. A stall ends it within
``seconds`` instead, whatever the deadline.

How a request is judged: from the moment it is sent (waiting for the answer counts, as in curl:
no bytes move then, so an answer that never comes, or comes a header byte at a time, stalls as
well), a window opens; each time the request has moved ``limit * seconds`` bytes (sent and
received) since its window opened, a new window opens. A window still open after ``seconds``
saw less than ``limit`` bytes/s on average over those seconds: the request stalled. Each
request is judged alone, so one starved file among fast ones is caught too.

This module owns the rule (the arithmetic, the words, the settings' names); the
:class:`~cubepack.hub._deadline.Deadline` feeds it each request's bytes and asks it when to
judge, and ends the operation on its verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from .._util import constants

#: Variables that set the rule, for messages (read by :func:`cubepack._util.constants.low_speed`).
SETTINGS = "CUBEPACK_LOW_SPEED_LIMIT / CUBEPACK_LOW_SPEED_TIME"
ADVICE = ("Retry; if it stalls again, check the endpoint (or the network to it), or for a slow "
          "link raise CUBEPACK_LOW_SPEED_TIME or lower CUBEPACK_LOW_SPEED_LIMIT (0 turns the "
          "rule off; the overall deadline, --timeout, still applies).")


class Judged(Protocol):
    """What the rule reads and writes on a request (a ``_deadline._Transfer``)."""

    window: tuple[float, int]
    moved: int


@dataclass(frozen=True)
class Verdict:
    """A stalled request's last window: ``moved`` bytes in ``seconds`` seconds."""

    moved: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class LowSpeed:
    """Fewer than ``limit`` bytes/s for ``seconds`` seconds is a stall."""

    limit: float
    seconds: float

    @classmethod
    def from_environment(cls) -> LowSpeed | None:
        """The rule as ``CUBEPACK_LOW_SPEED_LIMIT`` / ``_TIME`` set it; None when turned off.

        Raises:
            UsageError: a value that is not a number, a negative limit, a time that is not > 0.
        """
        settings = constants.low_speed()
        return None if settings is None else cls(*settings)

    @property
    def quota(self) -> float:
        """Bytes a window must see to close in time."""
        return self.limit * self.seconds

    @property
    def read_cap(self) -> float:
        """The longest a single read or write of a judged request may block: one that blocks
        ``seconds`` moves nothing for ``seconds`` and has stalled by then, so the HTTP library's
        own timeout is capped a margin above it (the rule's verdict comes first, and a request
        the rule ended does not linger in a blocked read)."""
        return 2 * self.seconds

    def opened(self, now: float | None = None) -> tuple[float, int]:
        """The first window of a request sent ``now``."""
        return (time.monotonic() if now is None else now, 0)

    def moved(self, transfer: Judged, now: float | None = None) -> None:
        """``transfer.moved`` grew: open a new window once the quota moved in this one."""
        start, base = transfer.window
        if transfer.moved - base >= self.quota:
            # One tuple, assigned at once: the judging thread never sees half a window.
            transfer.window = (time.monotonic() if now is None else now, transfer.moved)

    def due(self, transfer: Judged) -> float:
        """When (``time.monotonic``) the request's open window is judged."""
        return transfer.window[0] + self.seconds

    def judge(self, transfer: Judged, now: float) -> Verdict | None:
        """The request's verdict: its last window if it stalled, else None."""
        start, base = transfer.window
        moved, elapsed = transfer.moved - base, now - start
        if elapsed >= self.seconds and moved < self.quota:
            return Verdict(moved, elapsed)
        return None

    def describe(self) -> str:
        """The rule, in a message's words."""
        return f"the low-speed limit of {self.limit:,g} bytes/s for {self.seconds:g} s ({SETTINGS})"

    def details(self, verdict: Verdict) -> dict[str, Any]:
        """The verdict and the rule, for ``--json``."""
        return {"window_bytes": verdict.moved, "window_seconds": round(verdict.seconds, 3),
                "rate": round(verdict.rate, 3), "limit": self.limit, "time": self.seconds}
