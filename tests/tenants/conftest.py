"""Fixtures for the tenants tests: the API's (an app over a real database, its HTTP client, a real server),
and `http`, a client of an app that admits identities of several tenants (tests/support/tenants.py)."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.cli import restore_logging  # noqa: F401  (a fixture)
from tests.support.tenants import http  # noqa: F401  (a fixture)
