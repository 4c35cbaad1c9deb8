"""Smoke tests of the benchmarks at tiny sizes."""
