"""Which arbiters a command talks to: ``--arbiters``, or ``MEMBERSHIP_ARBITERS``.

As ``ETCDCTL_ENDPOINTS`` and ``CONSUL_HTTP_ADDR`` spare etcdctl and consul
their endpoint flags, ``MEMBERSHIP_ARBITERS`` (the same comma-separated
``host:port`` list as the flag) spares every command its ``--arbiters``.
Rules:

1. The flag wins over the variable.
2. Neither: the usage error argparse gives for a missing required flag, with
   ``(or set MEMBERSHIP_ARBITERS)`` (exit 2).
3. A malformed variable is a usage error that names the variable, not the
   flag the user never typed (exit 2).

:func:`add_arbiters_flag` adds the flag; :func:`fill_from_env` applies the
rules after parsing (``membership.cli.main``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ENV_ARBITERS", "add_arbiters_flag", "fill_from_env"]

ENV_ARBITERS = "MEMBERSHIP_ARBITERS"


def add_arbiters_flag(
    p: argparse.ArgumentParser, parse: Callable[[str], Any], help_text: str
) -> None:
    """Adds ``--arbiters`` to ``p``, filled from ``MEMBERSHIP_ARBITERS`` when absent.

    Args:
        p: the sub-command's parser.
        parse: the flag's value type (raises ``argparse.ArgumentTypeError``).
        help_text: the flag's help; the variable is appended.
    """
    p.add_argument(
        "--arbiters", default=None, type=parse, help=f"{help_text}; default ${ENV_ARBITERS}"
    )
    p.set_defaults(_arbiters_env=(p, parse))


def fill_from_env(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> None:
    """Applies the module's rules to parsed ``args`` (in place).

    Raises:
        SystemExit: 2, through the sub-command parser's ``error`` (rules 2 and 3).
    """
    hook = getattr(args, "_arbiters_env", None)
    if hook is None:
        return
    del args._arbiters_env
    if args.arbiters is not None:
        return  # rule 1
    parser, parse = hook
    raw = (os.environ if env is None else env).get(ENV_ARBITERS, "")
    if not raw.strip():
        parser.error(f"the following arguments are required: --arbiters (or set {ENV_ARBITERS})")
    try:
        args.arbiters = parse(raw)
    except (argparse.ArgumentTypeError, ValueError) as e:
        parser.error(f"{ENV_ARBITERS}={raw!r}: {e}")
