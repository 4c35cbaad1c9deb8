"""The kopf handlers: an AgentRun's creation makes its run, `spec.cancel` and deletion cancel it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import kopf
import psycopg
import psycopg_pool

from agentrun.operator import health, mapping
from agentrun.operator.agents import Agents
from agentrun.operator.errors import DatabaseNotReady
from agentrun.operator.kube import KubeApi, KubeError
from agentrun.operator.mapping import AGENT_PLURAL, GROUP, PLURAL, VERSION, Ref
from agentrun.operator.notify import listen
from agentrun.operator.schedules import PLURAL as SCHEDULE_PLURAL
from agentrun.operator.schedules import Schedules
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.status import StatusSync
from agentrun.worker.core.errors import OverQuota, Refusal, Refused
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import Decision, Origin, Run
from agentrun.worker.core.submission import Caller, RunSpec
from agentrun.worker.runtime.door import Door, Submitted
from agentrun.worker.store import DecideOutcome, RunStore

log = logging.getLogger("agentrun.operator")

FINALIZER = "agentrun.dev/finalizer"
INDEX = "agentruns_by_uid"
AGENT_INDEX = "agents_by_name"
CANCEL_FIELD = ("spec", "cancel")
DECISIONS_FIELD = ("spec", "decisions")

log_db = logging.getLogger("agentrun.operator.database")

T = TypeVar("T")


# What an unreachable database looks like from here: retried, never a lost AgentRun.
QUOTA_RETRY_MAX_SECONDS = 300.0
"""Longest wait before an AgentRun its tenant's quota refused is tried again (a daily budget may free up only in
hours: its status says until when, and the operator asks again at least this often)."""

DATABASE_DOWN = (psycopg.OperationalError, psycopg_pool.PoolTimeout, DatabaseNotReady)


@dataclasses.dataclass
class Operator:
    """Everything the handlers share, passed to them by closure (no module-level state)."""

    settings: OperatorSettings
    kube: KubeApi
    prices: PriceTable
    store_: RunStore | None = None
    sync: StatusSync | None = None
    problem: str = "connecting to the database"
    """Why there is no store yet, for /readyz and the Pending status."""
    database: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set once the database answered and is migrated (then `store` is there)."""
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    @property
    def store(self) -> RunStore:
        if self.store_ is None:
            raise DatabaseNotReady(self.problem)
        return self.store_

    def retry_in(self, retry: int) -> float:
        return float(min(self.settings.retry_seconds * 2**retry, 60.0))

    async def guarded(self, call: Callable[[RunStore], Awaitable[T]], what: str, retry: int) -> T:
        """`call` on the store; while there is none yet or the database is unreachable, a TemporaryError
        kopf retries."""
        try:
            return await call(self.store)
        except DATABASE_DOWN as e:
            message = f"cannot {what}, waiting for the database: {e}"
            raise kopf.TemporaryError(message, delay=self.retry_in(retry)) from e

    async def cancel(self, uid: uuid.UUID, retry: int, by: str = "k8s") -> Run | None:
        """Ask for the run to stop; while the database is unreachable, a TemporaryError kopf retries."""
        try:
            return await self.store.cancel(uid, by=by)
        except DATABASE_DOWN as e:
            raise kopf.TemporaryError(f"cannot cancel, database unreachable: {e}", delay=self.retry_in(retry)) from e

    async def source(self, spec: Any, ref: Ref, retry: int) -> Run | None:
        """The run of the AgentRun this one continues or forks (same namespace), if it names one.

        Not there yet (that AgentRun's run is being made), or not finished when it is to be continued:
        a TemporaryError, so kopf tries again; gone for good, the spec is rejected by `new_run`."""
        name = mapping.source_name(spec)
        if name is None:
            return None
        try:
            source = await self.store.find_linked(ref.namespace, name)
        except DATABASE_DOWN as e:
            raise kopf.TemporaryError(f"waiting for the database: {e}", delay=self.retry_in(retry)) from e
        if source is None or (spec.get("continueFrom") and not source.status.terminal):
            raise kopf.TemporaryError(
                f"waiting for AgentRun {name} to {'exist' if source is None else 'finish'}",
                delay=self.retry_in(retry),
            )
        return source

    async def decide(self, ref: Ref, entry: Any, by: str, retry: int) -> None:
        """One decision from spec.decisions, stored as the API stores it; refused ones become Events."""
        try:
            decision = Decision(entry.get("decision"))
            tool_use_id = str(entry["toolUseId"])
        except (AttributeError, KeyError, ValueError):
            await self.kube.event(ref.namespace, ref.name, ref.uid, "Warning", "DecisionRejected",
                                  f"not a decision: {str(entry)[:200]}")
            return
        if decision is Decision.RECORD and not isinstance(entry.get("output"), str):
            await self.kube.event(ref.namespace, ref.name, ref.uid, "Warning", "DecisionRejected",
                                  f"{tool_use_id}: record needs output")
            return
        try:
            outcome, run = await self.store.decide(
                ref.uid, tool_use_id, decision, output=entry.get("output"), is_error=bool(entry.get("isError")),
                reason=entry.get("reason") if isinstance(entry.get("reason"), str) else None, by=by,
            )
        except DATABASE_DOWN as e:
            raise kopf.TemporaryError(f"cannot decide, database unreachable: {e}", delay=self.retry_in(retry)) from e
        if outcome is DecideOutcome.DECIDED:
            log.info("%s/%s %s %s (by %s)", ref.namespace, ref.name, decision.value, tool_use_id, by)
            if run is not None:
                await self.show(run, ref)
        elif outcome is not DecideOutcome.ALREADY:
            why = {DecideOutcome.NO_CALL: "has no pending call with that toolUseId",
                   DecideOutcome.WRONG_KIND: "does not fit the call's kind",
                   DecideOutcome.NO_RUN: "has no run"}[outcome]
            await self.kube.event(ref.namespace, ref.name, ref.uid, "Warning", "DecisionRejected",
                                  f"{decision.value} {tool_use_id}: the run {why}")

    async def show(self, run: Run, ref: Ref) -> None:
        """Show the run in its AgentRun now, as a handler that just changed it wants."""
        if self.sync is None:
            return  # the sync's first sweep, just starting, shows it
        try:
            await self.sync.publish(run, ref)
        except KubeError as e:
            # The run is changed; only showing it failed. The sync retries that with its own backoff,
            # rather than kopf re-running the handler (and posting a handler-failed Event).
            log.warning("%s/%s: status not shown yet (%s); the status sync retries", ref.namespace, ref.name, e)
            self.sync.notify(run.id)

    def indexed(self, body: kopf.Body) -> dict[str, Ref]:
        """The index entry of an AgentRun (kopf keeps one per uid)."""
        ref = Ref.of(body)
        if self.sync is not None:
            # The sync's first sweep may have run before kopf indexed this AgentRun (a slow start): show
            # its run now, so one that finished while no operator looked is not left showing its old phase.
            self.sync.notify(ref.uid)
        return {str(ref.uid): ref}

    async def sync_when_connected(self, index: kopf.Index[str, Ref]) -> None:
        """Start the status sync and the run listener once the database is there."""
        await self.database.wait()  # until then the handlers say "waiting for the database"
        sync = StatusSync(
            self.settings, self.store, self.kube, lambda uid: _index_ref(index, uid), lambda: _index_refs(index)
        )
        self.sync = sync
        # Its first pass is a full sweep: AgentRuns created before the database came show their runs.
        self.tasks.append(asyncio.create_task(sync.run(), name="agentrun status sync"))
        self.tasks.append(asyncio.create_task(listen(self.settings.database_url, sync.notify, sync.resync),
                                              name="agentrun run listener"))

    async def create(
        self, body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int,
        agent_unseen: Callable[[str, str], bool] = lambda namespace, name: False,
    ) -> None:
        """An AgentRun's run: made (or found, on a retry), or the spec rejected in its status.

        `agent_unseen(namespace, name)` says whether an Agent of that name is there whose spec the
        operator has not stored (or refused) yet: an AgentRun applied with its Agent waits for it."""
        ref = Ref.of(body)
        now = datetime.datetime.now(datetime.UTC)
        source = await self.source(spec, ref, retry)
        try:
            asked = mapping.run_spec(spec, source)
            caller = mapping.caller(str(ref.uid), ref.namespace, ref.name, body.metadata.annotations,
                                    body.metadata.labels, created_by=mapping.requester(body),
                                    tenant=None if source is not None else self.settings.tenant_of(ref.namespace))
            made = await self.submit(asked, caller, source, ref, patch, retry, now, agent_unseen)
        except mapping.InvalidSpec as e:
            # Nothing a retry would fix: say so in the status, make no run.
            log.warning("%s/%s rejected: %s", ref.namespace, ref.name, e)
            patch.status.update(mapping.rejected_status(str(e), ref.generation, ref.status, now))
            await self.kube.event(ref.namespace, ref.name, ref.uid, "Warning", "InvalidSpec", str(e))
            return
        run, created = made.run, made.created
        if spec.get("cancel"):  # cancelled at once, as the spec asks
            run = await self.cancel_new(run, mapping.requester(body, CANCEL_FIELD, latest=True), ref, patch, retry,
                                        now)
        log.info("%s/%s %s run %s", ref.namespace, ref.name, "created" if created else "found", run.id)
        await self.show(run, ref)

    async def submit(
        self, asked: RunSpec, caller: Caller, source: Run | None, ref: Ref, patch: kopf.Patch, retry: int,
        now: datetime.datetime, agent_unseen: Callable[[str, str], bool],
    ) -> Submitted:
        """The AgentRun's run through the door: made, or found on a retry (its id is the AgentRun's uid).
        While the database is unreachable, the Pending status and a TemporaryError kopf retries. An unknown
        agent or version (or a budget above the agent's) is an InvalidSpec, after one retry, and unless an
        Agent of that name is still to be stored (then kopf tries again); so is what the policy refuses."""
        try:
            return await Door(self.store).submit(asked, Origin.OPERATOR, caller, source=source,
                                                 offer=mapping.offer(self.settings.tool_names, self.prices))
        except DATABASE_DOWN as e:
            await self.waiting(f"waiting for the database: {e}", ref, patch, retry, now, e)
        except OverQuota as e:
            # Its tenant's queue is full or its daily budget spent: Pending, saying which, until it has room.
            await self.waiting(f"waiting for its tenant's quota {e.quota}: {e.message}", ref, patch, retry, now, e,
                               delay=min(max(e.retry_after, self.settings.retry_seconds), QUOTA_RETRY_MAX_SECONDS),
                               reason="OverQuota")
        except Refused as e:
            # An Agent applied with the AgentRun may not be stored yet, or not even seen (its watch is
            # not this one): one retry for that, then as long as the Agent there waits to be stored.
            unknown = e.kind is Refusal.NOT_FOUND and any(p.field == "agent" for p in e.problems)
            if unknown and asked.agent is not None and (retry == 0 or agent_unseen(ref.namespace, asked.agent[0])):
                raise kopf.TemporaryError(f"waiting for Agent {asked.agent[0]} to be stored",
                                          delay=self.retry_in(retry)) from None
            raise mapping.InvalidSpec(mapping.refusal_message(e, self.settings.tool_names)) from None

    async def waiting(
        self, message: str, ref: Ref, patch: kopf.Patch, retry: int, now: datetime.datetime, e: BaseException,
        delay: float | None = None, reason: str = "DatabaseUnavailable",
    ) -> NoReturn:
        """The Pending status (and its Event, the first time), and a TemporaryError kopf retries after `delay`
        (None: the backoff of `retry`)."""
        if ref.status.get("phase") != mapping.PENDING and (event := mapping.event_for(mapping.PENDING, message)):
            await self.kube.event(ref.namespace, ref.name, ref.uid, *event)  # before the phase shows
        patch.status.update(mapping.pending_status(message, ref.generation, ref.status, now, reason))
        raise kopf.TemporaryError(message, delay=self.retry_in(retry) if delay is None else delay) from e

    async def cancel_new(
        self, run: Run, by: str, ref: Ref, patch: kopf.Patch, retry: int, now: datetime.datetime
    ) -> Run:
        """Cancel the run just made (or found), as its spec asks; while the database is unreachable, the
        Pending status and a TemporaryError kopf retries (the retry finds the run and cancels it then)."""
        try:
            return await self.store.cancel(run.id, by=by) or run
        except DATABASE_DOWN as e:
            await self.waiting(f"waiting for the database: {e}", ref, patch, retry, now, e)

    async def deleted(self, body: kopf.Body, retry: int) -> None:
        """Cancel an unfinished run before the AgentRun goes; the run and its steps stay for audit."""
        ref = Ref.of(body)
        run = await self.cancel(ref.uid, retry)
        if run is not None and run.cancel_requested:
            log.info("%s/%s deleted: run %s cancel requested (%s)", ref.namespace, ref.name, run.id, run.status.value)
        if self.sync is not None:
            self.sync.forget(ref.uid)

    async def connect(self, migrate_first: bool) -> None:
        """Reach the database, migrate it (or wait until it is migrated), then open the pool; retried with
        jittered backoff for as long as it takes: an outage at start is waited out, never an exit."""
        from agentrun.worker.store import migrate
        from agentrun.worker.store.pool import open_pool

        url = self.settings.database_url
        delay = 0.5
        while True:
            pool = None
            try:
                async with asyncio.timeout(30):  # a blackholed host must not hang an attempt for ever
                    if migrate_first:
                        await migrate.migrate(url)
                    pool = await open_pool(url, max_size=max(2, self.settings.pool_size), timeout=10)
                    async with pool.connection() as conn:
                        version = await migrate.current_version(conn)
                if version is None or version < migrate.latest_version():
                    raise DatabaseNotReady(f"schema at version {version}, not migrated to {migrate.latest_version()}")
            except (psycopg.Error, psycopg_pool.PoolTimeout, OSError, TimeoutError, DatabaseNotReady) as e:
                if pool is not None:
                    await pool.close()
                self.problem = f"database: {_first_line(e) or type(e).__name__}"
                log_db.warning("%s; retrying in %.1fs", self.problem, delay)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.settings.db_retry_max_seconds)
                continue
            self.store_ = RunStore(pool)
            self.problem = ""
            self.database.set()
            log_db.info("database reachable and migrated (schema version %s)", version)
            return

    async def close(self) -> None:
        if self.store_ is not None and not self.store_.pool.closed:
            await self.store_.pool.close()

    async def readiness(self, kopf_ready: Any) -> str | None:
        """None when ready: the database answers and is migrated, and kopf is watching."""
        from agentrun.worker.store import migrate

        if self.store_ is None:
            return self.problem
        try:
            async with self.store_.pool.connection(timeout=2) as conn:
                version = await migrate.current_version(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as e:
            return f"database: {_first_line(e) or type(e).__name__}"
        if version is None or version < migrate.latest_version():
            return f"schema at version {version}, not migrated"
        if not kopf_ready.is_set():
            return "kopf is starting"
        return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _index_ref(index: Any, uid: uuid.UUID) -> Ref | None:
    for ref in index.get(str(uid), ()):
        return ref  # type: ignore[no-any-return]
    return None


def _index_refs(index: Any) -> list[Ref]:
    return [ref for key in list(index) for ref in index.get(key, ())]


def register(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Attach the handlers to `registry`; each hands over to `op` (their names are kopf's handler ids,
    kept in every AgentRun's progress annotations: renaming one restarts it)."""
    on = dict(registry=registry)

    @kopf.index(GROUP, VERSION, PLURAL, id=INDEX, **on)  # type: ignore[arg-type]
    def agentruns_by_uid(body: kopf.Body, **_: Any) -> dict[str, Ref]:
        return op.indexed(body)

    @kopf.on.startup(**on)  # type: ignore[arg-type]
    async def start(agentruns_by_uid: kopf.Index[str, Ref], **_: Any) -> None:
        op.tasks.append(asyncio.create_task(op.sync_when_connected(agentruns_by_uid),
                                            name="agentrun status sync start"))

    @kopf.on.cleanup(**on)  # type: ignore[arg-type]
    async def stop(**_: Any) -> None:
        # Here, not after kopf returns: kopf cancels every task started after it (the pool's own
        # workers among them), and a pool whose workers were cancelled cannot close cleanly.
        await _cancel_all(op.tasks)
        await op.close()

    @kopf.index(GROUP, VERSION, AGENT_PLURAL, id=AGENT_INDEX, **on)  # type: ignore[arg-type]
    def agents_by_name(body: kopf.Body, **_: Any) -> dict[tuple[str, str], bool]:
        # Whether the operator has yet to store (or refuse) the Agent's current spec.
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        return {(meta.get("namespace") or "", meta["name"]): status.get("observedGeneration") != meta.get("generation")}

    @kopf.on.create(GROUP, VERSION, PLURAL, **on)  # type: ignore[arg-type]
    async def create(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int,
                     agents_by_name: kopf.Index[tuple[str, str], bool], **_: Any) -> None:
        def unseen(namespace: str, name: str) -> bool:
            return any(agents_by_name.get((namespace, name), ()))

        await op.create(body, spec, patch, retry, unseen)

    @kopf.on.field(GROUP, VERSION, PLURAL, field="spec.cancel", **on)  # type: ignore[arg-type]
    async def cancel(body: kopf.Body, new: Any, retry: int, **_: Any) -> None:
        if not new:
            return  # un-cancelling means nothing: a cancel request cannot be taken back
        ref = Ref.of(body)
        run = await op.cancel(ref.uid, retry, by=mapping.requester(body, CANCEL_FIELD, latest=True))
        if run is not None:
            await op.show(run, ref)

    @kopf.on.field(GROUP, VERSION, PLURAL, field="spec.decisions", **on)  # type: ignore[arg-type]
    async def decide(body: kopf.Body, old: Any, new: Any, retry: int, **_: Any) -> None:
        """Apply each decision added to spec.decisions, through the store as the API does (exactly once:
        one already taken is refused there, so a retried or replayed handler changes nothing)."""
        ref = Ref.of(body)
        seen = len(old) if isinstance(old, list) else 0
        by = mapping.requester(body, DECISIONS_FIELD, latest=True)
        for entry in (new or [])[seen:] if isinstance(new, list) else []:
            await op.decide(ref, entry, by, retry)

    @kopf.on.delete(GROUP, VERSION, PLURAL, **on)  # type: ignore[arg-type]
    async def delete(body: kopf.Body, retry: int, **_: Any) -> None:
        await op.deleted(body, retry)

    agents = Agents(op.settings.tool_names, op.prices, op.guarded, op.settings.tenant_of)

    # An Agent's spec is stored when it is created or changed, and again (as no new version, if it is
    # the same) when the operator starts: a change made while no operator ran is not lost.
    @kopf.on.create(GROUP, VERSION, AGENT_PLURAL, **on)  # type: ignore[arg-type]
    async def agent_created(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await agents.reconcile(body, spec, patch, retry)

    @kopf.on.update(GROUP, VERSION, AGENT_PLURAL, **on)  # type: ignore[arg-type]
    async def agent_updated(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await agents.reconcile(body, spec, patch, retry)

    @kopf.on.resume(GROUP, VERSION, AGENT_PLURAL, **on)  # type: ignore[arg-type]
    async def agent_resumed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await agents.reconcile(body, spec, patch, retry)

    @kopf.on.delete(GROUP, VERSION, AGENT_PLURAL, **on)  # type: ignore[arg-type]
    async def agent_deleted(body: kopf.Body, retry: int, **_: Any) -> None:
        await agents.deleted(body, retry)

    # AgentSchedules (issue 27): the spec stored as the schedule, as an Agent's; a timer shows the ticks.
    schedules = Schedules(op.settings.tool_names, op.prices, op.guarded, op.settings.tenant_of)

    @kopf.on.create(GROUP, VERSION, SCHEDULE_PLURAL, **on)  # type: ignore[arg-type]
    async def schedule_created(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await schedules.reconcile(body, spec, patch, retry)

    @kopf.on.update(GROUP, VERSION, SCHEDULE_PLURAL, **on)  # type: ignore[arg-type]
    async def schedule_updated(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await schedules.reconcile(body, spec, patch, retry)

    @kopf.on.resume(GROUP, VERSION, SCHEDULE_PLURAL, **on)  # type: ignore[arg-type]
    async def schedule_resumed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        await schedules.reconcile(body, spec, patch, retry)

    @kopf.timer(GROUP, VERSION, SCHEDULE_PLURAL, interval=op.settings.schedule_status_seconds, idle=None,
                **on)  # type: ignore[arg-type]
    async def schedule_ticks(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await schedules.refresh(body, patch, 0)

    @kopf.on.delete(GROUP, VERSION, SCHEDULE_PLURAL, **on)  # type: ignore[arg-type]
    async def schedule_deleted(body: kopf.Body, retry: int, **_: Any) -> None:
        await schedules.deleted(body, retry)


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.persistence.finalizer = FINALIZER
    # Handler progress in annotations under our own prefix, so the status holds only the run's fields.
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    # kopf's own "handler succeeded" Events would drown the phase Events; only its problems go out.
    s.posting.level = logging.WARNING
    s.peering.standalone = settings.standalone
    if settings.peering_name:
        s.peering.name = settings.peering_name
        s.peering.mandatory = True
    return s


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel and await every task in `tasks`, also those a task adds while it is being stopped."""
    while tasks:
        batch, tasks[:] = list(tasks), []
        for task in batch:
            task.cancel()
        for task in batch:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def run(
    settings: OperatorSettings,
    *,
    kube: KubeApi | None = None,
    login: Any = None,
    migrate_first: bool = True,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run the operator until `stop_flag` is set or a signal arrives.

    /healthz answers at once; the database is reached (and migrated) in the background, retried for as
    long as it is down, and /readyz says 503 until it is there. `kube` and `login` (a kopf login
    handler) point it at an API server other than the configured one, e.g. an emulated one in tests.
    """
    kube = kube or KubeApi.from_environment()
    op = Operator(settings, kube, settings.prices or PriceTable.load())
    kopf_ready = asyncio.Event()
    runner = None
    if settings.port is not None:
        runner = await health.serve(settings.health_host, settings.port, lambda: op.readiness(kopf_ready))
    op.tasks.append(asyncio.create_task(op.connect(migrate_first), name="agentrun database"))
    registry = kopf.OperatorRegistry()
    # The same credentials as our own client (KubeApi.from_environment): the kubernetes client's config.
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    register(registry, op)

    async def ready_when_connected() -> None:
        # Ready for the caller once kopf watches and the database is there, as /readyz says.
        await kopf_ready.wait()
        await op.database.wait()
        if ready_flag is not None:
            ready_flag.set()

    op.tasks.append(asyncio.create_task(ready_when_connected(), name="agentrun ready"))
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(settings),
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=settings.standalone,
            peering_name=settings.peering_name,
            stop_flag=stop_flag,
            ready_flag=kopf_ready,
        )
    finally:
        await _cancel_all(op.tasks)  # the cleanup handler did it, unless kopf failed before it ran
        await op.close()
        if runner is not None:
            await runner.cleanup()
        kube.close()
