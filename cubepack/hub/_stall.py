"""The low-speed rule of a pull or push: one whose requests together move fewer than ``limit``
bytes/s for ``seconds`` seconds has stalled (curl's ``--speed-limit`` / ``--speed-time``).

Why a rule beside the overall deadline: the deadline (an hour by default) is sized for large
honest transfers, and huggingface_hub's timeouts apply to each read, so an endpoint that sends a
byte every 2 s would keep a pull or push going for the whole hour. A stall ends it within
``seconds`` instead, whatever the deadline.

How an operation is judged: on the bytes all of its requests move together, not each request
alone: a pull downloads its files in parallel (and a push uploads them so), and an honest link
shared by four downloads gives each a quarter of its rate. From the moment a request is sent
(waiting for the answer counts, as in curl: no bytes move then, so an answer that never comes,
or comes a header byte at a time, stalls as well), it has a window; each time the operation's
requests together have moved ``limit * seconds`` bytes (sent and received) since that window
opened, a new one opens. A window still open after ``seconds`` saw the operation move less than
``limit`` bytes/s on average over those seconds while the request was in flight: the operation
stalled. So a link moving at least ``limit`` bytes/s never stalls however many requests share
it, and one moving less stalls within ``seconds``; a starved request among fast ones stalls
once the others are done (their bytes are the operation's progress until then). A retry wait
(see :mod:`~cubepack.hub._deadline`) has a window too. The arithmetic is :class:`Windows`.

This module owns the rule (the arithmetic, the words, the settings' names); the
:class:`~cubepack.hub._deadline.Deadline` tells an operation's :class:`Windows` when each request
begins and ends and what bytes move, asks it when to judge, and ends the operation on its
verdict.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from .._util import constants

#: Variables that set the rule, for messages (read by :func:`cubepack._util.constants.low_speed`).
SETTINGS = "CUBEPACK_LOW_SPEED_LIMIT / CUBEPACK_LOW_SPEED_TIME"
ADVICE = ("Retry; if it stalls again, check the endpoint (or the network to it), or for a slow "
          "link raise CUBEPACK_LOW_SPEED_TIME or lower CUBEPACK_LOW_SPEED_LIMIT (0 turns the "
          "rule off; the overall deadline, --timeout, still applies).")


@dataclass(frozen=True)
class Verdict:
    """A stalled request's last window: the operation moved ``moved`` bytes in ``seconds``
    seconds, with ``requests`` requests (retry waits included) in flight when it was judged."""

    moved: int
    seconds: float
    requests: int = 1

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
        """The longest a single read or write of a judged request may block: a margin above
        ``seconds``, so a request the rule ended does not linger in a blocked read (the rule's
        verdict comes first when the request is alone; huggingface_hub's own read timeouts, 10
        s for downloads, are shorter still)."""
        return 2 * self.seconds

    def describe(self) -> str:
        """The rule, in a message's words."""
        return f"the low-speed limit of {self.limit:,g} bytes/s for {self.seconds:g} s ({SETTINGS})"

    def details(self, verdict: Verdict) -> dict[str, Any]:
        """The verdict and the rule, for ``--json``."""
        return {"window_bytes": verdict.moved, "window_seconds": round(verdict.seconds, 3),
                "rate": round(verdict.rate, 3), "requests_in_flight": verdict.requests,
                "limit": self.limit, "time": self.seconds}


class Windows:
    """The rule applied to one operation: a window per request in flight (or retry wait),
    keyed as the caller likes, each counting the bytes all of the operation's requests moved.

    The arithmetic alone: the caller passes the time (``time.monotonic`` in use, any clock in
    tests) and serializes the calls (the deadline holds its lock).
    """

    def __init__(self, rule: LowSpeed):
        self.rule = rule
        #: Bytes the operation's requests moved, sent and received, since it began.
        self.moved = 0
        self._open: dict[Hashable, tuple[float, int]] = {}  # key -> (opened at, moved then)
        self._closes_at = math.inf  # ``moved`` at which the earliest-based window closes

    def __len__(self) -> int:
        return len(self._open)

    def open(self, key: Hashable, now: float) -> None:
        """A request was sent (or a retry wait began) ``now``: its first window opens (any
        earlier window under ``key`` is over)."""
        self._open[key] = (now, self.moved)
        self._closes_at = min(self._closes_at, self.moved + self.rule.quota)

    def close(self, key: Hashable) -> None:
        """The request under ``key`` is over: it is judged no more."""
        self._open.pop(key, None)

    def add(self, count: int, now: float) -> None:
        """A request of the operation moved ``count`` bytes ``now``: every window that has seen
        the quota move since it opened closes, and the request's next window opens ``now``."""
        moved = self.moved = self.moved + count
        if moved < self._closes_at:  # no window closes: one comparison
            return
        quota, earliest = self.rule.quota, math.inf
        for key, (_, base) in self._open.items():
            if moved - base >= quota:
                self._open[key] = (now, moved)
                base = moved
            earliest = min(earliest, base)
        self._closes_at = earliest + quota

    def due(self) -> float | None:
        """When the earliest open window is judged; None with no request in flight."""
        if not self._open:
            return None
        return min(start for start, _ in self._open.values()) + self.rule.seconds

    def judge(self, key: Hashable, now: float) -> Verdict | None:
        """The verdict on the request under ``key``: its open window if that saw the operation
        move less than the quota in ``seconds`` or more, else None (also for an unknown key)."""
        if key not in self._open:
            return None
        start, base = self._open[key]
        moved, elapsed = self.moved - base, now - start
        if elapsed >= self.rule.seconds and moved < self.rule.quota:
            return Verdict(moved, elapsed, len(self._open))
        return None
