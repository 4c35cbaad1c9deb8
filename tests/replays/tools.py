"""The tools of the replay tests, loaded by in-process workers and by `agentrun worker` processes
(AGENTRUN_TOOLS=tests.replays.tools). Every call that runs appends a line to the file AGENTRUN_TEST_TOOL_LOG
names: the execution log that proves what a replay did not run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrun.worker.tools import ToolContext, tool

LOG_ENV = "AGENTRUN_TEST_TOOL_LOG"
REPO = Path(__file__).resolve().parents[2]


def worker_env(database_url: str, model_url: str, log: Path) -> dict[str, str]:
    """The environment of an `agentrun worker` process that loads these tools and logs their calls to `log`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "test",
                "PYTHONPATH": str(REPO), "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01",
                "AGENTRUN_TOOLS": "tests.replays.tools", LOG_ENV: str(log)})
    return env


def _log(name: str, args: dict[str, Any]) -> None:
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as f:
        f.write(f"{name} {json.dumps(args, sort_keys=True)}\n")


@tool(name="charge", description="Charge a customer.", idempotent=False)
def charge(args: dict[str, Any], ctx: ToolContext) -> str:
    _log("charge", args)
    return f"charged {args.get('amount')} to {args.get('to')}"


@tool(name="lookup", description="Look something up.", read_only=True)
def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    _log("lookup", args)
    return f"found {args.get('q')}"


@tool(name="notify", description="Tell someone (idempotent, but it changes the world).")
def notify(args: dict[str, Any], ctx: ToolContext) -> str:
    _log("notify", args)
    return "notified"


@tool(name="count", description="Read a counter, and bump it (says read-only, is not idempotent).", read_only=True,
      idempotent=False)
def count(args: dict[str, Any], ctx: ToolContext) -> str:
    _log("count", args)
    return "1"


def executed(path: str) -> list[str]:
    """The calls that ran, one line each."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
