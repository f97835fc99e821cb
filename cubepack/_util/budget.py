"""A time budget that work other than I/O checks cooperatively: a pull's deadline must cover
its verification too (a cube crafted to be slow to check must not outlive ``--timeout``).

The caller that owns a deadline (``cubepack.hub``) opens :func:`bounded` with a function that
raises when time is up; long-running checks call :func:`checkpoint` between steps (each file
hashed, each activation, each adapter, each model check). Without a budget, a checkpoint is a
no-op, so library callers of ``verify`` are unaffected.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_CURRENT: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "cubepack_budget", default=None)


@contextlib.contextmanager
def bounded(check: Callable[[str], None]) -> Iterator[None]:
    """Run the body with ``check(step)`` called at every :func:`checkpoint`; it raises to stop."""
    token = _CURRENT.set(check)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def checkpoint(step: str) -> None:
    """Raise if the budget is spent; ``step`` names what was running, for the message."""
    check = _CURRENT.get()
    if check is not None:
        check(step)
