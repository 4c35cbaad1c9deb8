"""The operator's /healthz and /readyz, served before anything else so a database outage is a not-ready
pod, never a crash loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger("agentrun.operator.health")

# What /readyz asks: None when ready, else why not (said in the 503's body).
Readiness = Callable[[], Awaitable[str | None]]


async def serve(host: str, port: int, readiness: Readiness) -> web.AppRunner:
    """Start answering on host:port; the caller cleans the returned runner up."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(5):
                problem = await readiness()
        except TimeoutError:
            problem = "the readiness check timed out"
        if problem is not None:
            return web.json_response({"status": "unavailable", "reason": problem}, status=503)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("health endpoints on http://%s:%d/healthz and /readyz", host, port)
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port actually listened on (for port 0 in tests)."""
    for address in runner.addresses:
        return int(address[1])
    raise RuntimeError("the health server listens nowhere")
