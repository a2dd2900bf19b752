"""Test support shared by the test tiers and the benchmarks (no tests in here)."""
