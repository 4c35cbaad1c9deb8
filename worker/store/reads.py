"""Reads of runs and steps, as the API, the CLI and the operator see them."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from agentrun.worker.core.labels import Selector
from agentrun.worker.core.records import (
    Run,
    RunStatus,
    Step,
)
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import (
    RUN_COLUMNS,
    STEP_COLUMNS,
    TIMELINE_COLUMNS,
    as_run,
    as_step,
)


@dataclasses.dataclass(frozen=True)
class RunFilter:
    """What GET /api/runs may narrow the list to; every field given must hold (None: any)."""

    statuses: tuple[RunStatus, ...] | None = None
    selector: Selector | None = None
    model: str | None = None
    agent: str | None = None
    agent_version: int | None = None
    created_by: str | None = None
    parent: uuid.UUID | None = None
    created_after: datetime.datetime | None = None
    created_before: datetime.datetime | None = None
    text: str | None = None  # a case-insensitive substring of the input
    tenant: str | None = None  # the tenant whose runs (store/scoped.py narrows it to the viewer's)
    replays: bool | None = None  # False: no replay's run; True: replays' runs only; None: either
    replay_of: uuid.UUID | None = None  # the replay runs of this recorded run
    replay_id: uuid.UUID | None = None  # the runs of this replay


# One statement whatever the filter: each condition is off when its parameter is NULL, so the SQL text is a
# constant and every value a bound parameter. The label selector's parts: `eq` is one object the GIN index
# serves (`@>`); `ne`, `within`, `without` are JSON arrays of [key, value] / [key, [values]] pairs;
# `present` / `absent` text arrays of keys. An absent key satisfies `!=` and `notin`, as in Kubernetes.
LIST_RUNS = f"""SELECT {RUN_COLUMNS} FROM run r
    WHERE (%(statuses)s::text[] IS NULL OR r.status = ANY(%(statuses)s::text[]))
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
      AND (%(parent)s::uuid IS NULL OR r.parent_run_id = %(parent)s)
      AND (%(model)s::text IS NULL OR r.model = %(model)s)
      AND (%(agent)s::text IS NULL OR r.agent = %(agent)s)
      AND (%(agent_version)s::int IS NULL OR r.agent_version = %(agent_version)s)
      AND (%(created_by)s::text IS NULL OR r.created_by = %(created_by)s)
      AND (%(created_after)s::timestamptz IS NULL OR r.created_at > %(created_after)s)
      AND (%(created_before)s::timestamptz IS NULL OR r.created_at < %(created_before)s)
      AND (%(text)s::text IS NULL OR strpos(lower(r.input), lower(%(text)s)) > 0)
      AND (%(replays)s::boolean IS NULL OR (r.replay_id IS NOT NULL) = %(replays)s::boolean)
      AND (%(replay_of)s::uuid IS NULL OR r.replay_of = %(replay_of)s)
      AND (%(replay_id)s::uuid IS NULL OR r.replay_id = %(replay_id)s)
      AND (%(eq)s::jsonb IS NULL OR r.labels @> %(eq)s::jsonb)
      AND (%(present)s::text[] IS NULL OR r.labels ?& %(present)s::text[])
      AND (%(absent)s::text[] IS NULL OR NOT r.labels ?| %(absent)s::text[])
      AND (%(ne)s::jsonb IS NULL OR NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(%(ne)s::jsonb) n WHERE r.labels ->> (n ->> 0) = n ->> 1))
      AND (%(within)s::jsonb IS NULL OR NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(%(within)s::jsonb) w
            WHERE NOT coalesce((w -> 1) ? (r.labels ->> (w ->> 0)), false)))
      AND (%(without)s::jsonb IS NULL OR NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(%(without)s::jsonb) w
            WHERE coalesce((w -> 1) ? (r.labels ->> (w ->> 0)), false)))
      AND (%(after)s::uuid IS NULL OR (r.created_at, r.id) <
           (SELECT created_at, id FROM run WHERE id = %(after)s))
    ORDER BY r.created_at DESC, r.id DESC LIMIT %(limit)s"""


def _filter_params(f: RunFilter) -> dict[str, Any]:
    sel = f.selector
    return {
        "statuses": [s.value for s in f.statuses] if f.statuses else None,
        "parent": f.parent, "model": f.model, "agent": f.agent, "agent_version": f.agent_version,
        "created_by": f.created_by, "created_after": f.created_after, "created_before": f.created_before,
        "text": f.text or None, "tenant": f.tenant,
        "replays": f.replays, "replay_of": f.replay_of, "replay_id": f.replay_id,
        "eq": Jsonb(sel.equal) if sel and sel.equal else None,
        "present": sel.present if sel and sel.present else None,
        "absent": sel.absent if sel and sel.absent else None,
        "ne": Jsonb([list(p) for p in sel.not_equal]) if sel and sel.not_equal else None,
        "within": Jsonb([[k, v] for k, v in sel.within]) if sel and sel.within else None,
        "without": Jsonb([[k, v] for k, v in sel.without]) if sel and sel.without else None,
    }


class Reads(Gateway):
    async def list_runs(
        self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None, *,
        parent: uuid.UUID | None = None, where: RunFilter | None = None,
    ) -> list[Run]:
        """Newest first; `after` is the id of the last run of the previous page (keyset pagination);
        `parent`: only the runs whose parent_run_id is that run (its children, continuations, forks);
        `where`: the list's other filters (RunFilter)."""
        where = where or RunFilter()
        if status is not None:
            where = dataclasses.replace(where, statuses=(status,))
        if parent is not None:
            where = dataclasses.replace(where, parent=parent)
        rows = await self._all(LIST_RUNS, {**_filter_params(where), "after": after, "limit": limit})
        return [as_run(r) for r in rows]

    async def steps(self, run_id: uuid.UUID, after_seq: int = 0) -> list[Step]:
        rows = await self._all(
            f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq > %s ORDER BY seq",
            (run_id, after_seq),
        )
        return [as_step(r) for r in rows]

    async def tool_calls(self, run_ids: list[uuid.UUID], after_seq: int) -> dict[uuid.UUID, list[Step]]:
        """Each run's finished TOOL steps after `after_seq`, in seq order: what a replay run is served from,
        and what it took (core/recording.Recording), read in one round trip."""
        rows = await self._all(
            f"""SELECT {STEP_COLUMNS} FROM run_step
                WHERE run_id = ANY(%s) AND seq > %s AND kind = 'TOOL' AND status <> 'STARTED' ORDER BY run_id, seq""",
            (run_ids, after_seq),
        )
        found: dict[uuid.UUID, list[Step]] = {run_id: [] for run_id in run_ids}
        for row in rows:
            found[row["run_id"]].append(as_step(row))
        return found

    async def steps_before(self, run_id: uuid.UUID, seq: int) -> list[Step]:
        """The steps before `seq`, in order: what a replay rebuilds that step's request from."""
        rows = await self._all(
            f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq < %s ORDER BY seq", (run_id, seq)
        )
        return [as_step(r) for r in rows]

    async def step(self, run_id: uuid.UUID, seq: int) -> Step | None:
        row = await self._one(f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq = %s", (run_id, seq))
        return as_step(row) if row else None

    async def timeline(self, run_id: uuid.UUID) -> list[Step]:
        """The steps without their request and response bodies."""
        rows = await self._all(
            f"SELECT {TIMELINE_COLUMNS} FROM run_step WHERE run_id = %s ORDER BY seq", (run_id,)
        )
        return [as_step(r) for r in rows]

    async def count_by_status(self) -> dict[str, int]:
        """How many runs there are in each status (for the metrics gauge)."""
        rows = await self._all("SELECT status, count(*) AS n FROM run GROUP BY status", ())
        return {r["status"]: int(r["n"]) for r in rows}

    # -- for the Kubernetes operator -------------------------------------------------------------

    async def get_many(self, run_ids: Sequence[uuid.UUID]) -> list[Run]:
        """The runs among `run_ids` that exist, in no particular order (one query for a batch)."""
        if not run_ids:
            return []
        rows = await self._all(f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = ANY(%s)", (list(run_ids),))
        return [as_run(r) for r in rows]

    async def find_linked(self, namespace: str, name: str) -> Run | None:
        """The run mirrored from the AgentRun `namespace/name`, if any (the newest, should names repeat)."""
        row = await self._one(
            f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.k8s_namespace = %s AND r.k8s_name = %s
                ORDER BY r.created_at DESC LIMIT 1""",
            (namespace, name),
        )
        return as_run(row) if row else None

    async def unfinished_linked(self) -> list[Run]:
        """Every queued or running run mirrored from an AgentRun: the operator's periodic resync."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r
                WHERE r.k8s_name IS NOT NULL AND r.status IN ('QUEUED', 'RUNNING', 'WAITING')""",
            (),
        )
        return [as_run(r) for r in rows]
