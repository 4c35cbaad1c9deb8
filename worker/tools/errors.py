"""The tools' errors: the tool threads' refusals and the MCP client's (its config, a failed call, a
reconcile tool that cannot tell). Light on purpose: importing it never loads the MCP SDK."""

from __future__ import annotations

__all__ = ["CallFailed", "CannotTell", "McpConfigError", "NotStarted", "ThreadsFull"]


class ThreadsFull(Exception):
    """Every tool thread is busy: the call was not started."""


class NotStarted(Exception):
    """The call's time ran out before a thread picked it up: it was not started."""


class McpConfigError(ValueError):
    """The MCP servers file is missing, unreadable or wrong: one line saying where and why."""


class CallFailed(Exception):
    """The call did not get a result: no session, the connection broke, or the answer was not MCP."""


class CannotTell(Exception):
    """A reconcile tool answered with an error: whether the call was done is unknown."""
