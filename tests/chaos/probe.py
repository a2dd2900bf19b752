"""The chaos suite's eyes: GetView on replicas, from inside the lab, on request.

The test process lives in the root network namespace and cannot reach the
lab's addresses, and starting ``membership view`` for every poll would cost a
Python start each time on a 2-core machine. So one probe process runs in the
lab's management host (never cut by a fault) and answers requests read from
stdin, one per line::

    <timeout-seconds> <addr> [<addr> ...]

with one JSON object per line on stdout: ``{"<addr>": <view>, ...}`` where
``<view>`` is what ``membership view --json`` prints for that replica alone,
or ``{"error": "..."}`` when it did not answer within the timeout (a paused
or killed replica). The replicas are asked concurrently, over one channel
each, kept open between requests.

``python -m tests.chaos.probe``; EOF on stdin ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from membership._client import MembershipClient
from membership._config import ClientConfig
from membership.cli.output import view_json
from membership.shared.errors import MembershipError


async def _one(clients: dict[str, MembershipClient], addr: str, timeout: float) -> dict[str, Any]:
    client = clients.get(addr)
    if client is None:
        client = MembershipClient([addr], config=ClientConfig(follow_view=False))
        clients[addr] = client
    try:
        # call_timeout is fixed per client; the overall deadline is ours.
        info = await asyncio.wait_for(client.get_view(), timeout)
    except (MembershipError, TimeoutError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return view_json(info)


async def main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    clients: dict[str, MembershipClient] = {}
    try:
        while line := await reader.readline():
            words = line.decode().split()
            if not words:
                continue
            timeout, addrs = float(words[0]), words[1:]
            results = await asyncio.gather(*(_one(clients, a, timeout) for a in addrs))
            print(json.dumps(dict(zip(addrs, results, strict=True))), flush=True)
    finally:
        for c in clients.values():
            await c.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
