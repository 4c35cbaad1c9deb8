"""`agentrun worker` in a process of its own, as a deployment runs it: its command line, starting it, waiting
until it is ready, and stopping it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]

Process = asyncio.subprocess.Process | subprocess.Popen[Any]


def worker_argv(port: int, *args: str) -> list[str]:
    """`agentrun worker` serving its HTTP API on 127.0.0.1:`port`, with `args` after."""
    return [sys.executable, "-m", "agentrun.worker.cli", "worker", "--port", str(port), "--host", "127.0.0.1", *args]


async def start_worker(port: int, *args: str, env: dict[str, str], cwd: Path | None = REPO,
                       stdout: int | IO[Any] | None = asyncio.subprocess.PIPE,
                       stderr: int | IO[Any] | None = asyncio.subprocess.STDOUT) -> asyncio.subprocess.Process:
    """`agentrun worker` on `port` in this event loop's child process (`env` is its whole environment)."""
    return await asyncio.create_subprocess_exec(*worker_argv(port, *args), env=env, cwd=cwd, stdout=stdout,
                                                stderr=stderr)


def _exit_code(proc: Process) -> int | None:
    return proc.poll() if isinstance(proc, subprocess.Popen) else proc.returncode


async def _said(proc: Process, output: Callable[[], str] | None) -> str:
    """What an exited worker wrote: from `output`, else from its pipe (stderr if piped, else stdout)."""
    if output is not None:
        return output()[-2000:]
    stream = proc.stderr or proc.stdout
    if isinstance(stream, asyncio.StreamReader):
        return (await stream.read()).decode(errors="replace")[-2000:]
    return ""


async def wait_ready(url: str, proc: Process, timeout: float = 60, what: str = "the worker to be ready",
                     output: Callable[[], str] | None = None) -> None:
    """Until GET `url`/readyz answers 200 (migrated, its database reached, serving); fails at once, with the
    end of what it wrote, if the process exits meanwhile."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        async def ready() -> bool:
            if (code := _exit_code(proc)) is not None:
                raise AssertionError(f"the worker exited with {code}: {await _said(proc, output)}")
            with contextlib.suppress(httpx.TransportError):
                return (await http.get("/readyz")).status_code == 200
            return False

        await eventually(ready, timeout, what)


async def stop(proc: asyncio.subprocess.Process, timeout: float = 30) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; its exit code."""
    if proc.returncode is None:
        proc.terminate()
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        return await proc.wait()
