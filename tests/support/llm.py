"""What the model client tests share: the tool definitions their requests carry, and a fake `Sleeper`."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_tickets",
        "description": "List support tickets by status.",
        "input_schema": {"type": "object", "properties": {"status": {"type": "string"}}},
    },
    {"name": "close_ticket", "description": "Close a ticket.", "input_schema": {"type": "object", "properties": {}}},
]


class RecordingSleeper:
    """A fake `Sleeper`: records each wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
