"""Benchmarks and measurement tools for te_async."""
