"""Fleet-wide model limits: requests in flight, requests and tokens per minute, shared by every worker
through one PostgreSQL row per limit, as an `LlmClient` decorator that waits its turn before each call.

The limits file (AGENTRUN_MODEL_LIMITS, YAML or JSON) maps a model name or glob to its limits:

    "claude-sonnet-4-6": {maxConcurrentRequests: 2}
    "claude-*": {requestsPerMinute: 50, tokensPerMinute: 40000}

A model takes the limit named exactly after it, else the first glob that matches it in file order.
Each attempt reserves before it is sent, in ONE statement: a slot in flight, one request and its tokens
(the request's size, estimated at three characters a token, plus its `max_tokens`) from buckets refilled
continuously at the per-minute rate up to a minute's worth, the way the API's own limits work. After
the call, one more statement frees the slot and corrects the tokens from the usage the API reported.
A call that may not go yet waits: inside the model step, so the lease heartbeat keeps the run, its
deadline still ends it and a cancel interrupts the wait; a limit never fails a run. A 429 tightens the
limit for every worker: it halves (down to a tenth), the buckets are emptied, nothing is sent until the
`retry-after` has passed, and the limit relaxes back once `TIGHT_SECONDS` pass without another 429.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import psycopg
import yaml
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse
from agentrun.worker.store.limits import LimitCounters

log = logging.getLogger(__name__)

FIELDS = {"maxConcurrentRequests": "max_concurrent", "requestsPerMinute": "requests_per_minute",
          "tokensPerMinute": "tokens_per_minute"}
TIGHT_SECONDS = 60.0
"""How long a 429 keeps a limit tightened: a minute, the window the API's own limits are stated in."""
SLOT_SECONDS = 300.0
"""A slot in flight expires this long after it was taken unless freed: a worker killed mid-call frees
its slots by then. It should exceed the longest attempt (AGENTRUN_LLM_TIMEOUT_SECONDS, 120 s)."""
MIN_POLL, MAX_POLL = 0.05, 0.25
"""While every slot is taken, a waiting call looks again this often (jittered): a slot frees when
another worker's call ends, which no clock can predict."""
MAX_RATE_WAIT = 1.0
"""A wait for a rate is computed from the bucket, but calls in flight give back what they reserved
beyond their usage when they end: a waiting call looks again at least this often to see it."""


@dataclasses.dataclass(frozen=True)
class ModelLimit:
    """The limits of one model name or glob; None: not limited in that way."""

    key: str
    max_concurrent: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class ModelLimits:
    """The limits file, parsed and checked."""

    def __init__(self, limits: list[ModelLimit]) -> None:
        self.limits = limits
        self._exact = {lim.key: lim for lim in limits}

    def for_model(self, model: str) -> ModelLimit | None:
        if model in self._exact:
            return self._exact[model]
        return next((lim for lim in self.limits if fnmatch.fnmatchcase(model, lim.key)), None)

    @classmethod
    def parse(cls, data: Any, source: str = "the model limits") -> ModelLimits:
        """ValueError naming the entry and field at fault."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: the top level must map model names or globs to limits")
        limits = []
        for key, entry in data.items():
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"{source}: {key!r} is not a model name or glob")
            if not isinstance(entry, Mapping) or not entry:
                raise ValueError(f"{source}: {key}: give at least one of {', '.join(FIELDS)}")
            unknown = sorted(set(map(str, entry)) - set(FIELDS))
            if unknown:
                raise ValueError(f"{source}: {key}: unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
            values: dict[str, Any] = {}
            for field, name in FIELDS.items():
                value = entry.get(field)
                if value is None:
                    continue
                whole = field == "maxConcurrentRequests"
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                        or value <= 0 or (whole and not float(value).is_integer()):
                    kind = "a positive whole number" if whole else "a positive number"
                    raise ValueError(f"{source}: {key}.{field} must be {kind}, got {value!r}")
                values[name] = int(value) if whole else float(value)
            limits.append(ModelLimit(key, **values))
        return cls(limits)

    @classmethod
    def load(cls, path: str) -> ModelLimits:
        """From a YAML or JSON file (JSON is YAML); ValueError or OSError naming the problem."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise ValueError(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {e}") from None
        return cls.parse(data, path)


def estimate_tokens(request: LlmRequest) -> int:
    """What a request may cost before it is sent: its JSON at three characters a token (English runs near
    four, so this errs high), plus max_tokens, the most it can answer. The usage corrects it after."""
    size = len(orjson.dumps([request.system, request.messages, request.tools]))
    return size // 3 + request.max_tokens


@dataclasses.dataclass(frozen=True)
class Grant:
    """A reservation made: free it with `Limiter.release`."""

    limit: ModelLimit
    id: str
    tokens: float


WaitHook = Callable[[str, float], None]  # (model, seconds waited)
UseHook = Callable[[str, str, float, float], None]


class Limiter:
    """Reserves and frees capacity of the fleet-wide limits in PostgreSQL (table model_limit)."""

    def __init__(
        self,
        limits: ModelLimits,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None,
        *,
        on_wait: WaitHook | None = None,
        on_use: UseHook | None = None,
        tight_seconds: float = TIGHT_SECONDS,
        slot_seconds: float = SLOT_SECONDS,
    ) -> None:
        self.limits = limits
        self.pool = pool
        self.on_wait = on_wait
        self.on_use = on_use
        self.tight_seconds = tight_seconds
        self.slot_seconds = slot_seconds
        self._known: set[str] = set()
        self._rng = random.Random()
        self._store = None if pool is None else LimitCounters(pool)

    def attach(self, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]) -> None:
        """The database pool, once it is open (the limits are read and checked before, at start)."""
        self.pool = pool
        self._store = LimitCounters(pool)

    @property
    def _counters(self) -> LimitCounters:
        if self._store is None:
            raise RuntimeError("the model limiter has no database pool")
        return self._store

    async def _ensure_row(self, limit: ModelLimit) -> None:
        if limit.key in self._known:
            return
        await self._counters.ensure(limit.key, limit.requests_per_minute or 0, limit.tokens_per_minute or 0)
        self._known.add(limit.key)

    async def acquire(self, model: str, tokens: int) -> Grant | None:
        """Wait until the model's limit lets a call of about `tokens` go; None if it has no limit."""
        limit = self.limits.for_model(model)
        if limit is None:
            return None
        await self._ensure_row(limit)
        grant_id = uuid.uuid4().hex
        params = {"key": limit.key, "id": grant_id, "conc": limit.max_concurrent, "rpm": limit.requests_per_minute,
                  "tpm": limit.tokens_per_minute, "cost": tokens, "slot": self.slot_seconds}
        started = time.monotonic()
        waited = False
        while True:
            try:
                row = await self._counters.reserve(params)
            except asyncio.CancelledError:
                # Cancelled (the run, a shutdown) while the statement ran: the server may have made the
                # reservation all the same. Freed by its id now (nothing if it was not made), not left
                # taken until it expires.
                await _quietly(self._counters.release(limit.key, grant_id, 0.0))
                raise
            if row is None:  # the row was deleted under us: make it again
                self._known.discard(limit.key)
                await self._ensure_row(limit)
                continue
            self._seen(limit, row)
            if row["ok"]:
                if waited and self.on_wait is not None:
                    self.on_wait(model, time.monotonic() - started)
                return Grant(limit, grant_id, float(row["cost"]))
            waited = True
            wait = min(float(row["wait"]), MAX_RATE_WAIT)
            if row["full"]:
                wait = max(wait, self._rng.uniform(MIN_POLL, MAX_POLL))
            # A rate wait is exact; a little jitter keeps workers that wait for the same refill apart.
            await asyncio.sleep(wait + self._rng.uniform(0, 0.02))

    def _seen(self, limit: ModelLimit, row: Mapping[str, Any]) -> None:
        if self.on_use is None:
            return
        if row["conc_max"] is not None:
            self.on_use(limit.key, "concurrent", float(row["in_flight"] or 0), float(row["conc_max"]))
        if row["rpm_max"] is not None:
            self.on_use(limit.key, "requests_per_minute", float(row["rpm_max"]) - float(row["req_now"]),
                        float(row["rpm_max"]))
        if row["tpm_max"] is not None:
            self.on_use(limit.key, "tokens_per_minute", float(row["tpm_max"]) - float(row["tok_now"]),
                        float(row["tpm_max"]))

    async def release(self, grant: Grant, used_tokens: int | None) -> None:
        """Free the slot; give back the tokens reserved beyond `used_tokens` (None: keep them all)."""
        refund = grant.tokens - used_tokens if used_tokens is not None else 0.0
        await self._counters.release(grant.limit.key, grant.id, refund)

    async def tighten(self, grant: Grant, retry_after: float | None) -> None:
        """A 429: every worker slows down on this limit for a while."""
        await self._counters.tighten(grant.limit.key, self.tight_seconds,
                                     retry_after if retry_after is not None else 1.0)
        log.warning("model limit %s tightened after a 429 (for %.0fs)", grant.limit.key, self.tight_seconds)


async def _quietly(write: Any) -> None:
    """Await a bookkeeping write, shielded: a cancel of the caller does not stop it (it goes on in the
    background, and the cancel goes on up). A failure is logged: the slot expires by itself."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("model limit bookkeeping failed (the slot expires by itself): %s", e)


class Limited:
    """`LlmClient` decorator: each call waits for the fleet-wide limit of its model, then frees it.

    Sits inside the retry loop (each attempt reserves) and outside the attempt time limit (a wait is
    not a hung call).
    """

    def __init__(self, delegate: LlmClient, limiter: Limiter) -> None:
        self.delegate = delegate
        self.limiter = limiter

    async def send(self, request: LlmRequest) -> LlmResponse:
        grant = await self.limiter.acquire(request.model, estimate_tokens(request))
        if grant is None:
            return await self.delegate.send(request)
        used: int | None = None
        try:
            response = await self.delegate.send(request)
            used = response.usage.total
            return response
        except LlmError as e:
            used = 0  # the API refused it: no tokens were spent
            if e.status == 429:
                await _quietly(self.limiter.tighten(grant, e.retry_after))
            raise
        finally:
            # Shielded: a cancel (of the run, or a shutdown) must not leave the slot taken until it expires.
            await _quietly(self.limiter.release(grant, used))

