"""What an MCP server says, as the worker takes it: tool names, annotations, and call results. Pure.

Text content becomes tool_result text, structured content JSON text, image content an image block (in
the media types the Messages API takes), and `isError: true` an is_error tool_result.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import mcp_types as types

from agentrun.worker.tools import ToolResult
from agentrun.worker.tools.errors import CannotTell
from agentrun.worker.tools.mcp.config import Approval, ServerConfig

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""A tool name the Messages API takes."""
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""The media types of image blocks the Messages API takes in a tool_result."""


def exposed_name(server: str, tool: str) -> str:
    """`<server>__<tool>`; a tool name with characters the Messages API refuses, or too long, is made
    fit deterministically: each such character becomes `_`, and a changed or long name is cut and ends
    in 8 hex digits of the original's SHA-256, so the same tool gets the same name on every worker."""
    name = f"{server}__{tool}"
    if TOOL_NAME.fullmatch(name):
        return name
    fitted = re.sub(r"[^a-zA-Z0-9_-]", "_", name)
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{fitted[:55]}_{digest}"


def idempotent(tool: types.Tool, config: ServerConfig) -> bool:
    """Idempotent if the config says so, else if annotated `idempotentHint` or `readOnlyHint`."""
    override = config.overrides.get(tool.name)
    if override is not None and override.idempotent is not None:
        return override.idempotent
    hints = tool.annotations
    return hints is not None and (hints.idempotent_hint is True or hints.read_only_hint is True)


def read_only(tool: types.Tool) -> bool:
    """Annotated `readOnlyHint: true`: a replay may call it live when its recording has no result for a call."""
    return tool.annotations is not None and tool.annotations.read_only_hint is True


def destructive(tool: types.Tool) -> bool:
    """Annotated `destructiveHint: true`, whatever else it says: a replay never calls it. (A tool that says
    nothing is not read-only either, so a replay never calls it live anyway.)"""
    return tool.annotations is not None and tool.annotations.destructive_hint is True


def requires_approval(tool: types.Tool, config: ServerConfig) -> bool:
    """Per the config's override, else `requireApproval`: `all` every call, `destructive` the calls of a
    tool that is not read-only and not annotated `destructiveHint: false` (the MCP specification's
    default for a tool that says nothing is destructive)."""
    override = config.overrides.get(tool.name)
    if override is not None and override.requires_approval is not None:
        return override.requires_approval
    if config.require_approval is Approval.ALL:
        return True
    if config.require_approval is Approval.DESTRUCTIVE:
        hints = tool.annotations
        read_only = hints is not None and hints.read_only_hint is True
        return not read_only and (hints is None or hints.destructive_hint is not False)
    return False


def timeout(tool: str, config: ServerConfig) -> float:
    override = config.overrides.get(tool)
    if override is not None and override.timeout_seconds is not None:
        return override.timeout_seconds
    return config.timeout_seconds


def max_timeout(tool: str, config: ServerConfig) -> float:
    """The most a call may last while progress notifications keep extending its `timeout`: never less."""
    override = config.overrides.get(tool)
    if override is not None and override.max_timeout_seconds is not None:
        return max(override.max_timeout_seconds, timeout(tool, config))
    return max(config.max_timeout_seconds, timeout(tool, config))


def input_schema(tool: types.Tool) -> dict[str, Any]:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    return schema


def tool_result(result: types.CallToolResult) -> ToolResult:
    """The call's result as tool_result content blocks."""
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        blocks.append(_block(item))
    has_text = any(b["type"] == "text" for b in blocks)
    if result.structured_content is not None and not has_text:
        # Servers usually send the same JSON as text too; only when they did not is it added.
        blocks.append({"type": "text", "text": json.dumps(result.structured_content, ensure_ascii=False)})
    if not blocks:
        blocks.append({"type": "text", "text": "(the tool returned no content)"})
    return ToolResult(tuple(blocks), is_error=bool(result.is_error))


NOT_DONE = {"done": False}
"""What a reconcile tool answers (as its text, or its structured content) for a call that was not done;
an empty text says so too."""


def reconciled(result: types.CallToolResult, tool: str) -> str | None:
    """What the reconcile tool `tool` said of a call in doubt: its result (the text) when it was done, None
    when it was not (an empty text, or `{"done": false}`); raises CannotTell for an error result."""
    texts = [item.text for item in result.content if isinstance(item, types.TextContent)]
    if result.is_error:
        said = " ".join(" ".join(texts).split())[:300]
        raise CannotTell(f"reconcile tool {tool} answered with an error{': ' + said if said else ''}")
    if result.structured_content == NOT_DONE:
        return None
    text = "\n".join(texts)
    if not text.strip() and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if not text.strip():
        return None
    try:
        if json.loads(text) == NOT_DONE:
            return None
    except ValueError:
        pass
    return text


def _block(item: Any) -> dict[str, Any]:
    if isinstance(item, types.TextContent):
        return {"type": "text", "text": item.text}
    if isinstance(item, types.ImageContent):
        if item.mime_type in IMAGE_TYPES:
            return {"type": "image", "source": {"type": "base64", "media_type": item.mime_type, "data": item.data}}
        return {"type": "text", "text": f"[an image of type {item.mime_type} is left out: the model takes "
                f"{', '.join(sorted(IMAGE_TYPES))}]"}
    if isinstance(item, types.EmbeddedResource):
        resource = item.resource
        if isinstance(resource, types.TextResourceContents):
            return {"type": "text", "text": resource.text}
        return {"type": "text", "text": f"[a binary resource {resource.uri} ({resource.mime_type or 'no type'}) "
                "is left out]"}
    if isinstance(item, types.ResourceLink):
        return {"type": "text", "text": f"[resource link: {item.uri}]"}
    kind = getattr(item, "type", type(item).__name__)
    return {"type": "text", "text": f"[{kind} content is left out: the model takes text and images]"}
