"""The kopf handlers: an AgentRun's creation makes its run, `spec.cancel` and deletion cancel it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import uuid
from typing import Any

import kopf
import psycopg
import psycopg_pool

from agentrun.operator import mapping
from agentrun.operator.kube import KubeApi
from agentrun.operator.mapping import GROUP, PLURAL, VERSION, Ref
from agentrun.operator.notify import listen
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.status import StatusSync
from agentrun.worker.records import Run
from agentrun.worker.store import RunStore

log = logging.getLogger("agentrun.operator")

FINALIZER = "agentrun.dev/finalizer"
INDEX = "agentruns_by_uid"

# What an unreachable database looks like from here: retried, never a lost AgentRun.
DATABASE_DOWN = (psycopg.OperationalError, psycopg_pool.PoolTimeout)


@dataclasses.dataclass
class Operator:
    """Everything the handlers share, passed to them by closure (no module-level state)."""

    settings: OperatorSettings
    store: RunStore
    kube: KubeApi
    sync: StatusSync | None = None
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def retry_in(self, retry: int) -> float:
        return float(min(self.settings.retry_seconds * 2**retry, 60.0))

    async def cancel(self, uid: uuid.UUID, retry: int) -> Run | None:
        """Ask for the run to stop; while the database is unreachable, a TemporaryError kopf retries."""
        try:
            return await self.store.cancel(uid)
        except DATABASE_DOWN as e:
            raise kopf.TemporaryError(f"cannot cancel, database unreachable: {e}", delay=self.retry_in(retry)) from e


def _index_ref(index: Any, uid: uuid.UUID) -> Ref | None:
    for ref in index.get(str(uid), ()):
        return ref  # type: ignore[no-any-return]
    return None


def _index_refs(index: Any) -> list[Ref]:
    return [ref for key in list(index) for ref in index.get(key, ())]


def register(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Attach the handlers to `registry`; each closes over `op`."""
    on = dict(registry=registry)

    @kopf.index(GROUP, VERSION, PLURAL, id=INDEX, **on)  # type: ignore[arg-type]
    def agentruns_by_uid(body: kopf.Body, **_: Any) -> dict[str, Ref]:
        ref = Ref.of(body)
        return {str(ref.uid): ref}

    @kopf.on.startup(**on)  # type: ignore[arg-type]
    async def start(agentruns_by_uid: kopf.Index[str, Ref], **_: Any) -> None:
        index = agentruns_by_uid
        sync = StatusSync(
            op.settings, op.store, op.kube, lambda uid: _index_ref(index, uid), lambda: _index_refs(index)
        )
        op.sync = sync
        op.tasks.append(asyncio.create_task(sync.run(), name="agentrun status sync"))
        op.tasks.append(asyncio.create_task(listen(op.settings.database_url, sync.notify, sync.resync),
                                            name="agentrun run listener"))

    @kopf.on.cleanup(**on)  # type: ignore[arg-type]
    async def stop(**_: Any) -> None:
        for task in op.tasks:
            task.cancel()
        for task in op.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        op.tasks.clear()

    @kopf.on.create(GROUP, VERSION, PLURAL, **on)  # type: ignore[arg-type]
    async def create(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int, **_: Any) -> None:
        ref = Ref.of(body)
        now = datetime.datetime.now(datetime.UTC)
        try:
            new = mapping.new_run(
                spec, str(ref.uid), ref.namespace, ref.name, op.settings.tool_names, body.metadata.annotations
            )
        except mapping.InvalidSpec as e:
            # Nothing a retry would fix: say so in the status, make no run.
            log.warning("%s/%s rejected: %s", ref.namespace, ref.name, e)
            patch.status.update(mapping.rejected_status(str(e), ref.generation, ref.status, now))
            await op.kube.event(ref.namespace, ref.name, ref.uid, "Warning", "InvalidSpec", str(e))
            return
        try:
            run, created = await op.store.create(new)  # idempotent by id: a retry finds the same run
            if spec.get("cancel"):
                run = await op.store.cancel(run.id) or run
        except DATABASE_DOWN as e:
            message = f"waiting for the database: {e}"
            patch.status.update(mapping.pending_status(message, ref.generation, ref.status, now))
            raise kopf.TemporaryError(message, delay=op.retry_in(retry)) from e
        log.info("%s/%s %s run %s", ref.namespace, ref.name, "created" if created else "found", run.id)
        assert op.sync is not None
        await op.sync.publish(run, ref)

    @kopf.on.field(GROUP, VERSION, PLURAL, field="spec.cancel", **on)  # type: ignore[arg-type]
    async def cancel(body: kopf.Body, new: Any, retry: int, **_: Any) -> None:
        if not new:
            return  # un-cancelling means nothing: a cancel request cannot be taken back
        ref = Ref.of(body)
        run = await op.cancel(ref.uid, retry)
        if run is not None and op.sync is not None:
            await op.sync.publish(run, ref)

    @kopf.on.delete(GROUP, VERSION, PLURAL, **on)  # type: ignore[arg-type]
    async def delete(body: kopf.Body, retry: int, **_: Any) -> None:
        """Cancel an unfinished run before the AgentRun goes; the run and its steps stay for audit."""
        ref = Ref.of(body)
        run = await op.cancel(ref.uid, retry)
        if run is not None and run.cancel_requested:
            log.info("%s/%s deleted: run %s cancel requested (%s)", ref.namespace, ref.name, run.id, run.status.value)
        if op.sync is not None:
            op.sync.forget(ref.uid)


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

    `kube` and `login` (a kopf login handler) point it at an API server other than the configured
    one, e.g. an emulated one in tests.
    """
    from agentrun.worker import migrate
    from agentrun.worker.db import open_pool

    if migrate_first:
        await migrate.migrate(settings.database_url)
    pool = await open_pool(settings.database_url, max_size=max(2, settings.pool_size))
    kube = kube or KubeApi.from_environment()
    op = Operator(settings, RunStore(pool), kube)
    registry = kopf.OperatorRegistry()
    # The same credentials as our own client (KubeApi.from_environment): the kubernetes client's config.
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    register(registry, op)
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(settings),
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=settings.standalone,
            peering_name=settings.peering_name,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await pool.close()
        kube.close()
