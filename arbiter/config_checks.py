"""Checks of :class:`arbiter.config.ArbiterConfig` kept apart from it (module size).

Each raises :class:`membership.errors.InvalidArgument` naming the field and the
rule it breaks, as :meth:`ArbiterConfig.validate` does for the others.
"""

from __future__ import annotations

from membership.config import MIN_KEEPALIVE_TIME, MIN_KEEPALIVE_TIMEOUT
from membership.errors import InvalidArgument

__all__ = ["check_keepalive"]


def check_keepalive(
    min_ping_interval: float, keepalive_time: float, keepalive_timeout: float
) -> None:
    """The HTTP/2 keepalive settings against what every client and replica may use.

    Args:
        min_ping_interval: ``ArbiterConfig.min_ping_interval``, seconds.
        keepalive_time: ``ArbiterConfig.keepalive_time``, seconds.
        keepalive_timeout: ``ArbiterConfig.keepalive_timeout``, seconds.

    Raises:
        InvalidArgument: one of them breaks its rule (the message says which and why).
    """
    if min_ping_interval > MIN_KEEPALIVE_TIME:
        raise InvalidArgument(
            f"min_ping_interval ({min_ping_interval}s) must be <= {MIN_KEEPALIVE_TIME}s: "
            "nodes may ping that often, and faster pings than min_ping_interval earn "
            "them GOAWAY too_many_pings"
        )
    if keepalive_time < MIN_KEEPALIVE_TIME:
        raise InvalidArgument(
            f"keepalive_time ({keepalive_time}s) must be >= {MIN_KEEPALIVE_TIME}s: "
            "replicas ping each other at that interval, and another replica accepts "
            "pings no more often"
        )
    if keepalive_timeout < MIN_KEEPALIVE_TIMEOUT:
        raise InvalidArgument(
            f"keepalive_timeout ({keepalive_timeout}s) must be >= "
            f"{MIN_KEEPALIVE_TIMEOUT}s: it is also the sockets' TCP_USER_TIMEOUT, and a "
            "shorter one aborts healthy connections on a few retransmissions"
        )
