"""Test-wide settings."""

from __future__ import annotations

import os

# Tests fork child processes (with a preexec_fn that ties them to the test's
# life) while gRPC is running in the test process. gRPC's fork handlers then
# restart its poller in the child before exec, which can abort the child
# (grpc/grpc#43055). The children exec at once and need none of that. Must be
# set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
