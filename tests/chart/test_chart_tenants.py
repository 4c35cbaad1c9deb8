"""`tenants.quotas`: the chart hands the workers each tenant's initial quotas as AGENTRUN_TENANT_QUOTAS, which
the worker's settings read back as they were given; none by default."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from agentrun.operator.settings import namespace_tenants
from agentrun.worker.core.tenants import Quotas
from agentrun.worker.settings import tenant_quotas
from tests.support.chart import CHART, Manifest

Render = Callable[..., list[Manifest]]
EVERYTHING = CHART / "ci" / "everything-keda-values.yaml"


def _config(manifests: list[Manifest]) -> dict[str, str]:
    (config,) = [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-config")]
    return config["data"]  # type: ignore[no-any-return]


def test_initial_quotas_reach_the_workers_as_given(render: Render) -> None:
    data = _config(render(EVERYTHING))
    assert tenant_quotas(data["AGENTRUN_TENANT_QUOTAS"]) == {
        "team-a": Quotas(50, 10000, 50_000_000, Decimal("200"), 1.0),
        "batch": Quotas(max_running=5, weight=0.5),
    }


def test_no_quotas_by_default(render: Render) -> None:
    assert "AGENTRUN_TENANT_QUOTAS" not in _config(render())


def test_the_namespace_map_reaches_the_operator_as_given(render: Render) -> None:
    data = _config(render(EVERYTHING))
    assert namespace_tenants(data["AGENTRUN_NAMESPACE_TENANTS"]) == {"billing-prod": "billing",
                                                                     "billing-staging": "billing"}
    assert "AGENTRUN_NAMESPACE_TENANTS" not in _config(render())
