"""How the API answers when something is wrong: a JSON `ErrorBody`, a 4xx for bad input, never a traceback.

The errors themselves are in `api/errors.py`, which imports no web framework (the CLI reads tokens files).

Bad content is a 4xx naming the field; an unreachable database is a 503; anything else is a genuine
fault of the server: logged with its traceback, answered with a bare JSON 500.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import psycopg_pool
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.schemas import ErrorBody, FieldProblem, QuotaErrorBody
from agentrun.worker.core.errors import OverQuota

log = logging.getLogger("agentrun.worker.api")

# Where FastAPI says an error is; the client knows fields by their names alone.
_LOCATIONS = {"body", "path", "query", "header", "cookie"}


def error_response(
    status: int, message: str, fields: Sequence[FieldProblem] = (), headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=message, fields=list(fields))
    return JSONResponse(body.model_dump(), status, headers=headers)


def _field(loc: Sequence[Any]) -> str:
    parts = list(loc[1:] if loc and loc[0] in _LOCATIONS else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or (str(loc[0]) if loc else "body")


def _problem(error: dict[str, Any]) -> str:
    kind, msg = error.get("type", ""), str(error.get("msg", "invalid"))
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind == "uuid_parsing":
        return "is not a valid UUID"
    for prefix in ("Input should be ", "Value should be "):
        if msg.startswith(prefix):
            return "must be " + msg.removeprefix(prefix)
    for prefix in ("Input should have ", "Value should have ", "List should have ", "String should have "):
        if msg.startswith(prefix):
            return "must have " + msg.removeprefix(prefix)
    return msg


def validation_problems(errors: Sequence[Any]) -> tuple[int, list[FieldProblem]]:
    """A 400 when the body is not JSON at all, else a 422; one problem per field, input values never echoed."""
    status = 422
    problems: list[FieldProblem] = []
    for e in errors:
        if e.get("type") == "json_invalid":
            status = 400
            why = (e.get("ctx") or {}).get("error") or "malformed"
            problems.append(FieldProblem(field="body", problem=f"is not valid JSON: {why}"))
        else:
            problems.append(FieldProblem(field=_field(e.get("loc", ())), problem=_problem(e)))
    return status, problems


def summary(problems: Sequence[FieldProblem]) -> str:
    return "; ".join(f"{p.field}: {p.problem}" for p in problems)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    # Ask the router per method rather than reading routes' `methods`: included routers nest routes.
    routes = request.app.router.routes
    return [m for m in _METHODS if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes)]


def install(app: FastAPI) -> None:
    """Register the handlers and the last-resort middleware on an app."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, problems = validation_problems(exc.errors())
        return error_response(status, summary(problems), problems)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message,
                              [FieldProblem(field=p.field, problem=p.problem) for p in exc.fields])

    @app.exception_handler(OverQuota)
    async def over_quota(request: Request, exc: OverQuota) -> JSONResponse:
        # The door refused a new run for its tenant's quota: a 429 naming it, and when to ask again.
        seconds = max(1, math.ceil(exc.retry_after))
        body = QuotaErrorBody(error=exc.message, quota=exc.quota, retryAfter=seconds)
        return JSONResponse(body.model_dump(), 429, headers={"Retry-After": str(seconds)})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path only; GET and POST /api/runs
            # are two routes, and a client told `Allow: POST` would never try GET.
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return error_response(exc.status_code, str(exc.detail), headers=headers)

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable serving %s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "database unavailable, try again shortly", headers={"Retry-After": "5"})

    app.add_exception_handler(psycopg.OperationalError, unavailable)
    app.add_exception_handler(psycopg_pool.PoolTimeout, unavailable)
    app.add_middleware(Faults)


class Faults:
    """Catches what no handler did: logs the traceback, answers a JSON 500 without it.

    A middleware rather than an `Exception` handler, because Starlette re-raises the exception after
    such a handler has answered, and the server would log the request a second time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for a clean answer: let the server drop the connection
                raise
            await error_response(500, "internal server error")(scope, receive, send)
