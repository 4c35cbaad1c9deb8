"""The HTTP application served by `agentrun worker --port`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from agentrun.worker import migrate


def create_app(pool: AsyncConnectionPool[Any]) -> FastAPI:
    app = FastAPI(title="agentrun", version="0.1.0")

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """The database answers and is migrated to the version this code expects."""
        try:
            async with pool.connection(timeout=2) as conn:
                version = await migrate.current_version(conn)
        except Exception as e:
            return JSONResponse({"status": "unavailable", "reason": f"database: {type(e).__name__}"}, 503)
        if version is None or version < migrate.latest_version():
            return JSONResponse({"status": "unavailable", "reason": f"schema at {version}, not migrated"}, 503)
        return JSONResponse({"status": "ok", "schemaVersion": version})

    return app
