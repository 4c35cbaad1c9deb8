"""W3C Trace Context for runs: the `traceparent` a caller gives at submit, and the trace id of a run.

Pure, no I/O and no OpenTelemetry import: the API and the operator validate with it whether or not
tracing is on, so a run submitted today still joins its caller's trace when a worker traces it later.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

# https://www.w3.org/TR/trace-context/#traceparent-header-field-values. A version above 00 may carry
# more fields after the four of 00, which a 00 reader ignores (the spec's forward compatibility).
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")

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
    m = _TRACEPARENT.match(text.strip().lower()) if len(text) <= 512 else None
    if m is None:
        raise ValueError("must be a W3C traceparent: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>")
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff":
        raise ValueError("has the forbidden version ff")
    if version == "00" and rest:
        raise ValueError("has fields after the flags, which version 00 does not allow")
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        raise ValueError("has an all-zero trace id or parent id")
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def normalized_traceparent(text: str | None) -> str | None:
    """The version-00 header to store for `text` (None stays None); ValueError if it is malformed."""
    return None if text is None else parse_traceparent(text).header()


def run_trace_id(run_id: uuid.UUID, traceparent: str | None) -> int:
    """The trace every worker writes a run's spans to: the caller's, else the run id's 128 bits."""
    return parse_traceparent(traceparent).trace_id if traceparent else run_id.int
