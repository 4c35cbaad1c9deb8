"""Fixtures for the worker tests that are not the suite's own (tests/conftest.py)."""

from tests.support.roles import roles  # noqa: F401  (a fixture)
