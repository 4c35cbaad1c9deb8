"""The chart's split, end to end: `agentrun migrate` as the owner role of docs/database-role.sql, then a
worker's API as the runtime role, which records who created and cancelled runs (migration 0006) but can
neither create, alter nor drop tables, nor migrate a database itself."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo

from agentrun.worker import cli
from agentrun.worker.api.app import create_app
from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.store.pool import open_pool
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL
from tests.support.cli import restore_logging  # noqa: F401  (a fixture)
from tests.support.roles import run_section, sections
from tests.support.serving import serving

TOKENS = {"submitter": ("agrt_role-test-submitter-0123456789", ["submit", "read"]),
          "canceller": ("agrt_role-test-canceller-0123456789", ["cancel"])}

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def urls(postgres_url: str) -> Iterator[dict[str, str]]:
    """The roles and database of docs/database-role.sql under names of this test; the owner's and the
    runtime role's URLs, with passwords, so that it works under password authentication too."""
    suffix = uuid.uuid4().hex[:8]
    names = {"agentrun_owner": f"ar_own_{suffix}", "agentrun_runtime": f"ar_rt_{suffix}", "agentrun": f"ar_id_{suffix}"}
    parts = sections(names)
    try:
        run_section(postgres_url, parts["cluster"])
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            for role in (names["agentrun_owner"], names["agentrun_runtime"]):
                admin.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(suffix)))
        db_url = make_conninfo(postgres_url, dbname=names["agentrun"])
        run_section(db_url, parts["database"])
        yield {"owner": make_conninfo(db_url, user=names["agentrun_owner"], password=suffix),
               "runtime": make_conninfo(db_url, user=names["agentrun_runtime"], password=suffix),
               "after migrate": parts["after migrate"]}
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(names["agentrun"])))
            for role in (names["agentrun_runtime"], names["agentrun_owner"]):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


async def test_owner_migrates_and_the_runtime_role_records_identities_but_changes_no_schema(
    urls: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runtime role cannot migrate a fresh database: a clear message, and nothing was created.
    with pytest.raises(SystemExit) as refused:
        await asyncio.to_thread(cli.main, ["migrate", "--database-url", urls["runtime"]])
    assert "may not change the schema" in str(refused.value.code) and "owner role" in str(refused.value.code)
    with psycopg.connect(urls["owner"]) as conn:
        assert conn.execute("SELECT to_regclass('schema_migration')").fetchone() == (None,)

    # The migrate init container, as the owner.
    assert await asyncio.to_thread(cli.main, ["migrate", "--database-url", urls["owner"]]) == 0
    assert "applied 0006_identities" in capsys.readouterr().out
    run_section(urls["owner"], urls["after migrate"])
    assert await migrate.migrate(urls["runtime"]) == []  # a worker without --no-migrate finds nothing to do

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("identities:\n" + "".join(
        f"  - {{name: {name}, sha256: {hashlib.sha256(token.encode()).hexdigest()}, scopes: [{', '.join(scopes)}]}}\n"
        for name, (token, scopes) in TOKENS.items()))
    settings = WorkerSettings(database_url=urls["runtime"], default_model=MODEL, api_tokens_file=str(tokens))
    pool = await open_pool(urls["runtime"], max_size=4)
    try:
        store = RunStore(pool)
        app = create_app(store, ToolBox(), settings, Metrics(count_runs=store.count_by_status, cache_seconds=0))
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            def as_(name: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {TOKENS[name][0]}"}

            r = await http.post("/api/runs", json={"input": "hi", "tokenBudget": 100, "timeoutSeconds": 60},
                                headers=as_("submitter"))
            assert r.status_code == 201, r.text
            run_id = r.json()["id"]
            r = await http.post(f"/api/runs/{run_id}/cancel", headers=as_("canceller"))
            assert r.status_code == 202, r.text
            view = (await http.get(f"/api/runs/{run_id}", headers=as_("submitter"))).json()
            assert (view["status"], view["createdBy"], view["cancelledBy"]) == ("CANCELLED", "submitter", "canceller")
            assert (await http.get("/readyz")).status_code == 200
        found = await store.get(uuid.UUID(run_id))
        assert found is not None and found.status is RunStatus.CANCELLED and found.cancelled_by == "canceller"
    finally:
        await pool.close()

    with psycopg.connect(urls["runtime"], autocommit=True) as conn:
        for forbidden in ("CREATE TABLE sneaky (x int)", "DROP TABLE run_step", "DROP TABLE run",
                          "ALTER TABLE run DROP COLUMN created_by", "ALTER TABLE run ADD COLUMN approved_by text",
                          "DELETE FROM run", "UPDATE schema_migration SET version = 0", "TRUNCATE run"):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(forbidden.encode())
        # Who did it stays written: the runtime role may update rows (cancel), yet the record is there.
        assert conn.execute("SELECT created_by, cancelled_by FROM run").fetchall() == [("submitter", "canceller")]
