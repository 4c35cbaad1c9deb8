"""Benchmarks of issue 8; see bench/README.md."""
