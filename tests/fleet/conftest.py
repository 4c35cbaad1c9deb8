from tests.api.conftest import app, client, metrics, settings, toolbox  # noqa: F401  (fixtures)
