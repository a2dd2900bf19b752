"""The local control socket of a ``membership node`` sidecar: rank, fencing and grace for a script.

A training script that is not an asyncio program (or whose C extension holds
the GIL longer than a lease) runs ``membership node --control-socket PATH``
beside it and talks to it over a unix socket: it reads its rank, world size,
epoch and fencing state, and asks for grace windows. ``membership node-ctl``
is the command-line client (:mod:`membership.cli.ctl`); any language can
speak the protocol (one JSON object per line).

Rules:

1. The socket is a unix stream socket at PATH, mode 0600 (its owner only: who
   may ask for a grace window may keep the node from being declared DEAD),
   made by the node at start and removed at its end. A file already at PATH
   is replaced only if it is a socket nobody listens on (a sidecar that was
   killed left it); anything else fails the start.
2. Requests and answers are JSON objects, one per line (UTF-8, at most
   :data:`MAX_LINE` bytes), answered in order; a connection may send many.
   Every answer has ``"ok"``: true, or false with ``"error"`` (the request
   is refused, nothing else happens). Commands (``"cmd"``):

   - ``status``: :func:`status_of` (below);
   - ``grace``, with ``"seconds"`` (>= 0; 0 ends the window), optional
     ``"reason"`` and ``"timeout"`` (seconds the ask may take, default the
     client's ``leave_timeout``, 5 s): asks the cluster for a grace window
     (:meth:`membership.MembershipClient.grace`), answers ``{"ok", "seconds",
     "grant", "covered"}`` once committed and covered (``covered``: seconds
     the node may pause for without being fenced);
   - ``wait``, with optional ``"after"`` (an epoch, default the current
     ``rank_epoch``) and ``"timeout"`` (seconds, default 30): answers the
     status once the node's rank assignment epoch is above ``after`` or the
     node is fenced, or when the timeout passes (``"timed_out": true``).
3. The status: ``node_id``, ``incarnation``, ``state`` (JOINING, ALIVE, DEAD,
   LEFT), ``fenced``, ``is_member``, ``fencing_epoch``, ``epoch`` (of the
   view the sidecar holds), ``job`` (its ``job`` label, "" without), ``rank``
   (null without one), ``world_size``, ``rank_epoch`` (the epoch of the
   job's assignment: the fencing token to form a process group with;
   ``ranks``: every member's rank), ``grace_left`` (seconds of grace window
   the node holds from a quorum). A script re-forms its process group when
   ``rank_epoch`` grows and acts as a member only while ``is_member``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from membership.shared.errors import InvalidArgument, MembershipError
from membership.shared.exits import CliError

if TYPE_CHECKING:
    from membership._client import MembershipClient

__all__ = ["MAX_LINE", "MAX_PATH", "ControlServer", "request", "start", "status_of", "stop"]

log = logging.getLogger("membership.control")

MAX_LINE = 64 * 1024
"""Bytes of one request or answer line, at most (rule 2)."""

MAX_PATH = 107
"""Bytes of the socket's path, at most (``sun_path`` on Linux, less its NUL)."""


def status_of(client: MembershipClient) -> dict[str, Any]:
    """The node's standing as the control socket reports it (rule 3)."""
    job = client.assignment
    me = client.node_id or ""
    member = client.view.get(me)
    return {
        "ok": True,
        "node_id": me,
        "incarnation": client.incarnation,
        "state": client.state.value,
        "fenced": client.fenced,
        "is_member": client.is_member,
        "fencing_epoch": client.fencing_epoch,
        "epoch": client.view.epoch,
        "job": member.job if member is not None else client.labels.get("job", ""),
        "rank": client.rank,
        "world_size": client.world_size,
        "rank_epoch": job.epoch if job is not None else 0,
        "ranks": dict(job.ranks) if job is not None else {},
        "grace_left": round(client.grace_left, 3),
    }


class ControlServer:
    """The unix socket of rule 1, answering rules 2 and 3 for ``client``.

    Args:
        client: the node's client (started by the caller).
        path: where the socket goes.
    """

    def __init__(self, client: MembershipClient, path: str) -> None:
        self.client = client
        self.path = path
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Binds the socket (rule 1).

        Raises:
            InvalidArgument: PATH holds something that is not a stale socket.
            OSError: it cannot be bound.
        """
        _clear_stale(self.path)
        old = os.umask(0o177)  # created 0600: no window where others may connect
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=self.path, limit=MAX_LINE
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stops serving and removes the socket file."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    writer.write(_line({"ok": False, "error": f"request over {MAX_LINE} bytes"}))
                    break
                if not line:
                    break
                writer.write(_line(await self.answer(line)))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def answer(self, line: bytes) -> dict[str, Any]:
        """The answer to one request line (rule 2)."""
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise InvalidArgument("a request is a JSON object")
            cmd = req.get("cmd")
            if cmd == "status":
                return status_of(self.client)
            if cmd == "grace":
                seconds, reason = req.get("seconds"), req.get("reason", "")
                if not isinstance(reason, str):
                    raise InvalidArgument("reason must be a string")
                timeout = _timeout(req, None)
                window = await self.client.grace(seconds, reason, timeout)  # type: ignore[arg-type]
                return {
                    "ok": True,
                    "seconds": window.seconds,
                    "grant": window.grant,
                    "covered": round(window.covered, 3),
                }
            if cmd == "wait":
                return await self._wait(req)
            raise InvalidArgument(f"unknown cmd {cmd!r} (status, grace, wait)")
        except (ValueError, MembershipError) as e:  # JSONDecodeError is a ValueError
            return {"ok": False, "error": str(e) or type(e).__name__}

    async def _wait(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.client
        after, timeout = req.get("after", _rank_epoch(client)), _timeout(req, 30.0)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidArgument(f"after must be an epoch (an int >= 0), got {after!r}")
        loop = asyncio.get_running_loop()
        end = loop.time() + min(timeout or 0.0, 3600.0)
        events = [client._view_changed]
        if client._agent is not None:  # the node's fence timer and acks set it
            events.append(client._agent.fence_changed)
        while _rank_epoch(client) <= after and not client.fenced:
            left = end - loop.time()
            if left <= 0:
                return {**status_of(client), "timed_out": True}
            for ev in events:
                ev.clear()
            waits = [asyncio.ensure_future(ev.wait()) for ev in events]
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        return status_of(client)


def _timeout(req: dict[str, Any], default: float | None) -> float | None:
    """A request's ``"timeout"`` (seconds >= 0), or ``default`` without one."""
    timeout = req.get("timeout", default)
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidArgument(f"timeout must be a number >= 0, got {timeout!r}")
    return float(timeout)


def _rank_epoch(client: MembershipClient) -> int:
    job = client.assignment
    return 0 if job is None else job.epoch


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _clear_stale(path: str) -> None:
    """Rule 1: removes a socket nobody listens on at ``path``; refuses anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise InvalidArgument(f"--control-socket {path}: exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: its sidecar is gone
            return
    raise InvalidArgument(f"--control-socket {path}: another sidecar is listening there")


async def start(client: MembershipClient, path: str | None) -> ControlServer | None:
    """Starts the control socket at ``path`` for ``client`` (None: no socket), making
    its folder if needed.

    Raises:
        InvalidArgument: ``path`` is too long for a unix socket, or holds something
            that is not a stale socket (rule 1).
        CliError: the folder or the socket cannot be made there (the error names
            ``--control-socket`` and the path).
    """
    if not path:
        return None
    if len(os.fsencode(path)) > MAX_PATH:
        raise InvalidArgument(
            f"--control-socket {path}: {len(os.fsencode(path))} bytes, over the "
            f"{MAX_PATH} a unix socket's path may have (choose a shorter one)"
        )
    server = ControlServer(client, path)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        await server.start()
    except OSError as e:
        raise CliError(
            f"--control-socket {path}: cannot serve it there: {e.strerror or e}"
        ) from None
    log.info("control socket at %s", path)
    return server


async def stop(server: ControlServer | None) -> None:
    """Stops ``server`` if there is one."""
    if server is not None:
        await server.close()


def request(path: str, obj: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Sends one request to the control socket at ``path``; returns its answer (blocking).

    Raises:
        OSError: nothing listens there (or the socket cannot be reached).
        TimeoutError: no answer within ``timeout`` seconds.
        ValueError: the answer is not a JSON object.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(_line(obj))
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(MAX_LINE)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise ValueError("answer over the line limit")
    answer = json.loads(buf)
    if not isinstance(answer, dict):
        raise ValueError(f"not an answer: {buf[:200]!r}")
    return answer
