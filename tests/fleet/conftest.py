from tests.support.api import app, client, metrics, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.roles import roles  # noqa: F401  (a fixture)
