"""Fixtures for the tenants tests: the API's (an app over a real database, its settings, tools, metrics)."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
