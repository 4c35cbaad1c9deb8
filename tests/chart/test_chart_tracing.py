"""The chart's tracing values: the standard OTEL_* variables in the workers' ConfigMap, nothing without an endpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agentrun.worker.obs.tracing import tracer_from_env
from tests.support.chart import CHART, NAMESPACE, Manifest, find, run_helm


def config(manifests: list[Manifest]) -> dict[str, str]:
    data: dict[str, str] = find(manifests, "ConfigMap", "-config")["data"]
    return data


def test_no_tracing_without_an_endpoint(render: Callable[..., list[Manifest]]) -> None:
    assert not [k for k in config(render()) if k.startswith("OTEL_")]


def test_tracing_values_become_the_standard_variables(render: Callable[..., list[Manifest]], tmp_path: Path) -> None:
    values = tmp_path / "tracing.yaml"
    values.write_text(yaml.safe_dump({"tracing": {
        "otlpEndpoint": "http://otel-collector.observability:4318",
        "headers": {"x-tenant": "team-a"},
        "resourceAttributes": {"deployment.environment.name": "prod", "service.namespace": "agents"},
        "sampler": "parentbased_traceidratio", "samplerArg": "0.25",
    }}))
    data = config(render(values))
    otel = {k: v for k, v in data.items() if k.startswith("OTEL_")}
    assert otel == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a",
        "OTEL_RESOURCE_ATTRIBUTES":
            f"deployment.environment.name=prod,k8s.namespace.name={NAMESPACE},service.namespace=agents",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false",
    }
    # What the chart sets, the worker accepts: tracing on, content off.
    tracer = tracer_from_env(otel, "demo-worker-0")
    assert tracer is not None and not tracer.capture_content
    tracer.shutdown()


@pytest.mark.parametrize(("tracing", "where"), [
    ({"otlpEndpoint": "otel:4318"}, "/tracing/otlpEndpoint"),
    ({"sampler": "sometimes"}, "/tracing/sampler"),
    ({"samplerArg": "half"}, "/tracing/samplerArg"),
    ({"resourceAttributes": {"a": "x,y=z"}}, "/tracing/resourceAttributes"),
    ({"captureMessageContent": "yes"}, "/tracing/captureMessageContent"),
])
def test_schema_refuses_bad_tracing_values(helm: str, tmp_path: Path, tracing: dict[str, object], where: str) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(yaml.safe_dump({"tracing": tracing}))
    result = run_helm(helm, "template", "demo", str(CHART), "--values", str(values))
    assert result.returncode != 0
    assert where in result.stderr, result.stderr


def test_the_image_has_the_otel_extra() -> None:
    import tomllib

    root = CHART.parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("opentelemetry-exporter-otlp-proto-http") for d in extras["otel"])
    assert "agentrun[otel]" in " ".join(extras["test"])
    installs = [ln for ln in (root / "Dockerfile").read_text().splitlines() if "pip install" in ln and ".[" in ln]
    assert installs and "otel" in installs[0].split(".[", 1)[1].split("]", 1)[0].split(",")
