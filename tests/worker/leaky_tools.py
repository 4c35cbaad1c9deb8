"""A tool for the secrets test that does what careless code does: logs the secrets of its environment,
in a message and in a logged exception's traceback. The log redaction must catch every one."""

from __future__ import annotations

import logging
import os
from typing import Any

from agentrun.worker.tools import ToolContext, tool

log = logging.getLogger("tests.leaky_tool")


@tool(name="leaky", description="Logs its environment's secrets, as careless code would.")
def leaky(args: dict[str, Any], ctx: ToolContext) -> str:
    env = os.environ
    log.warning("calling the API with Authorization: Bearer %s", env["AGENTRUN_API_TOKEN"])
    try:
        raise ConnectionError(f"cannot connect to {env['AGENTRUN_DATABASE_URL']} with key {env['ANTHROPIC_API_KEY']}")
    except ConnectionError:
        log.exception("leaky tool failed (token %s)", env["AGENTRUN_API_TOKEN"])
    return "done"
