"""Which asyncio event loop a replica runs on: ``membership arbiter --event-loop``.

``auto`` (the default) runs on uvloop (libuv; MagicStack/uvloop) when it is
installed (``pip install 'grpc-membership[uvloop]'``) and on asyncio's own
loop otherwise; ``asyncio`` and ``uvloop`` choose one (``uvloop`` not
installed: a usage error, exit 2). grpc.aio runs its completion queue on
any asyncio loop (gRPC's poller thread hands completions to the loop), so
the choice changes the loop's own cost (timers, callbacks, sockets of
other servers in the process), not the gRPC core's. bench/heartbeat_path.py
``--loops asyncio,uvloop`` measures both in one run (docs/heartbeat-path.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

from membership.shared.errors import InvalidArgument

__all__ = ["CHOICES", "loop_factory", "uvloop_installed"]

CHOICES = ("auto", "asyncio", "uvloop")


def uvloop_installed() -> bool:
    """Whether uvloop can be imported."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The ``loop_factory`` of :class:`asyncio.Runner` for ``choice`` (None: asyncio's own).

    Raises:
        InvalidArgument: ``uvloop`` asked for and not installed, or an unknown choice.
    """
    if choice not in CHOICES:
        raise InvalidArgument(f"--event-loop must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "asyncio" or (choice == "auto" and not uvloop_installed()):
        return None
    try:
        import uvloop
    except ImportError:
        raise InvalidArgument(
            "--event-loop uvloop: uvloop is not installed (pip install 'grpc-membership[uvloop]')"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
