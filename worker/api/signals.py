"""POST /api/events: an event from outside (a reply, a callback, a CI result) for the runs that wait on its key.

The event is kept for AGENTRUN_EVENT_RETENTION and delivered to every wait on its key that begins within
it (store/waits.py); an `Idempotency-Key` makes a retried POST answer the first answer and deliver nothing
twice. Scope: `signal` (or `submit`, which implies it).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Request, Response
from pydantic import AfterValidator, ConfigDict, Field, field_validator

from agentrun.worker.api.common import IDEMPOTENCY_KEY_SCHEMA, OrjsonRoute, checked_idempotency_key
from agentrun.worker.api.guards import access, caller_name, tenant_for
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import NOT_BLANK, Camel, ErrorBody, not_blank, storable, storable_json
from agentrun.worker.core.tenants import DEFAULT_TENANT, TENANT_PATTERN
from agentrun.worker.core.waits import MAX_KEY_CHARS
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.store import RunStore

MAX_PAYLOAD_BYTES = 64 * 1024
"""The largest payload, as JSON: it becomes a tool result the model reads, not a file transfer."""


class EventRequest(Camel):
    """An event: the fact `key` happened, with `payload` (any JSON value) for the runs that wait for it."""

    model_config = ConfigDict(extra="forbid")

    key: Annotated[
        str, Field(min_length=1, max_length=MAX_KEY_CHARS, json_schema_extra={"pattern": NOT_BLANK},
                   description=f"The event's key (1 to {MAX_KEY_CHARS} characters, not blank), as the waits name "
                   "it: `wait_for_event`'s `key`, or a Python tool's `WaitForEvent(key, ...)`."),
        AfterValidator(storable), AfterValidator(not_blank),
    ]
    payload: Any = Field(None, description=f"Any JSON value (at most {MAX_PAYLOAD_BYTES} bytes as JSON): the result "
                         "of each wait it ends, as JSON text. Default null.")

    tenant: str | None = Field(
        None, min_length=1, max_length=63, pattern=TENANT_PATTERN,
        description="The tenant whose waits the event is for: only its runs get it. When absent the caller's "
        "(its identity's tenant; `default` for a platform operator's identity and on an open API). Only a "
        "platform operator's identity (tenant `\"*\"`) may name another (else 403).")

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: Any) -> Any:
        # The body was parsed by orjson (OrjsonRoute): no NaN, no integer beyond 64 bits, so it dumps back.
        if len(orjson.dumps(value)) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"must be at most {MAX_PAYLOAD_BYTES} bytes as JSON")
        storable_json(value)  # JSONB holds no NUL in any string, keys included
        return value


class EventPosted(Camel):
    woke: list[uuid.UUID] = Field(description="The runs waiting on the key that this event woke (each gets its "
                                  "payload as its wait's result); empty when none waited: the event is kept for "
                                  "AGENTRUN_EVENT_RETENTION, and a wait on its key that begins within it gets it.")


def signals_router(store: RunStore, secured: bool, metrics: Metrics | None = None) -> APIRouter:
    responses: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorBody, "description": "The body is not JSON, or over the size limit"},
        422: {"model": ErrorBody, "description": "A bad field (`fields` names it): a blank key, a payload too large, "
              "a bad Idempotency-Key"},
    }
    if secured:
        responses.update({
            401: {"model": ErrorBody, "description": "Missing or wrong bearer token"},
            403: {"model": ErrorBody, "description": "The token's identity lacks the `signal` (or `submit`) scope, "
                  "or names a tenant not its own"},
        })
    router = APIRouter(prefix="/api", tags=["events"], responses=responses, route_class=OrjsonRoute)

    @router.post("/events", response_model=EventPosted, **access(Scope.SIGNAL, secured))
    async def post_event(
        body: EventRequest, request: Request, response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key",
            description="A retry with the same key is answered with the first answer (with "
            "`Idempotent-Replayed: true`) and delivers nothing again.",
            json_schema_extra=IDEMPOTENCY_KEY_SCHEMA,
        )] = None,
    ) -> EventPosted:
        """Post an event: every run waiting on its key gets its payload as its wait's result and is queued
        again; the event is kept for AGENTRUN_EVENT_RETENTION (default 24 h) for waits that begin later,
        each run receiving it at most once. Scope: `signal` or `submit`."""
        posted = await store.post_event(body.key, body.payload, by=caller_name(request),
                                        idempotency_key=checked_idempotency_key(idempotency_key),
                                        tenant=tenant_for(request, body.tenant) or DEFAULT_TENANT)
        if posted.replayed:
            response.headers["Idempotent-Replayed"] = "true"
        elif metrics is not None:
            metrics.event_posted(len(posted.woke))
        return EventPosted(woke=posted.woke)

    return router
