"""Log formats of the long-running commands (``--log-format text|json``) and structured events.

Rules:

1. ``text`` (the default) is ``TIME LEVEL LOGGER: MESSAGE``, as before.
   ``json`` is one JSON object per line: ``ts`` (UTC, ISO 8601 with
   milliseconds), ``level``, ``logger``, ``msg``, then the record's
   structured fields (an exception's traceback in ``exc``). Every line is a
   whole object: a message with newlines stays one line.
2. A structured event is logged with :func:`log_event`: its ``event`` name
   and fields go into the JSON object as they are (``"event":
   "membership_change", "epoch": 12, ...``); in text they follow the
   message as ``key=value`` (values in JSON). The events the replicas log
   are listed in README.md ("Structured logs"): ``membership_change`` (a
   member became ALIVE, DEAD with its ``evidence``, or LEFT with
   ``removed_by``), ``raft_role`` (an election: term, leader, role), and
   ``config_change`` (reserved for the arbiter group's configuration).
3. Field names never override the fixed keys of rule 1 (a clash is logged
   as ``field_<name>``).

The standard :mod:`logging` module throughout, with a small formatter
class; no library is needed for a dozen lines of JSON encoding.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import Any

from membership.shared.errors import InvalidArgument

__all__ = [
    "ENV_LOG_FORMAT",
    "FORMATS",
    "JsonFormatter",
    "log_event",
    "setup_logging",
]

# --log-format's environment variable (the flag wins).
ENV_LOG_FORMAT = "MEMBERSHIP_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The attribute of a LogRecord that carries an event's fields.
_FIELDS = "membership_fields"
_FIXED = frozenset({"ts", "level", "logger", "msg", "exc", "event"})


def _text_value(value: Any) -> str:
    return json.dumps(value, default=str, separators=(",", ":"))


def log_event(
    logger: logging.Logger,
    event: str,
    message: str = "",
    *,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """Logs one structured event (rule 2).

    Args:
        logger: where to log.
        event: the event's name, e.g. ``"membership_change"``, ``"raft_role"``,
            ``"config_change"``.
        message: the human sentence (default: the event's name).
        level: the logging level.
        fields: JSON-encodable values (others are logged as their ``str``).

    Example::

        log_event(log, "config_change", "a4 added as a learner", arbiter="a4",
                  change="add_learner", index=812)
    """
    if not logger.isEnabledFor(level):
        return
    text = message or " ".join([event, *(f"{k}={_text_value(v)}" for k, v in fields.items())])
    record = {"event": event, "msg": message or event, **fields}
    logger.log(level, "%s", text, extra={_FIELDS: record})


class JsonFormatter(logging.Formatter):
    """One JSON object per record (rule 1)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        fields: dict[str, Any] = dict(getattr(record, _FIELDS, None) or {})
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": fields.pop("msg", None) or record.getMessage(),
        }
        if "event" in fields:
            out["event"] = fields.pop("event")
        for key, value in fields.items():
            out[f"field_{key}" if key in _FIXED else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, separators=(",", ":"))


def setup_logging(level: str, log_format: str | None = None) -> None:
    """Configures the root logger on stderr at ``level`` in ``log_format``.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` or ``json``; None reads ``MEMBERSHIP_LOG_FORMAT``
            (default ``text``).

    Like :func:`logging.basicConfig`, it changes nothing when the root
    logger has handlers already (a test runner's).

    Raises:
        InvalidArgument: an unknown format (from the environment; the flag's
            choices are checked by argparse).
    """
    fmt = log_format or os.environ.get(ENV_LOG_FORMAT, "").strip().lower() or "text"
    if fmt not in FORMATS:
        raise InvalidArgument(f"{ENV_LOG_FORMAT}={fmt!r}: the log format is text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
