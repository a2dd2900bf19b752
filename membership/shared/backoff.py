"""One reconnect backoff for every retry loop of the SDK (and the arbiters' peer links).

Capped exponential backoff with "full jitter" (M. Brooker, "Exponential
Backoff And Jitter", AWS Architecture Blog, 2015): the ``k``-th consecutive
failure (``k`` from 1) waits a uniformly random time in
``[0, min(maximum, initial * 2**k))``. The randomness spreads the reconnects
of a fleet that lost the same arbiter at the same moment over the whole
window (no reconnect storm), and the cap bounds how long a node waits once
the arbiter is back.

A server's retry hint takes precedence over the formula: a call ended with
the trailing metadata ``grpc-retry-pushback-ms`` (gRFC A6, "gRPC Retry
Design": a decimal count of milliseconds) is retried no sooner than that
(:func:`retry_pushback`); an arbiter that sheds new nodes sends one
(arbiter/server/load/monitor.py, rule 4).

The random source is passed in, so a test or a simulation can make the
delays reproducible. A :class:`Backoff` is also a tenacity wait strategy
(``AsyncRetrying(wait=Backoff(...))``), so tenacity's retry loops and the
SDK's own loops draw from one formula.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_PUSHBACK", "PUSHBACK_KEY", "Backoff", "retry_pushback"]

PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""The trailing metadata key of a server's retry hint (gRFC A6), milliseconds."""

MAX_PUSHBACK = 30.0
"""Seconds: a longer hint is taken as this (a wrong server must not park a client)."""


def retry_pushback(trailing: Iterable[tuple[str, Any]] | None) -> float | None:
    """The server's retry hint in a call's trailing metadata, seconds, or None.

    Args:
        trailing: the call's trailing metadata (key, value) pairs, or None.

    Returns:
        ``grpc-retry-pushback-ms`` / 1000, at most :data:`MAX_PUSHBACK`; None
        without one, or for a value that is not a non-negative integer (gRFC A6:
        such a hint is no hint; the caller's own backoff applies).
    """
    for key, value in trailing or ():
        if key == PUSHBACK_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text.isdigit():
                return min(MAX_PUSHBACK, int(text) / 1000.0)
            return None
    return None


class Backoff:
    """Capped exponential backoff with full jitter.

    Args:
        initial: seconds; the first retry waits up to ``2 * initial``.
        maximum: seconds; no wait is longer.
        rng: the random source (default: a new ``random.Random()``).

    Raises:
        ValueError: unless ``0 < initial <= maximum``.
    """

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(
                f"backoff needs 0 < initial <= maximum, got initial={initial}, maximum={maximum}"
            )
        self.initial = initial
        self.maximum = maximum
        self._rng = rng or random.Random()

    def ceiling(self, attempt: int) -> float:
        """The longest wait after ``attempt`` consecutive failures, seconds."""
        if attempt <= 0:
            return 0.0
        return min(self.maximum, self.initial * 2.0 ** min(attempt, 32))

    def delay(self, attempt: int) -> float:
        """A random wait after ``attempt`` consecutive failures, seconds (0 for none)."""
        return float(self._rng.uniform(0.0, self.ceiling(attempt)))

    def __call__(self, retry_state: Any) -> float:
        """tenacity's wait protocol: the wait before the next attempt of ``retry_state``."""
        return self.delay(int(retry_state.attempt_number))
