"""Traces of runs over OpenTelemetry, configured by the standard OTEL_* variables.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER asks
for it; then, and only then, the SDK (the `agentrun[otel]` extra) is imported. `spans.RunTracer` is the
observer; `context` (pure) reads the `traceparent` a caller gives at submit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentrun.worker.obs.tracing.context import (
    TRACEPARENT_ANNOTATION,
    TraceParent,
    checked_traceparent,
    parse_traceparent,
    run_trace_id,
)

if TYPE_CHECKING:
    from agentrun.worker.obs.tracing.spans import RunTracer

__all__ = [
    "TRACEPARENT_ANNOTATION",
    "TraceParent",
    "enabled",
    "checked_traceparent",
    "parse_traceparent",
    "run_trace_id",
    "tracer_from_env",
]

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_TRUE = {"true", "1", "yes", "on", "span_only", "span_and_event"}
_FALSE = {"", "false", "0", "no", "off", "no_content", "event_only"}
EXPORTERS = ("otlp", "console", "none")


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _exporters(environ: Mapping[str, str]) -> list[str]:
    text = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {unknown[0]!r} (known: {', '.join(EXPORTERS)})")
    if not names and (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = ["otlp"]
    return [n for n in names if n != "none"]


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the variables ask for traces (ValueError naming a bad variable)."""
    if _flag(environ, "OTEL_SDK_DISABLED"):
        return False
    return bool(_exporters(environ))


def tracer_from_env(environ: Mapping[str, str], worker_id: str) -> RunTracer | None:
    """The worker's tracer as the OTEL_* variables describe it, or None when tracing is off.

    ValueError naming the variable when one is bad, ImportError (with what to install) when the SDK is missing.
    """
    if not enabled(environ):
        return None
    exporters = _exporters(environ)
    capture = _flag(environ, CAPTURE_CONTENT)
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = (protocol or "http/protobuf").strip()
    if "otlp" in exporters and protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, got {protocol!r}")
    try:
        from agentrun.worker.obs.tracing.export import build_tracer
    except ImportError as e:
        raise ImportError(
            f"tracing is configured (OTEL_* variables) but the OpenTelemetry SDK is missing ({e}): "
            "install agentrun[otel]"
        ) from e
    return build_tracer(exporters, worker_id, capture)
