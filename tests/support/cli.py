"""The `agentrun` command called in-process by a test, its exit code and what it printed captured, and the
root logger put back afterwards."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from agentrun.worker import cli


async def agentrun(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in a thread (it blocks on HTTP) while this loop serves it."""
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`agentrun` commands set up logging on the root logger; put it back as pytest had it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
