"""The `agentrun` command called in-process by a test, its exit code and what it printed captured."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker import cli


async def agentrun(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in a thread (it blocks on HTTP) while this loop serves it."""
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err
