"""The shared step writes on PostgreSQL's generic plan: each statement is prepared once per connection and runs
on the plan made then, often while the tables were small. None of them may read a whole table per batch:
`done` did (a hash join over all of run_step), and B1's database time per step grew with the table."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import ModelTurn, Usage
from agentrun.worker.store import RunStore
from agentrun.worker.store import steps as shared
from tests.support.builders import new_run


async def generic_plan(db: psycopg.AsyncConnection[Any], query: bytes) -> str:
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m[1] not in names:
            names.append(m[1])
        return f"${names.index(m[1]) + 1}"

    text = re.sub(r"%\((\w+)\)[bs]", number, query.decode())
    cur = await db.execute(("EXPLAIN (GENERIC_PLAN) " + text).encode())  # type: ignore[arg-type]
    return "\n".join(row[0] for row in await cur.fetchall())


@pytest.mark.parametrize("form", ["CHECKPOINTS", "TOOL_STARTS", "TOOL_FINISHES"])
async def test_no_shared_write_reads_a_whole_table_on_its_generic_plan(
    store: RunStore, db: psycopg.AsyncConnection[Any], form: str
) -> None:
    if db.info.server_version < 160000:
        pytest.skip("EXPLAIN (GENERIC_PLAN) is PostgreSQL 16's")
    for _ in range(300):  # B1's start: runs queued, a few held, few steps; never analyzed
        await store.create(new_run())
    for claimed in await store.claim_many("w", 30, limit=8):
        await store.checkpoint_turn(claimed.run.id, "w", 30, ModelTurn("{}", "[]", "tool_use", Usage(1, 1), None, 0),
                                    epoch=claimed.run.lease_epoch, tool_starts=[("a", "noop", "{}")])
    plan = await generic_plan(db, getattr(shared, form).query)
    assert "Seq Scan on run_step" not in plan and not re.search(r"Seq Scan on run\b", plan), plan
