"""Deterministic simulator of replicas, nodes and subscribers (DESIGN.md section 7).

See README.md in this folder: how to run it, the invariants, the bounds.
"""
