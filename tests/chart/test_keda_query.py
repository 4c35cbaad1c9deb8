"""The chart's KEDA trigger, rendered by helm, run against a real database holding runs of every kind:
it counts the runs that need a slot (queued and due, plus running), never scheduled, waiting or
finished ones; KEDA divides by worker.concurrency."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from agentrun.worker.store import RunStore
from tests.support.builders import new_run
from tests.support.chart import find

Render = Callable[..., list[dict[str, Any]]]


def _trigger(render: Render, tmp_path: Path, *extra: str) -> dict[str, Any]:
    values = tmp_path / "keda.yaml"
    values.write_text("autoscaling:\n  keda:\n    enabled: true\nworker:\n  concurrency: 3\n")
    scaled = find(render(values, extra=tuple(extra)), "ScaledObject")
    trigger: dict[str, Any] = scaled["spec"]["triggers"][0]
    return trigger


async def test_keda_counts_queued_due_and_running_runs(render: Render, tmp_path: Path, store: RunStore,
                                                       db: psycopg.AsyncConnection[Any]) -> None:
    trigger = _trigger(render, tmp_path)
    assert trigger["metadata"]["targetQueryValue"] == "3"  # worker.concurrency
    async def make(n: int, status: str, **kw: Any) -> None:
        for _ in range(n):
            run, _ = await store.create(new_run(**kw))
            if status not in ("QUEUED", "RUNNING-HELD"):
                await db.execute("UPDATE run SET status = %s WHERE id = %s", (status, run.id))
            if status == "RUNNING-HELD":
                await db.execute("UPDATE run SET status = 'RUNNING', locked_by = 'w', "
                                 "locked_until = now() + interval '30 seconds' WHERE id = %s", (run.id,))

    await make(4, "QUEUED")                              # due now: count
    await make(2, "QUEUED", delay_seconds=3600)          # scheduled for later: not yet
    await make(3, "RUNNING-HELD")                        # held by a worker: count (its slot is busy)
    await make(1, "RUNNING")                             # lease lapsed, to be taken over: count
    for status in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"):
        await make(1, status)                            # finished: never
    # Handed back to wait out a model API outage: RUNNING with a lapsed lease and run_at ahead: not yet.
    waiting, _ = await store.create(new_run())
    await db.execute("UPDATE run SET status = 'RUNNING', locked_until = now() - interval '1 second', "
                     "run_at = now() + interval '5 minutes' WHERE id = %s", (waiting.id,))

    cur = await db.execute(trigger["metadata"]["query"])
    (count,) = await cur.fetchone()  # type: ignore[misc]
    assert count == 4 + 3 + 1
    assert math.ceil(count / int(trigger["metadata"]["targetQueryValue"])) == 3  # the pods KEDA asks for


def test_runs_per_replica_overrides_concurrency(render: Render, tmp_path: Path) -> None:
    trigger = _trigger(render, tmp_path, "--set", "autoscaling.keda.runsPerReplica=8")
    assert trigger["metadata"]["targetQueryValue"] == "8"


def test_termination_grace_covers_the_shutdown_grace(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "keda.yaml"
    values.write_text("autoscaling:\n  keda:\n    enabled: true\n")
    manifests = render(values, extra=("--set", "worker.shutdownGraceSeconds=40"))
    deployment = find(manifests, "Deployment", "-worker")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--shutdown-grace") + 1] == "40"
    assert pod["terminationGracePeriodSeconds"] > 40


def test_retention_and_model_limits_values(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "fleet.yaml"
    values.write_text('retention:\n  days: 30\nmodelLimits:\n  "claude-*": {maxConcurrentRequests: 2}\n')
    manifests = render(values)
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AGENTRUN_RETENTION_DAYS"] == "30"
    limits = find(manifests, "ConfigMap", "-model-limits")["data"]["model-limits.json"]
    assert limits == '{"claude-*":{"maxConcurrentRequests":2}}'
    pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-limits")
    assert config["AGENTRUN_MODEL_LIMITS"].startswith(mount["mountPath"] + "/")


def test_database_retry_max_seconds_value(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "retry.yaml"
    values.write_text("database:\n  retryMaxSeconds: 2.5\n")
    assert find(render(values), "ConfigMap", "-config")["data"]["AGENTRUN_DATABASE_RETRY_MAX_SECONDS"] == "2.5"
    assert "AGENTRUN_DATABASE_RETRY_MAX_SECONDS" not in find(render(), "ConfigMap", "-config")["data"]
