from tests.support.api import app, client, metrics, settings, toolbox  # noqa: F401  (fixtures)
