"""values.schema.json rejects bad values with a message naming the field, before anything renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chart import BAD_VALUES, CHART, run_helm

# What each bad file gets wrong, as helm's schema error names it.
EXPECTED = {
    "negative-replicas.yaml": "/worker/replicas",
    "unknown-key.yaml": "replicaCount",
    "bad-log-format.yaml": "/config/logFormat",
    "keda-and-hpa.yaml": "/autoscaling/hpa/enabled",
    "zero-lease.yaml": "/worker/leaseSeconds",
    "zero-concurrency.yaml": "/worker/concurrency",
    "incomplete-price.yaml": "cache_read",
    "provider-kind.yaml": "/providers/endpoints/0/kind",
    "mcp-server-name.yaml": "/mcp/servers/0/name",
    "zero-database-retry.yaml": "/database/retryMaxSeconds",
    "network-policy-cidr.yaml": "/networkPolicy/egress/models/cidrs/0",
    "operator-probe.yaml": "/operator/readinessProbe/periodSeconds",
    "tenant-quota.yaml": "/tenants/quotas/team-a/maxQueued",
    "tenant-namespace.yaml": "/tenants/namespaces/billing-prod",
}


def test_every_bad_values_file_has_an_expectation() -> None:
    assert {p.name for p in BAD_VALUES} == set(EXPECTED)


@pytest.mark.parametrize("values", BAD_VALUES, ids=lambda p: p.stem)
def test_schema_rejects(helm: str, values: Path) -> None:
    result = run_helm(helm, "template", "demo", str(CHART), "--values", str(values))
    assert result.returncode != 0
    assert "don't meet the specifications of the schema" in result.stderr
    assert EXPECTED[values.name] in result.stderr


def test_template_refuses_two_autoscalers_even_without_the_schema(helm: str) -> None:
    bad = next(p for p in BAD_VALUES if p.name == "keda-and-hpa.yaml")
    result = run_helm(helm, "template", "demo", str(CHART), "--values", str(bad), "--skip-schema-validation")
    assert result.returncode != 0
    assert "mutually exclusive" in result.stderr


def test_missing_database_secret_name_is_explained(helm: str) -> None:
    result = run_helm(helm, "template", "demo", str(CHART), "--set", "database.existingSecret=")
    assert result.returncode != 0
    assert "database.existingSecret must name a Secret" in result.stderr
