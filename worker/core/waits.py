"""Waits: the built-in tools `wait` (a durable timer) and `wait_for_event` (an event from outside), and
the wait requests a tool call answers with. Pure: what is asked and what the model is told."""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any

import orjson

WAIT = "wait"
WAIT_FOR_EVENT = "wait_for_event"
BUILTIN_WAITS = (WAIT, WAIT_FOR_EVENT)

MAX_KEY_CHARS = 256
"""The longest event key: a name of a fact (`payment:42`, `email-reply:<message id>`), not a payload."""
MAX_WAIT_SECONDS = 366 * 86400.0
"""The longest timer or event wait a call may ask for (a year); the run's deadline usually ends it sooner."""


@dataclasses.dataclass(frozen=True)
class WaitForEvent:
    """What a Python tool returns to make the run wait for the event `key` (POST /api/events): the run
    parks WAITING, holding no lease, and the call's result is the event's payload (JSON), or the error
    "timed out waiting for event <key>" after `timeout_seconds`."""

    key: str
    timeout_seconds: float

    def __post_init__(self) -> None:
        problem = key_problem(self.key) or seconds_problem(self.timeout_seconds, "timeout_seconds")
        if problem is not None:
            raise ValueError(problem)


@dataclasses.dataclass(frozen=True)
class WaitForTimer:
    """The built-in `wait`: `seconds` from now, or `until` a time."""

    seconds: float | None = None
    until: datetime.datetime | None = None


WaitRequest = WaitForEvent | WaitForTimer


def key_problem(key: Any) -> str | None:
    if not isinstance(key, str) or not key.strip():
        return "key must be a non-empty string"
    if len(key) > MAX_KEY_CHARS:
        return f"key must be at most {MAX_KEY_CHARS} characters"
    if "\x00" in key:
        return "key must not contain NUL"
    return None


def seconds_problem(value: Any, name: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"{name} must be a number of seconds"
    if value < 0 or value > MAX_WAIT_SECONDS:
        return f"{name} must be from 0 to {MAX_WAIT_SECONDS:g} seconds"
    return None


def timer_of(args: dict[str, Any]) -> WaitForTimer:
    """The built-in `wait`'s input as a timer; ValueError (the model's error result) when it is not one."""
    seconds, until = args.get("seconds"), args.get("until")
    if (seconds is None) == (until is None):
        raise ValueError("give exactly one of seconds or until")
    if seconds is not None:
        if (problem := seconds_problem(seconds, "seconds")) is not None:
            raise ValueError(problem)
        return WaitForTimer(seconds=float(seconds))
    if not isinstance(until, str):
        raise ValueError("until must be an RFC 3339 date and time, such as 2030-01-01T09:00:00Z")
    try:
        at = datetime.datetime.fromisoformat(until.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"until {until[:60]!r} is not an RFC 3339 date and time, such as 2030-01-01T09:00:00Z") \
            from None
    if at.tzinfo is None:
        raise ValueError("until must name its time zone offset (Z or +hh:mm)")
    return WaitForTimer(until=at)


def event_of(args: dict[str, Any]) -> WaitForEvent:
    """The built-in `wait_for_event`'s input; ValueError when it is not one."""
    key, timeout = args.get("key"), args.get("timeoutSeconds")
    if (problem := key_problem(key) or seconds_problem(timeout, "timeoutSeconds")) is not None:
        raise ValueError(problem)
    assert isinstance(timeout, int | float)
    return WaitForEvent(str(key), float(timeout))


def timed_out(key: str) -> str:
    """The error result of an event wait that timed out."""
    return f"timed out waiting for event {key}"


def waited(seconds: float) -> str:
    """The result of a timer."""
    return f"waited {max(seconds, 0.0):.1f} s"


def delivered(payload: Any) -> str:
    """The result of an event wait: the event's payload, as JSON."""
    return orjson.dumps(payload).decode()


WAIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seconds": {"type": "number", "minimum": 0, "description": "How long to wait, in seconds."},
        "until": {"type": "string", "description": "Or: the time to wait until, RFC 3339 (2030-01-01T09:00:00Z)."},
    },
    "additionalProperties": False,
}
WAIT_DESCRIPTION = ("Pause the run durably, for `seconds` or `until` a time (RFC 3339), then go on; the result "
                    "says how long it waited. Costs nothing while it waits.")

WAIT_FOR_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "description": "The event's key, as the sender will post it."},
        "timeoutSeconds": {"type": "number", "minimum": 0, "description": "How long to wait for it at most."},
    },
    "required": ["key", "timeoutSeconds"],
    "additionalProperties": False,
}
WAIT_FOR_EVENT_DESCRIPTION = ("Wait for an event from outside, posted to POST /api/events with this key (an event "
                              "posted shortly before also counts). The result is the event's payload as JSON; "
                              "an error if it did not come within timeoutSeconds.")
