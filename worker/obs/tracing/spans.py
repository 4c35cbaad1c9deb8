"""`RunTracer`: the engine's `Observer` as OpenTelemetry spans, after the GenAI semantic conventions.

A worker's drive of a run is an `invoke_agent` span; each model step a `chat {model}` span and each
tool step an `execute_tool {name}` span inside it. Every worker writes a run's spans to the same trace
(`run_trace_id`), so a run that moved between workers is still one trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agentrun.worker.core.errors import CancelRequested, LeaseLost
from agentrun.worker.core.observer import NoObserver
from agentrun.worker.core.records import DecisionKind, PendingCall, Run, RunStatus
from agentrun.worker.core.types import LlmError, LlmRequest, LlmResponse, Message
from agentrun.worker.obs import logs
from agentrun.worker.obs.tracing.context import parse_traceparent, run_trace_id

# The trace id the next root span takes; set only around the start of a run's span.
_next_trace_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("agentrun_next_trace_id", default=None)

# Model-name prefixes (worker/llm providers) → `gen_ai.provider.name` values of the conventions.
PROVIDERS = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "vertex": "gcp.vertex_ai", "openai": "openai"}


class RunIdGenerator(RandomIdGenerator):
    """Random ids, except the trace id of a run's root span, which the run decides (its id)."""

    def generate_trace_id(self) -> int:
        chosen = _next_trace_id.get()
        return chosen if chosen is not None else super().generate_trace_id()


def new_provider(**kwargs: Any) -> TracerProvider:
    """A tracer provider whose root spans can take a run's trace id; kwargs as for `TracerProvider`."""
    return TracerProvider(id_generator=RunIdGenerator(), **kwargs)


def provider_and_model(model: str) -> tuple[str, str]:
    """`gen_ai.provider.name` and the model as the provider names it, from a possibly prefixed name."""
    prefix, sep, rest = model.partition("/")
    if sep and rest:
        return PROVIDERS.get(prefix, prefix), rest
    return "anthropic", model


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _parts(content: Any) -> list[dict[str, Any]]:
    """Messages API content as the conventions' message parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"),
                          "response": block.get("content")})
        elif kind is not None:
            parts.append({"type": str(kind)})  # thinking, images, …: named, not copied
    return parts


def _messages(messages: list[Message]) -> str:
    return _json([{"role": m.get("role"), "parts": _parts(m.get("content"))} for m in messages])


def _fail(span: trace.Span, e: BaseException, error_type: str | None = None) -> None:
    span.record_exception(e)
    span.set_attribute("error.type", error_type or type(e).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(e)[:500] or type(e).__name__))


@contextlib.contextmanager
def _in(span: trace.Span) -> Iterator[None]:
    """Make `span` current, and the log lines' span, with the block's end told apart: a failed model call
    (its HTTP status), a cancel, a lost lease or an interrupted drive (events: no error of the step),
    anything else (an error). use_span's own handling is off, as it would call all of these errors."""
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False), \
            logs.step_context(**_log_fields(span)):
        try:
            yield
        except LlmError as e:
            _fail(span, e, str(e.status))
            raise
        except CancelRequested:
            span.add_event("cancel_requested")  # the step was interrupted: someone asked the run to stop
            raise
        except (LeaseLost, asyncio.CancelledError) as e:
            span.add_event("lease_lost" if isinstance(e, LeaseLost) else "interrupted")
            raise
        except BaseException as e:
            _fail(span, e)
            raise


def _log_fields(span: trace.Span) -> dict[str, str]:
    ctx = span.get_span_context()
    return {"trace.id": f"{ctx.trace_id:032x}", "span.id": f"{ctx.span_id:016x}"}


class _Notes:
    """What the engine tells about a step, written onto its span; what a kind of step never hears is a no-op."""

    def __init__(self, span: trace.Span, capture: bool) -> None:
        self.span = span
        self.capture = capture

    def sent(self, request: LlmRequest) -> None:
        pass

    def answered(self, response: LlmResponse) -> None:
        pass

    def checkpointed(self, seq: int, attempt: int = 1) -> None:
        self.span.set_attribute("agentrun.step.seq", seq)

    def tool_outcome(self, ok: bool, output: str) -> None:
        pass


class _ModelNotes(_Notes):
    def sent(self, request: LlmRequest) -> None:
        self.span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
        if self.capture:
            self.span.set_attribute("gen_ai.input.messages", _messages(request.messages))
            if request.system:
                instructions = [{"type": "text", "content": request.system}]
                self.span.set_attribute("gen_ai.system_instructions", _json(instructions))

    def answered(self, response: LlmResponse) -> None:
        s, u = self.span, response.usage
        if response.id:
            s.set_attribute("gen_ai.response.id", response.id)
        if response.model:
            s.set_attribute("gen_ai.response.model", response.model)
        if response.stop_reason:
            s.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason])
        # The conventions count cached tokens in input_tokens; the Messages API counts them apart.
        s.set_attribute(
            "gen_ai.usage.input_tokens", u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        )
        s.set_attribute("gen_ai.usage.output_tokens", u.output_tokens)
        s.set_attribute("gen_ai.usage.cache_read.input_tokens", u.cache_read_input_tokens)
        s.set_attribute("gen_ai.usage.cache_creation.input_tokens", u.cache_creation_input_tokens)
        if self.capture:
            message = {"role": "assistant", "parts": _parts(response.content), "finish_reason": response.stop_reason}
            s.set_attribute("gen_ai.output.messages", _json([message]))


class _ToolNotes(_Notes):
    def checkpointed(self, seq: int, attempt: int = 1) -> None:
        super().checkpointed(seq, attempt)
        self.span.set_attribute("agentrun.step.attempt", attempt)

    def tool_outcome(self, ok: bool, output: str) -> None:
        if self.capture:
            self.span.set_attribute("gen_ai.tool.call.result", output)
        if not ok:
            # The model sees the error and carries on; the step itself failed.
            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(Status(StatusCode.ERROR, "the tool returned an error"))


class RunTracer(NoObserver):
    """Spans of the runs a worker drives; pass a provider from `new_provider` (its ids make one trace per run)."""

    def __init__(self, provider: TracerProvider, worker_id: str, capture_content: bool = False) -> None:
        if not isinstance(provider.id_generator, RunIdGenerator):
            raise ValueError("RunTracer needs a provider from new_provider(): its root spans take the run's trace id")
        self.provider = provider
        self.worker_id = worker_id
        self.capture_content = capture_content
        self._tracer = provider.get_tracer("agentrun")
        self._taken_from: dict[uuid.UUID, str] = {}  # claimed by takeover, span not started yet

    def shutdown(self) -> None:
        """Export what is buffered and stop (at the worker's exit)."""
        self.provider.shutdown()

    # -- the Observer seam -------------------------------------------------------------------------

    def claimed(self, takeover: bool, run_id: uuid.UUID | None = None, taken_from: str | None = None) -> None:
        if takeover and run_id is not None:
            self._taken_from[run_id] = taken_from or "unknown"

    def model_retry(self, status: int) -> None:
        span = trace.get_current_span()  # the chat span: retries happen inside the model call
        name = "rate_limit_wait" if status == 429 else "retry"
        span.add_event(name, {"http.response.status_code": status, "error.type": str(status)})

    @contextlib.contextmanager
    def driving(self, run: Run) -> Iterator[None]:
        provider, model = provider_and_model(run.model)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": str(run.id),
            "agentrun.run.id": str(run.id),
            "agentrun.worker.id": self.worker_id,
        }
        if run.k8s_name:
            attributes["agentrun.agentrun.name"] = run.k8s_name
            attributes["agentrun.agentrun.namespace"] = run.k8s_namespace or ""
        if run.traceparent:
            caller = parse_traceparent(run.traceparent)
            parent = trace.set_span_in_context(NonRecordingSpan(
                SpanContext(caller.trace_id, caller.span_id, is_remote=True, trace_flags=TraceFlags(caller.flags))
            ))
        else:
            parent = otel_context.Context()  # a root of its own, whatever span the caller is in
        token = _next_trace_id.set(run_trace_id(run.id, run.traceparent))
        try:
            span = self._tracer.start_span("invoke_agent", parent, SpanKind.INTERNAL, attributes)
        finally:
            _next_trace_id.reset(token)
        with _in(span):
            taken_from = self._taken_from.pop(run.id, None)
            if taken_from is not None:
                span.add_event("lease_takeover", {"agentrun.worker.previous": taken_from})
            yield

    def run_ended(self, run: Run, status: RunStatus, reason: str | None) -> None:
        span = trace.get_current_span()  # the invoke_agent span: the run ends between steps
        span.set_attribute("agentrun.run.status", status.value)
        if status in (RunStatus.FAILED, RunStatus.TIMED_OUT):  # a cancel was asked for: no error
            span.set_attribute("error.type", status.value)
            span.set_status(Status(StatusCode.ERROR, reason or status.value))

    def decisions_read(self, run: Run, calls: Sequence[PendingCall]) -> None:
        span = trace.get_current_span()  # the invoke_agent span: decisions are read between steps
        for call in calls:
            attributes: dict[str, Any] = {
                "gen_ai.tool.name": call.tool_name, "gen_ai.tool.call.id": call.tool_use_id,
                "agentrun.decision.kind": call.kind.value,
            }
            if call.decision is None:
                continue  # still open (another call's decision was read): it was an event when parked
            attributes["agentrun.decision"] = call.decision.value
            if call.decided_by:
                attributes["agentrun.decision.by"] = call.decided_by
            when = int(call.decided_at.timestamp() * 1e9) if call.decided_at else None
            span.add_event("human_decision", attributes, timestamp=when)

    def traceparent(self, run: Run) -> str | None:
        found = trace.get_current_span().get_span_context()  # the invoke_agent span, between steps
        if not found.is_valid:
            return None
        return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"

    def parked(self, run: Run, calls: Sequence[tuple[str, DecisionKind, str]]) -> None:
        span = trace.get_current_span()
        for tool_use_id, kind, name in calls:
            span.add_event("waiting_for_decision", {
                "gen_ai.tool.name": name, "gen_ai.tool.call.id": tool_use_id, "agentrun.decision.kind": kind.value})
        span.set_attribute("agentrun.run.status", RunStatus.WAITING.value)

    @contextlib.contextmanager
    def model_call(self, run: Run) -> Iterator[_ModelNotes]:
        provider, model = provider_and_model(run.model)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": str(run.id),
        }
        span = self._tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes)
        with _in(span):
            yield _ModelNotes(span, self.capture_content)

    @contextlib.contextmanager
    def tool_call(self, run: Run, name: str, tool_use_id: str, input: Any) -> Iterator[_ToolNotes]:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": tool_use_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": str(run.id),
        }
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _json(input)
        span = self._tracer.start_span(f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes=attributes)
        with _in(span):
            yield _ToolNotes(span, self.capture_content)
