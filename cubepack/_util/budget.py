"""A time budget that work other than I/O checks cooperatively: a pull's deadline must cover
its verification too (a cube crafted to be slow to check must not outlive ``--timeout``).

The caller that owns a deadline (``cubepack.hub``) opens :func:`bounded` with a function that
returns the error to end with once time is up; long-running checks call :func:`checkpoint`
between steps (each activation, each adapter, each module an adapter's patterns are matched
against, each model check). The error travels as :class:`Spent`, a ``BaseException`` no
check's ``except`` catches (a check reporting a refusal must not swallow the deadline), and
:func:`bounded` raises the error itself at its edge. Without a budget, a checkpoint is a no-op,
so library callers of ``verify`` are unaffected.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_CURRENT: contextvars.ContextVar[Callable[[str], BaseException | None] | None] = \
    contextvars.ContextVar("cubepack_budget", default=None)


class Spent(BaseException):
    """The budget ran out at a checkpoint; carries the error :func:`bounded` raises."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def bounded(check: Callable[[str], BaseException | None]) -> Iterator[None]:
    """Run the body with ``check(step)`` called at every :func:`checkpoint`: it returns the
    error to end with once time is up (None before). That error is raised from here."""
    token = _CURRENT.set(check)
    try:
        yield
    except Spent as spent:
        raise spent.error from None
    finally:
        _CURRENT.reset(token)


def checkpoint(step: str) -> None:
    """End the bounded work if its budget is spent; ``step`` names what was running."""
    check = _CURRENT.get()
    error = check(step) if check is not None else None
    if error is not None:
        raise Spent(error)
