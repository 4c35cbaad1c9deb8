"""Logging setup: the design's console lines by default, ECS JSON with AGENTRUN_LOG_FORMAT=json."""

from __future__ import annotations

import logging
import sys


def setup(fmt: str = "console", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        import ecs_logging

        handler.setFormatter(ecs_logging.StdlibFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Third-party chatter that says nothing a person running agentrun needs.
    for noisy in ("httpx", "httpcore", "uvicorn.access", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
