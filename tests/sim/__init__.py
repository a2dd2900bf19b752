"""Deterministic simulator of replicas, nodes and subscribers (docs/architecture.md, "Testing").

See README.md in this folder: how to run it, the invariants, the bounds.
"""
