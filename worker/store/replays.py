"""Replays as their callers read them: a replay, its runs paired with the runs they replay, and each pair's
verdict, written once when its replay run has finished (the runs and the replay row are made by the door,
store/submit.py). A replay is its tenant's: a viewer of another tenant finds none, as with runs (VISIBLE)."""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentrun.worker.core.records import Run, Step
from agentrun.worker.core.replays import Verdict
from agentrun.worker.core.viewer import Viewer
from agentrun.worker.store.channels import REPLAY_SCORE_LOCK_CLASS
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import RUN_COLUMNS, STEP_COLUMNS, as_run, as_step

# What a viewer sees of replays: the rule of store/scoped.py's VISIBLE, on the replay's tenant.
VISIBLE_REPLAY = "(%(viewer_tenant)s::text IS NULL OR p.tenant = %(viewer_tenant)s)"

REPLAY_COLUMNS = """p.id, p.tenant, p.created_by, p.created_at, p.request, p.tool_policy, p.scorer, p.from_seq,
    c.runs, c.finished, v.scored, v.judged, v.passed"""

# Its runs, those finished, and its verdicts so far (judged: a pass or a fail; passed: passes).
COUNTS = """CROSS JOIN LATERAL (
        SELECT count(*) AS runs, count(*) FILTER (WHERE r.status NOT IN ('QUEUED', 'RUNNING', 'WAITING')) AS finished
        FROM run r WHERE r.replay_id = p.id) c
    CROSS JOIN LATERAL (
        SELECT count(*) AS scored, count(x.pass) AS judged, count(*) FILTER (WHERE x.pass) AS passed
        FROM replay_result x WHERE x.replay_id = p.id) v"""

GET_REPLAY = f"SELECT {REPLAY_COLUMNS} FROM replay p {COUNTS} WHERE p.id = %(id)s AND {VISIBLE_REPLAY}"

LIST_REPLAYS = f"""SELECT {REPLAY_COLUMNS} FROM replay p {COUNTS}
    WHERE {VISIBLE_REPLAY}
      AND (%(after)s::uuid IS NULL OR (p.created_at, p.id) < (SELECT created_at, id FROM replay WHERE id = %(after)s))
    ORDER BY p.created_at DESC, p.id DESC LIMIT %(limit)s"""

# A replay's runs with their verdicts (none yet: `scored` false).
PAIRS = f"""SELECT {RUN_COLUMNS}, x.pass AS verdict_pass, x.diff AS verdict_diff,
        x.replay_run_id IS NOT NULL AS verdict_scored
    FROM run r LEFT JOIN replay_result x ON x.replay_id = r.replay_id AND x.replay_run_id = r.id
    WHERE r.replay_id = %(id)s"""

RUNS_BY_ID = f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = ANY(%(ids)s::uuid[])"

# The replay's runs that have finished and have no verdict yet.
UNSCORED = f"""SELECT {RUN_COLUMNS} FROM run r
    WHERE r.replay_id = %(id)s AND r.status NOT IN ('QUEUED', 'RUNNING', 'WAITING')
      AND NOT EXISTS (SELECT 1 FROM replay_result x WHERE x.replay_id = r.replay_id AND x.replay_run_id = r.id)"""

ANY_UNSCORED = """SELECT EXISTS (SELECT 1 FROM run r
    WHERE r.replay_id = %(id)s AND r.status NOT IN ('QUEUED', 'RUNNING', 'WAITING')
      AND NOT EXISTS (SELECT 1 FROM replay_result x WHERE x.replay_id = r.replay_id AND x.replay_run_id = r.id))
    AS unscored"""

LOCK = "SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(id)s::text))"

MODEL_STEPS = f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %(id)s AND kind = 'MODEL' ORDER BY seq"

# Once per pair: a second writer (another API process that did not wait for the lock) changes nothing.
INSERT_RESULT = """INSERT INTO replay_result (replay_id, replay_run_id, recorded_run_id, pass, diff)
    VALUES (%(replay_id)s, %(run_id)s, %(recorded_id)s, %(pass)s, %(diff)s)
    ON CONFLICT DO NOTHING"""


@dataclasses.dataclass(frozen=True)
class Replay:
    """A replay as stored, with the counts of its runs and verdicts."""

    id: uuid.UUID
    tenant: str
    created_by: str | None
    created_at: datetime.datetime
    request: dict[str, Any]
    tool_policy: str
    scorer: str
    from_seq: int | None
    runs: int = 0
    finished: int = 0
    scored: int = 0  # pairs with a verdict stored (a pass, a fail, or none for a recording pruned since)
    judged: int = 0  # pairs with a pass or a fail
    passed: int = 0


@dataclasses.dataclass(frozen=True)
class Pair:
    """A replay run and the run it replays (None: that run is gone), with its verdict once scored."""

    replayed: Run
    recorded_id: uuid.UUID
    recorded: Run | None
    scored: bool = False
    passed: bool | None = None
    diff: dict[str, Any] | None = None


Judge = Callable[[Run, Sequence[Step], Run | None, Sequence[Step]], Awaitable[Verdict]]
"""Compares a finished replay run (and its MODEL steps) with its recorded run (None: pruned) and its steps."""


def _replay(row: dict[str, Any]) -> Replay:
    row = dict(row)
    for count in ("runs", "finished", "scored", "judged", "passed"):
        row[count] = int(row[count])
    return Replay(**row)


def _viewing(viewer: Viewer) -> dict[str, Any]:
    return {"viewer_tenant": viewer.tenant}


class Replays(Gateway):
    """The reads of replays for a viewer, and the verdicts written as their runs finish."""

    async def replay(self, replay_id: uuid.UUID, viewer: Viewer) -> Replay | None:
        """The replay, if the viewer sees it (its tenant's, or every tenant's for a platform operator)."""
        row = await self._one(GET_REPLAY, {**_viewing(viewer), "id": replay_id})
        return _replay(row) if row is not None else None

    async def replays(self, viewer: Viewer, limit: int, after: uuid.UUID | None = None) -> list[Replay]:
        """The replays the viewer sees, newest first; `after`: the last of the previous page."""
        rows = await self._all(LIST_REPLAYS, {**_viewing(viewer), "after": after, "limit": limit})
        return [_replay(r) for r in rows]

    async def pairs(self, replay: Replay) -> list[Pair]:
        """The replay's runs, each with the run it replays, in the order the request listed them (a replay
        made by a selector lists them as it found them)."""
        rows = await self._all(PAIRS, {"id": replay.id})
        verdicts = [(r.pop("verdict_scored"), r.pop("verdict_pass"), r.pop("verdict_diff")) for r in rows]
        runs = [as_run(r) for r in rows]
        recorded_ids = [r.replay_of for r in runs if r.replay_of is not None]
        recorded = {r.id: r for r in await self._runs(recorded_ids)}
        order = {str(run_id): i for i, run_id in enumerate(replay.request.get("runs") or [])}
        pairs = [Pair(run, run.replay_of, recorded.get(run.replay_of), bool(scored), passed, diff)
                 for run, (scored, passed, diff) in zip(runs, verdicts, strict=True) if run.replay_of is not None]
        pairs.sort(key=lambda p: (order.get(str(p.recorded_id), len(order)), str(p.recorded_id)))
        return pairs

    async def _runs(self, ids: Sequence[uuid.UUID]) -> list[Run]:
        if not ids:
            return []
        return [as_run(r) for r in await self._all(RUNS_BY_ID, {"ids": list(ids)})]

    async def score(self, replay_id: uuid.UUID, judge: Judge, budget: float | None = None) -> int:
        """Judge the replay's finished runs that have no verdict yet and store each verdict, once; returns how
        many were stored. Readers of one replay take turns (an advisory lock held while they judge): the
        second finds the first's verdicts and judges none again. `budget`: seconds after which no further pair
        is begun (a slow scorer's pairs are then judged over several reads)."""
        if not (await self._one(ANY_UNSCORED, {"id": replay_id}) or {}).get("unscored"):
            return 0
        stored = 0
        deadline = time.monotonic() + budget if budget is not None else None
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(LOCK.encode(), {"lock_class": REPLAY_SCORE_LOCK_CLASS, "id": replay_id})
            await cur.execute(UNSCORED.encode(), {"id": replay_id})
            for replayed in [as_run(r) for r in await cur.fetchall()]:
                assert replayed.replay_of is not None  # a replay run
                await cur.execute(RUNS_BY_ID.encode(), {"ids": [replayed.replay_of]})
                row = await cur.fetchone()
                recorded = as_run(row) if row is not None else None
                verdict = await judge(replayed, await self._model_steps(cur, replayed.id), recorded,
                                      await self._model_steps(cur, recorded.id) if recorded is not None else [])
                await cur.execute(INSERT_RESULT.encode(), {
                    "replay_id": replay_id, "run_id": replayed.id, "recorded_id": replayed.replay_of,
                    "pass": verdict.passed, "diff": Jsonb(verdict.diff)})
                stored += cur.rowcount
                if deadline is not None and time.monotonic() > deadline:  # one pair at least, each read
                    break
        return stored

    @staticmethod
    async def _model_steps(cur: Any, run_id: uuid.UUID) -> list[Step]:
        await cur.execute(MODEL_STEPS.encode(), {"id": run_id})
        return [as_step(r) for r in await cur.fetchall()]
