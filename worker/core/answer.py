"""The run's answer: the final text, or a JSON value checked against the run's output schema. Pure, no I/O.

A structured answer is asked for the robust way: the model gets a `final_answer` tool whose input schema
is the output schema, and the run ends when it calls that tool with an input that validates. A wrong
answer (or a turn that ends without calling the tool) gets one corrective turn, then fails the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions

FINAL_ANSWER = "final_answer"

MAX_CORRECTIONS = 1
"""Corrective turns a run gets for answers that do not match its schema before it fails."""

INSTRUCTION = (
    "When you have the final answer, call the `final_answer` tool with it as the tool's input: the input "
    "must match the tool's input schema exactly. Do not answer in plain text."
)


def system_sent(system: str | None, schema: Mapping[str, Any] | None) -> str | None:
    """The system prompt a model request of a run sends: its own, and with an output schema the instruction
    to answer through `final_answer` (the engine sends it; the step inspector shows it)."""
    return system if schema is None else "\n\n".join(filter(None, [system, INSTRUCTION]))


def tools_sent(
    tools: list[dict[str, Any]], agents: list[dict[str, Any]], schema: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The tool definitions a model request of a run sends: its tools, its sub-agents, then `final_answer`."""
    return tools + agents + ([definition(schema)] if schema else [])


def schema_problem(schema: object) -> str | None:
    """Why `schema` is not a usable output schema (a JSON Schema object), or None."""
    if not isinstance(schema, Mapping):
        return "must be a JSON Schema object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        return f"is not a valid JSON Schema: {e.message}"
    return None


def definition(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The `final_answer` tool as the Messages API wants it. Its input schema must be an object schema:
    another is wrapped as the `answer` property of one."""
    return {
        "name": FINAL_ANSWER,
        "description": "Give the final answer of this task. Call it once, with the whole answer.",
        "input_schema": dict(schema) if _is_object_schema(schema) else _wrapped(schema),
    }


def answer_of(schema: Mapping[str, Any], tool_input: Any) -> Any:
    """The answer a `final_answer` call carries (unwrapped where the schema was wrapped)."""
    if _is_object_schema(schema) or not isinstance(tool_input, Mapping):
        return tool_input
    return tool_input.get("answer")


def problem(schema: Mapping[str, Any], value: Any) -> str | None:
    """Why `value` does not validate against `schema` (the most relevant error), or None."""
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message}" + (f" (at /{where})" if where else "")


def _is_object_schema(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object"


def _wrapped(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"answer": dict(schema)}, "required": ["answer"]}
