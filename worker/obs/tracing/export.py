"""The SDK side of tracing: resource, sampler and exporters as the OTEL_* variables describe them.

The SDK reads most variables itself (OTEL_EXPORTER_OTLP_*, OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME,
OTEL_TRACES_SAMPLER, OTEL_BSP_*); this adds the defaults that make sense for a worker.
"""

from __future__ import annotations

from importlib import metadata

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from agentrun.worker.obs.tracing.spans import RunTracer, new_provider


def worker_resource(worker_id: str) -> Resource:
    """The SDK's resource, with the service named `agentrun` and the instance the worker id unless the
    variables (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) say otherwise."""
    try:
        version = metadata.version("agentrun")
    except metadata.PackageNotFoundError:
        version = "unknown"
    said = OTELResourceDetector().detect().attributes  # what the variables alone say
    ours = {SERVICE_NAME: "agentrun", SERVICE_INSTANCE_ID: worker_id, SERVICE_VERSION: version}
    return Resource.create({k: v for k, v in ours.items() if k not in said})


def build_tracer(exporters: list[str], worker_id: str, capture_content: bool) -> RunTracer:
    provider = new_provider(resource=worker_resource(worker_id))
    for name in exporters:
        exporter: SpanExporter = OTLPSpanExporter() if name == "otlp" else ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return RunTracer(provider, worker_id, capture_content)
