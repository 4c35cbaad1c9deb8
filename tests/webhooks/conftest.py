"""The webhooks tests use the API fixtures too."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
