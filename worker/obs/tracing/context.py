"""W3C Trace Context for runs: the `traceparent` a caller gives at submit, and the trace id of a run.

Pure, no I/O and no OpenTelemetry import: the API and the operator validate with it whether or not
tracing is on, so a run submitted today still joins its caller's trace when a worker traces it later.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

# https://www.w3.org/TR/trace-context/#traceparent-header-field-values, version 00, lowercase as the
# spec writes it, ids not all zero. The API's OpenAPI document states this very pattern, so what it
# documents and what it accepts are the same set.
TRACEPARENT_PATTERN = r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
_SHAPE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

TRACEPARENT_ANNOTATION = "agentrun.dev/traceparent"
"""The AgentRun annotation the operator reads, like the `traceparent` header of `POST /api/runs`."""


@dataclasses.dataclass(frozen=True)
class TraceParent:
    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)

    def header(self) -> str:
        """The version-00 form, as stored with the run."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(text: str) -> TraceParent:
    """The caller's span; ValueError saying what is wrong with `text`."""
    shape = _SHAPE.fullmatch(text)
    if shape is None:
        raise ValueError("must be a W3C traceparent: 00-<32 lowercase hex trace id>-<16 lowercase hex parent id>-"
                         "<2 hex flags>")
    version, trace_id, span_id, flags = shape.groups()
    if version != "00":
        raise ValueError(f"has version {version}; only version 00 is accepted")
    if _TRACEPARENT.fullmatch(text) is None:
        raise ValueError("has an all-zero trace id or parent id")
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def checked_traceparent(text: str | None) -> str | None:
    """The version-00 header to store for `text` (None stays None); ValueError if it is malformed."""
    return None if text is None else parse_traceparent(text).header()


def run_trace_id(run_id: uuid.UUID, traceparent: str | None) -> int:
    """The trace every worker writes a run's spans to: the caller's, else the run id's 128 bits."""
    return parse_traceparent(traceparent).trace_id if traceparent else run_id.int
