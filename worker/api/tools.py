"""GET /api/tools: every tool this server offers, with its source and whether it can be called now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from agentrun.worker.api.guards import ScopedRoute, access
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import ErrorBody
from agentrun.worker.tools import ToolBox


class ToolView(BaseModel):
    """One tool as the model sees it."""

    name: str = Field(description="What runs name in `tools` and `requireApproval`: `<server>__<tool>` for MCP.")
    source: str = Field(description="`python` (AGENTRUN_TOOLS), or `mcp:<server>` (AGENTRUN_MCP_SERVERS).")
    idempotent: bool = Field(description="False: a call a crash interrupted waits for a person (in doubt).")
    requiresApproval: bool = Field(description="Every call waits for a person's approval.")  # noqa: N815
    available: bool = Field(description="Calls can go through now (false: its MCP server is not connected).")
    readOnly: bool = Field(False, description="It only reads (`@tool(..., read_only=True)`, MCP `readOnlyHint`): "  # noqa: N815
                           "a replay under `recorded_then_live_readonly` may call it live (docs/api.md, Replays).")


class ServerView(BaseModel):
    """One MCP server of AGENTRUN_MCP_SERVERS."""

    name: str
    transport: str = Field(description="`http` (Streamable HTTP, `url`) or `stdio` (`command`).")
    connected: bool
    error: str | None = Field(description="Why it is not connected (the last failure), or null.")


class ToolList(BaseModel):
    tools: list[ToolView]
    servers: list[ServerView] = Field(description="The MCP servers, including those not reached yet, whose "
                                      "tools are not listed until they answer.")


def tools_router(tools: ToolBox, secured: bool) -> APIRouter:
    responses: dict[int | str, dict[str, Any]] = ({
        401: {"model": ErrorBody, "description": "Missing or wrong bearer token"},
        403: {"model": ErrorBody, "description": "The token's identity lacks the `read` scope"},
    } if secured else {})
    router = APIRouter(prefix="/api", tags=["tools"], responses=responses, route_class=ScopedRoute)

    @router.get("/tools", response_model=ToolList, **access(Scope.READ, secured))
    async def list_tools() -> ToolList:
        """The tools of this worker, by name: Python tools and those of the MCP servers that answered.
        Scope: `read`."""
        return ToolList(
            tools=[ToolView(name=t.name, source=t.source, idempotent=t.idempotent,
                            requiresApproval=t.requires_approval, available=t.available, readOnly=t.read_only)
                   for t in tools.listing()],
            servers=[ServerView(name=s.name, transport=s.transport, connected=s.connected, error=s.error)
                     for s in tools.servers()],
        )

    return router
