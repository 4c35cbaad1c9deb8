"""Logging setup: the design's console lines by default, ECS JSON with AGENTRUN_LOG_FORMAT=json.

`step_context` is the Python counterpart of a logging MDC: the engine sets run_id and step_seq in a
context variable for the duration of a step (and tracing its trace.id and span.id), and every record
logged meanwhile carries them. Every line passes through a `Redactor` on its way out, so secrets
never reach a log line.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import sys
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# Read-only: each block sets a new mapping, so one task's fields never leak into another's.
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "agentrun_log_context", default=types.MappingProxyType({})
)

# Fields every record gets, so JSON lines have a stable shape (null outside a run or step).
CONTEXT_FIELDS = ("run_id", "step_seq")

# ECS fields that link a line to its trace (worker/obs/tracing/ sets them around each span); present only
# while a span is open, as ECS readers expect of them.
TRACE_FIELDS = ("trace.id", "span.id")

REDACTED = "[REDACTED]"

# Shapes of secrets worth hiding even when their value is not known in advance.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # postgresql://user:password@host and any other scheme://user:password@
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+@"), rf"\1{REDACTED}@"),
    # libpq key=value strings: password=secret
    (re.compile(r"(\bpassword\s*=\s*)('[^']*'|\S+)", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"\bsk-ant-[A-Za-z0-9_-]+"), REDACTED),
    # API tokens made by `agentrun token new` (identities.TOKEN_PREFIX): the server knows only their hashes.
    (re.compile(r"\bagrt_[A-Za-z0-9_-]+"), REDACTED),
)


@contextlib.contextmanager
def step_context(**fields: Any) -> Iterator[None]:
    """Add fields (run_id, step_seq) to every record logged in this block, in this task only."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def set_context(**fields: Any) -> None:
    """Update the fields of the current `step_context` block (e.g. once a step's seq is known)."""
    _context.set({**_context.get(), **fields})


class ContextFilter(logging.Filter):
    """Copies the context variable's fields onto each record, where formatters find them."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get()
        for name in CONTEXT_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ctx.get(name))
        for name in TRACE_FIELDS:
            if name in ctx and not hasattr(record, name):
                setattr(record, name, ctx[name])
        return True


class Redactor:
    """Replaces known secret values and secret-shaped substrings with [REDACTED]."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Very short values would redact ordinary words; a real key or password is longer.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


class RedactingFormatter(logging.Formatter):
    """Redacts the finished line, not the message alone: tracebacks and extras are covered too."""

    def __init__(self, inner: logging.Formatter, redactor: Redactor) -> None:
        super().__init__()
        self.inner = inner
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor(self.inner.format(record))


SECRET_VARIABLES = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "AGENTRUN_API_TOKEN", "PGPASSWORD",
    # Model providers' credentials (docs/guides/providers.md).
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK",
)


def secrets_from_env(
    env: Mapping[str, str], urls: Iterable[str | None] = (), names: Iterable[str] = ()
) -> list[str]:
    """The secret values a process may know of: API keys, the API token, database passwords, and the
    variables named in `names` (the key variables of the providers file's endpoints)."""
    from psycopg.conninfo import conninfo_to_dict

    found = [env.get(k) for k in (*SECRET_VARIABLES, *names)]
    for url in (env.get("AGENTRUN_DATABASE_URL"), *urls):
        if url:
            try:
                found.append(str(conninfo_to_dict(url).get("password") or ""))
            except Exception:  # a malformed URL is reported where it is used, not here
                pass
    return [s for s in found if s]


def formatter(fmt: str, redactor: Redactor) -> logging.Formatter:
    inner: logging.Formatter
    if fmt == "json":
        import ecs_logging

        inner = ecs_logging.StdlibFormatter()
    else:
        inner = logging.Formatter("%(message)s")
    return RedactingFormatter(inner, redactor)


def setup(fmt: str = "console", level: str = "INFO", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter(fmt, Redactor(secrets)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Third-party chatter that says nothing a person running agentrun needs.
    for noisy in ("httpx", "httpcore", "uvicorn.access", "anthropic", "openai", "botocore", "google.auth"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
