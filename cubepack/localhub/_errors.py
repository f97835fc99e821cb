"""The one error type of the local Hub: a refusal with its HTTP status and the Hub's error code.

Its own module so the parsers of the endpoint's edge (:mod:`._ids`, :mod:`._bodies`) and the
store can all raise it without importing each other.
"""

from __future__ import annotations


class StoreError(Exception):
    """A request the store refuses; carries the HTTP status and the Hub's X-Error-Code."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


def bad_request(message: str) -> StoreError:
    """A malformed request (400): ``message`` is one sentence naming what is wrong."""
    return StoreError(400, message)


def shown(value: object, limit: int = 80) -> str:
    """``value`` as an error message quotes it: repr'd (so control characters and quotes show
    as escapes) and cut to ``limit`` characters (a 60 MB field is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
