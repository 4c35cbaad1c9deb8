"""Completion webhooks, sent: the secrets file (re-read when it changes), and the sender each worker runs
beside its housekeeping, which claims due deliveries from the outbox (store/webhooks.py), signs them the
Standard Webhooks way and records every attempt.

At least once: a delivery leaves the outbox only when a receiver answered 2xx (or after the give-up time);
a worker killed mid-attempt leaves it due again when its claim's lease passes. The body is the run's JSON
as `GET /api/runs/{id}` shows it, rendered when the attempt is sent (so it shows the run as it is then).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import datetime
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from standardwebhooks import Webhook

from agentrun.worker.core.records import Run
from agentrun.worker.core.tenants import DEFAULT_TENANT, tenant_problem
from agentrun.worker.core.watched import Look, WatchedFile
from agentrun.worker.core.webhooks import (
    Allow,
    Backoff,
    Delivery,
    Target,
    WebhookProblem,
    address_problem,
    literal_address,
    parse_url,
)
from agentrun.worker.runtime.errors import SecretsFileError as SecretsFileError
from agentrun.worker.runtime.errors import WebhookRefused
from agentrun.worker.runtime.tasks import honour_cancel
from agentrun.worker.store import RunStore, channels
from agentrun.worker.store.channels import WEBHOOK_CHANNEL

log = logging.getLogger("agentrun.worker.runtime.webhooks")

SECRET_PREFIX = "whsec_"
MAX_ERROR_CHARS = 500
BATCH = 16
"""Deliveries one claim takes, and so sent at once by one worker."""


def parse_secrets(text: str, source: str) -> dict[tuple[str | None, str], str]:
    """`{"secrets": [{"name", "secret", "tenant"?}]}` (YAML or JSON) as (tenant, name) → secret: a secret with a
    `tenant` signs only that tenant's runs' webhooks; one without (None) any tenant's. SecretsFileError saying
    what is wrong."""
    import yaml  # YAML is a superset of JSON: one parser reads both

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SecretsFileError(f"webhook secrets file {source} is neither YAML nor JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("secrets"), list):
        raise SecretsFileError(f"webhook secrets file {source} must be an object with a list `secrets`")
    found: dict[tuple[str | None, str], str] = {}
    for i, entry in enumerate(doc["secrets"]):
        where = f"webhook secrets file {source}: secrets[{i}]"
        if not isinstance(entry, dict) or not {"name", "secret"} <= set(entry) <= {"name", "secret", "tenant"}:
            raise SecretsFileError(f"{where} must have `name` and `secret`, and may have `tenant`")
        name, secret, tenant = entry["name"], entry["secret"], entry.get("tenant")
        if not isinstance(name, str) or not name.strip():
            raise SecretsFileError(f"{where}.name must be a non-empty string")
        if tenant is not None and (bad := tenant_problem(tenant, f"{where}.tenant")) is not None:
            raise SecretsFileError(bad)
        if (tenant, name) in found:
            whose = f" for tenant {tenant!r}" if tenant is not None else ""
            raise SecretsFileError(f"{where}.name {name!r} is given twice{whose}")
        if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
            raise SecretsFileError(f"{where}.secret must be of the form {SECRET_PREFIX}<base64> (Standard Webhooks)")
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise SecretsFileError(f"{where}.secret is not {SECRET_PREFIX} followed by base64") from None
        if len(key) < 24:
            raise SecretsFileError(f"{where}.secret must hold at least 24 bytes (it holds {len(key)})")
        found[(tenant, name)] = secret
    return found


class WebhookSecrets:
    """The AGENTRUN_WEBHOOK_SECRETS file, re-read when it changes as the API tokens file is (one `stat` at
    most every `recheck_seconds`; inode, size or mtime changed: read again). Unlike the tokens file, a file
    that became unreadable or malformed keeps the last good secrets (logged as an error): a broken rotation
    must not stop deliveries that were being signed a moment ago. It never raises."""

    def __init__(self, path: str | None, recheck_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._secrets: dict[tuple[str | None, str], str] = {}
        self._file = WatchedFile(path, recheck_seconds, clock) if path is not None else None
        self._refresh()

    def _refresh(self) -> None:
        if self._file is None:
            return
        look = self._file.look()
        if look is Look.GONE:
            strerror = self._file.error.strerror if self._file.error else None
            log.error("webhook secrets file %s cannot be read (%s); keeping the %d secrets read before",
                      self.path, strerror, len(self._secrets))
        if look is not Look.CHANGED:
            return
        try:
            self._secrets = parse_secrets(self._file.read(), self._file.path)
        except (OSError, UnicodeDecodeError) as e:
            log.error("webhook secrets file %s cannot be read (%s); keeping the %d secrets read before",
                      self.path, getattr(e, "strerror", None) or e, len(self._secrets))
            return
        except SecretsFileError as e:
            log.error("%s; keeping the %d secrets read before (AGENTRUN_WEBHOOK_SECRETS)", e, len(self._secrets))
            return
        log.info("webhook secrets file %s read: %d secrets", self.path, len(self._secrets))

    def names(self, tenant: str = DEFAULT_TENANT) -> list[str]:
        """The secrets `tenant`'s runs may name: its own and those of no tenant."""
        self._refresh()
        return sorted({name for whose, name in self._secrets if whose in (None, tenant)})

    def get(self, name: str, tenant: str = DEFAULT_TENANT) -> str | None:
        """The secret `name` as `tenant`'s runs know it: its own of that name, else the one of no tenant."""
        self._refresh()
        return self._secrets.get((tenant, name), self._secrets.get((None, name)))


@dataclasses.dataclass(frozen=True)
class SenderSettings:
    timeout: float = 10.0
    backoff: Backoff = Backoff()
    allow: Allow = Allow()
    poll_interval: float = 5.0


Resolver = Callable[[str, int], Awaitable[list[str]]]


def sendable(url: str, allow: Allow) -> tuple[Target, httpx.URL]:
    """The URL as the policy reads it (core `parse_url`) and as the HTTP client will send it; WebhookProblem
    (`webhook.url`) if either refuses it. The client is the stricter on host names (IDNA 2008 where the
    policy takes any letters: `ａ.example`, fullwidth, is refused), so the API asks both, as the sender does."""
    target = parse_url(url, allow)
    try:
        return target, httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:  # ValueError: a character UTF-8 cannot encode
        raise WebhookProblem("webhook.url", f"is not a URL the webhook sender's HTTP client accepts: {e}") from None


async def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (the system resolver)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclasses.dataclass(frozen=True)
class Outcome:
    delivered: bool
    status_code: int | None
    latency_ms: int
    error: str | None
    kind: str  # delivered, http_error, redirect, timeout, refused, connect_error, no_secret, no_run, error


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


class WebhookSender:
    """One per worker process (Worker.run). `render` makes a run's JSON body; `on_outcome(kind, given_up)`
    counts each attempt (the metrics)."""

    def __init__(
        self, store: RunStore, worker_id: str, secrets: WebhookSecrets, render: Callable[[Run], bytes],
        settings: SenderSettings = SenderSettings(),
        on_outcome: Callable[[str, bool], None] | None = None, resolver: Resolver | None = None,
    ) -> None:
        self.store, self.worker_id, self.secrets, self.render = store, worker_id, secrets, render
        self.settings = settings
        self.on_outcome = on_outcome
        self.resolver = resolver or resolve
        self.wake = asyncio.Event()

    @property
    def lease_seconds(self) -> float:
        """How long a claimed attempt is this sender's: resolution and the request (each cut at the timeout)
        and recording it, with margin. A sender killed mid-attempt leaves the delivery due after this."""
        return self.settings.timeout * 2 + 5.0

    async def run(self) -> None:
        listener = asyncio.create_task(self._listen(), name=f"{self.worker_id}-webhook-listen")
        try:
            async with httpx.AsyncClient(follow_redirects=False, timeout=self.settings.timeout,
                                         trust_env=False) as client:
                while True:
                    self.wake.clear()
                    idle = self.settings.poll_interval
                    try:
                        claimed = await self.store.claim_webhooks(self.worker_id, self.lease_seconds, BATCH,
                                                                  self.settings.backoff.give_up_seconds)
                        if claimed:
                            # Each attempt to its end, whatever another does: one that fails here (the
                            # database went away mid-attempt) is sent again after its lease.
                            results = await asyncio.gather(*(self._attempt(client, d) for d in claimed),
                                                           return_exceptions=True)
                            for d, result in zip(claimed, results, strict=True):
                                if isinstance(result, Exception):
                                    log.warning("%s webhook %s: attempt failed here (%s); sent again after its "
                                                "lease", self.worker_id, d.id, str(result) or type(result).__name__)
                            continue
                        due = await self.store.next_webhook_in()
                        if due is not None:
                            idle = min(idle, due + 0.01)
                    except Exception as e:
                        honour_cancel(e)
                        log.warning("%s cannot look for webhook deliveries: %s", self.worker_id,
                                    str(e) or type(e).__name__)
                    honour_cancel()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(idle):
                            await self.wake.wait()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self) -> None:
        """LISTEN for new deliveries; on a failure, reconnect (the poll covers the gap)."""
        while True:
            conn = None
            try:
                conn = await self.store.dedicated_connection()
                await channels.listen(conn, WEBHOOK_CHANNEL)
                self.wake.set()  # anything written while not listening
                async for _ in conn.notifies():
                    self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                honour_cancel(e)
                log.debug("%s webhook listener: %s; reconnecting", self.worker_id, e)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(self.settings.poll_interval)

    async def _attempt(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        started = datetime.datetime.now(datetime.UTC)
        t0 = time.monotonic()
        try:
            outcome = await self._send(client, delivery)
        except Exception as e:
            # Whatever went wrong before or while sending (the body could not be rendered, the run not read)
            # is a failed attempt like a refused one: recorded, so the delivery is retried on its backoff and
            # ends FAILED at its give-up time. Unrecorded, it came back after every lease, forever.
            honour_cancel(e)
            outcome = Outcome(False, None, int((time.monotonic() - t0) * 1000),
                              _truncate(f"the attempt failed before an answer: {type(e).__name__}: {e}"), "error")
        retry_in = self.settings.backoff.delay(delivery.attempts)
        try:
            state = await self.store.record_webhook_attempt(
                delivery, self.worker_id, started, status_code=outcome.status_code, latency_ms=outcome.latency_ms,
                error=outcome.error, delivered=outcome.delivered, retry_in=retry_in,
                give_up_seconds=self.settings.backoff.give_up_seconds,
            )
        except Exception as e:
            log.warning("%s webhook %s: attempt %d not recorded (%s); it is sent again after its lease",
                        self.worker_id, delivery.id, delivery.attempts, e)
            return
        given_up = state == "FAILED"
        if self.on_outcome is not None:
            self.on_outcome(outcome.kind, given_up)
        if outcome.delivered:
            log.info("%s webhook %s run=%s %s delivered (%s)", self.worker_id, delivery.id, delivery.run_id.hex[:8],
                     delivery.event, outcome.status_code)
        elif given_up:
            log.error("%s webhook %s run=%s given up after %d attempts: %s", self.worker_id, delivery.id,
                      delivery.run_id.hex[:8], delivery.attempts, outcome.error)
        else:
            log.warning("%s webhook %s run=%s attempt %d failed (%s); again in %.1fs", self.worker_id, delivery.id,
                        delivery.run_id.hex[:8], delivery.attempts, outcome.error, retry_in)

    async def _send(self, client: httpx.AsyncClient, delivery: Delivery) -> Outcome:
        t0 = time.monotonic()

        def done(kind: str, error: str | None, status: int | None = None) -> Outcome:
            return Outcome(kind == "delivered", status, int((time.monotonic() - t0) * 1000),
                           _truncate(error) if error else None, kind)

        run = await self.store.get(delivery.run_id)
        if run is None:
            return done("no_run", "the run is gone")
        secret = self.secrets.get(delivery.secret_ref, run.tenant)
        if secret is None:
            return done("no_secret", f"no webhook secret named {delivery.secret_ref!r} is configured for tenant "
                        f"{run.tenant!r} (AGENTRUN_WEBHOOK_SECRETS)")
        try:
            target, parsed = sendable(delivery.url, self.settings.allow)
            address = await self._address(target.host, target.port)
        except (WebhookRefused, ValueError) as e:
            return done("refused", str(e))
        except OSError as e:
            return done("connect_error", f"cannot resolve {delivery.url}: {e}")
        body = self.render(run)
        msg_id = f"msg_{delivery.id.hex}"
        now = datetime.datetime.now(datetime.UTC)
        signature = Webhook(secret).sign(msg_id, now, body.decode())
        headers = {
            "content-type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature, "user-agent": "agentrun-webhooks",
            "agentrun-event": delivery.event, "agentrun-run-status": delivery.run_status,
            "host": target.host if target.port == (443 if target.scheme == "https" else 80)
            else f"{target.host}:{target.port}",
        }
        # Sent to the address just checked, not to the name again: a name that resolves elsewhere a moment
        # later (DNS rebinding) cannot redirect it. For https, TLS still names (and verifies) the host.
        literal = f"[{address}]" if ":" in address else address
        url = parsed.copy_with(host=literal.strip("[]"))
        extensions: dict[str, Any] = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            response = await client.post(url, content=body, headers=headers, extensions=extensions)
        except httpx.TimeoutException:
            return done("timeout", f"no answer within {self.settings.timeout:g}s")
        except httpx.HTTPError as e:
            return done("connect_error", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        code = response.status_code
        if 200 <= code < 300:
            return done("delivered", None, code)
        if 300 <= code < 400:
            return done("redirect", f"answered {code} (redirects are not followed)", code)
        return done("http_error", f"answered {code}", code)

    async def _address(self, host: str, port: int) -> str:
        """The address to send to: `host` itself if it is one, else the first it resolves to; Refused if
        any address it resolves to is one the policy refuses."""
        if literal_address(host) is not None:
            addresses = [host.strip("[]")]
        else:
            try:
                async with asyncio.timeout(self.settings.timeout):
                    addresses = await self.resolver(host, port)
            except TimeoutError:
                raise OSError(f"{host} did not resolve within {self.settings.timeout:g}s") from None
            if not addresses:
                raise OSError(f"{host} resolves to no address")
        if self.settings.allow.host(host):
            return addresses[0]
        for a in addresses:
            ip = literal_address(a)
            if ip is None:
                raise WebhookRefused(f"{host} resolved to {a!r}, not an address")
            if (why := address_problem(ip, self.settings.allow)) is not None:
                raise WebhookRefused(f"{host} resolves to {why}")
        return addresses[0]
