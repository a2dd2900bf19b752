"""Limits of the wire contract, shared by the SDK (fail early) and the arbiter (enforce).

What a node may announce (ids, labels, incarnations, status) and the keepalive
contract both sides keep.

Every function raises :class:`membership.shared.errors.InvalidArgument` with a
message that names the offending field and the limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from membership.shared.errors import InvalidArgument

__all__ = [
    "MAX_GPUS",
    "MAX_GPU_ERROR",
    "MAX_HEALTH_REASON",
    "MAX_INCARNATION",
    "MAX_LABELS",
    "MAX_LABELS_BYTES",
    "MAX_LABEL_KEY",
    "MAX_LABEL_VALUE",
    "MAX_NODE_ID",
    "MIN_KEEPALIVE_TIME",
    "MIN_KEEPALIVE_TIMEOUT",
    "NAME_PATTERN",
    "STATUS_FRACTIONS",
    "parse_address",
    "parse_arbiters",
    "validate_cluster_name",
    "validate_gpus",
    "validate_health_reason",
    "validate_incarnation",
    "validate_labels",
    "validate_node_id",
]

# The keepalive contract between the SDK and the arbiters, in seconds (failure
# class "keepalive policy mismatch" in docs/architecture.md).
# An arbiter accepts a client's HTTP/2 pings as often as every
# MIN_KEEPALIVE_TIME (its min_ping_interval may be lower, never higher), and no
# client of an arbiter pings more often (keepalive_time may be higher, never
# lower): the two sides are configured apart but can never disagree, so no
# GOAWAY too_many_pings. Both sides permit pings on connections without
# calls and neither caps pings without data. To ping faster, lower this
# contract (and so both sides' checks), never one side alone.
MIN_KEEPALIVE_TIME = 4.0
# keepalive_timeout is also each socket's TCP_USER_TIMEOUT (grpc core sets it
# from keepalive_timeout_ms, see ClientConfig.channel_options): below about a
# second a few retransmissions (Linux's minimum RTO is 0.2 s) would abort a
# healthy connection.
MIN_KEEPALIVE_TIMEOUT = 1.0

MAX_NODE_ID = 128
MAX_LABELS = 32
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 256
MAX_LABELS_BYTES = 4096
MAX_GAUGES = 64
MAX_PHASE = 64
# A status's own health reason (NodeStatus.health_reason), characters.
MAX_HEALTH_REASON = 256
# GPUs in one status (NodeStatus.gpus; indexes 0..MAX_GPUS - 1), and the
# characters of one GPU's NVML error name.
MAX_GPUS = 32
MAX_GPU_ERROR = 64
# The largest incarnation: 2**53 - 1, the largest integer an IEEE 754 double
# holds exactly, so that clients in languages whose numbers are doubles
# (JavaScript, many JSON decoders) read the value they sent
# (docs/protocol.md, "Incarnations"). Wall-clock milliseconds, the SDK's
# default, stay below it for another 285,000 years.
MAX_INCARNATION = 2**53 - 1

_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Label keys, status gauge names and the phase (membership.shared.status uses it too).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def validate_incarnation(incarnation: int) -> None:
    """Checks an incarnation number: 1 to :data:`MAX_INCARNATION`.

    Raises:
        InvalidArgument: naming the range.
    """
    if not 1 <= incarnation <= MAX_INCARNATION:
        raise InvalidArgument(
            f"incarnation must be in 1..{MAX_INCARNATION} (2**53 - 1), got {incarnation}"
        )


def validate_node_id(node_id: str) -> str:
    """Checks a node id: 1 to 128 characters of ``[A-Za-z0-9._-]``, starting alphanumeric.

    Returns:
        The node id unchanged.

    Raises:
        InvalidArgument: when it is empty, too long or has another character.
    """
    if not node_id:
        raise InvalidArgument("node_id is empty")
    if len(node_id) > MAX_NODE_ID:
        raise InvalidArgument(
            f"node_id is {len(node_id)} characters long, the limit is MAX_NODE_ID = {MAX_NODE_ID}"
        )
    if not _NODE_ID.fullmatch(node_id):
        raise InvalidArgument(
            f"node_id {node_id[:80]!r} has characters other than letters, digits, '.', '_', '-' "
            "or does not start with a letter or digit"
        )
    return node_id


def validate_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """Checks static labels: at most 32, keys up to 63 characters of ``[A-Za-z0-9._/-]``,
    values up to 256 printable characters, 4096 bytes in all (keys plus values, UTF-8).

    Returns:
        The labels unchanged.

    Raises:
        InvalidArgument: naming the first label that breaks a limit.
    """
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(
            f"labels: {len(labels)} labels, the limit is MAX_LABELS = {MAX_LABELS}"
        )
    total = 0
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument("labels must map strings to strings")
        if not key or len(key) > MAX_LABEL_KEY or not NAME_PATTERN.fullmatch(key):
            raise InvalidArgument(
                f"labels: label key {key[:80]!r} must be 1 to MAX_LABEL_KEY = {MAX_LABEL_KEY} "
                "characters of letters, digits, '.', '_', '/', '-', starting with a letter or digit"
            )
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(
                f"labels: label {key!r} has a value of {len(value)} characters, "
                f"the limit is MAX_LABEL_VALUE = {MAX_LABEL_VALUE}"
            )
        if not value.isprintable():
            raise InvalidArgument(
                f"labels: label {key!r} has a non-printable character in its value"
            )
        total += len(key.encode()) + len(value.encode())
    if total > MAX_LABELS_BYTES:
        raise InvalidArgument(
            f"labels: they take {total} bytes, the limit is MAX_LABELS_BYTES = {MAX_LABELS_BYTES}"
        )
    return labels


# Status fields that are fractions (0..1); the other numbers are only >= 0.
STATUS_FRACTIONS = (
    "gpu_utilization",
    "progress",
    "cpu_utilization",
    "memory_utilization",
    "gpu_memory_utilization",
)


def validate_status(
    phase: str,
    gauges: Mapping[str, float],
    numbers: Mapping[str, float] | None = None,
) -> None:
    """Checks a heartbeat's status: phase up to 64 printable characters, at most 64
    gauges named like label keys with finite values, and the numeric fields.

    Args:
        phase: the training phase ("" when absent).
        gauges: the application gauges.
        numbers: the numeric fields that are present, by name: ``load``
            (>= 0), ``step`` (>= 0) and the fractions ``progress``,
            ``cpu_utilization``, ``memory_utilization``, ``gpu_utilization``,
            ``gpu_memory_utilization`` (0..1).

    Raises:
        InvalidArgument: naming what breaks a limit.
    """
    if len(phase) > MAX_PHASE:
        raise InvalidArgument(
            f"status: phase is {len(phase)} characters, the limit is MAX_PHASE = {MAX_PHASE}"
        )
    if not phase.isprintable():
        raise InvalidArgument("status: phase has a non-printable character")
    if len(gauges) > MAX_GAUGES:
        raise InvalidArgument(
            f"status: {len(gauges)} gauges, the limit is MAX_GAUGES = {MAX_GAUGES}"
        )
    for key, value in gauges.items():
        if not key or len(key) > MAX_LABEL_KEY or not NAME_PATTERN.fullmatch(key):
            raise InvalidArgument(
                f"status: gauge name {key[:80]!r} is not 1 to MAX_LABEL_KEY = {MAX_LABEL_KEY} "
                "characters of letters, digits, '.', '_', '/', '-', starting alphanumeric"
            )
        if not math.isfinite(value):
            raise InvalidArgument(f"status: gauge {key!r} is {value}, not a finite number")
    for name, value in (numbers or {}).items():
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"status: {name} is {value}, not a finite number >= 0")
        if name in STATUS_FRACTIONS and value > 1:
            raise InvalidArgument(f"status: {name} is {value}, not a fraction in 0..1")


def validate_health_reason(reason: str) -> str:
    """Checks the application's health reason: at most 256 printable characters.

    Returns:
        The reason unchanged.

    Raises:
        InvalidArgument: naming the limit.
    """
    if not isinstance(reason, str):
        raise InvalidArgument(f"status: health reason must be a string, got {reason!r}")
    if len(reason) > MAX_HEALTH_REASON:
        raise InvalidArgument(
            f"status: health reason is {len(reason)} characters, the limit is "
            f"MAX_HEALTH_REASON = {MAX_HEALTH_REASON}"
        )
    if not reason.isprintable():
        raise InvalidArgument("status: health reason has a non-printable character")
    return reason


def validate_gpus(gpus: Sequence[tuple[int, str, Mapping[str, float]]]) -> None:
    """Checks a status's GPUs: at most :data:`MAX_GPUS`, each index in
    ``0..MAX_GPUS - 1`` once, its error at most 64 printable characters, its
    utilisation and memory fractions in 0..1 and its byte counts finite and >= 0.

    Args:
        gpus: ``(index, error, numbers)`` per GPU, ``numbers`` holding the
            numeric fields present by name (``utilization`` and
            ``memory_utilization`` are fractions).

    Raises:
        InvalidArgument: naming the GPU and the limit it breaks.
    """
    if len(gpus) > MAX_GPUS:
        raise InvalidArgument(f"status: {len(gpus)} GPUs, the limit is MAX_GPUS = {MAX_GPUS}")
    seen: set[int] = set()
    for index, error, numbers in gpus:
        if not 0 <= index < MAX_GPUS or index in seen:
            raise InvalidArgument(
                f"status: GPU index {index} is out of 0..{MAX_GPUS - 1} or given twice"
            )
        seen.add(index)
        if len(error) > MAX_GPU_ERROR or not error.isprintable():
            raise InvalidArgument(
                f"status: GPU {index}'s error must be at most {MAX_GPU_ERROR} printable characters"
            )
        for name, value in numbers.items():
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(
                    f"status: GPU {index}'s {name} is {value}, not a finite number >= 0"
                )
            if name.endswith("utilization") and value > 1:
                raise InvalidArgument(
                    f"status: GPU {index}'s {name} is {value}, not a fraction in 0..1"
                )


def validate_cluster_name(name: str) -> str:
    """Checks a cluster name: 1 to 64 characters of ``[A-Za-z0-9._/-]``, starting
    with a letter or digit.

    Returns:
        The name unchanged.

    Raises:
        InvalidArgument: when it is not such a name.
    """
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"cluster {str(name)[:80]!r} must be 1 to 64 characters of letters, digits, "
            "'.', '_', '/', '-', starting with a letter or digit"
        )
    return name


def parse_arbiters(arbiters: Sequence[str]) -> list[str]:
    """Checks a list of arbiter addresses (``host:port`` each, none twice).

    Returns:
        The addresses, stripped, in the order given.

    Raises:
        InvalidArgument: for one string instead of a list, an empty list, a
            malformed address or an address listed twice.
    """
    if isinstance(arbiters, str):
        raise InvalidArgument("arbiters must be a list of 'host:port' strings, not one string")
    if not arbiters:
        raise InvalidArgument("at least one arbiter address is needed")
    addresses = [parse_address(a) for a in arbiters]
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    if twice:
        raise InvalidArgument(f"arbiter address listed twice: {', '.join(twice)}")
    return addresses


def parse_address(address: str) -> str:
    """Checks a ``host:port`` address (IPv6 hosts in brackets) and returns it stripped.

    Raises:
        InvalidArgument: when the port is missing or not in 1..65535.
    """
    address = address.strip()
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"address {address!r} is not host:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"address {address!r} has no valid port (1..65535)")
    return address
