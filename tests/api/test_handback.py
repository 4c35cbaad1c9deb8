"""A run handed back (its model retries ran out) shows no holder, says when it is retried, is announced
to watchers, and a cancel ends it at once (issue 24, item 4)."""

from __future__ import annotations

import datetime

import httpx
from fastapi import FastAPI

from agentrun.worker.store import RunStore
from tests.support.builders import new_run
from tests.support.serving import serving
from tests.support.sse import streaming


async def test_a_handed_back_run_shows_no_holder_emits_a_run_event_and_cancels_at_once(
    app: FastAPI, store: RunStore
) -> None:
    run, _ = await store.create(new_run(timeout_seconds=3600))  # its deadline is past the backoff
    claim = await store.claim("worker-A", 30)
    assert claim is not None and claim.run.id == run.id
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        async with streaming(http, f"/api/runs/{run.id}/events") as stream:
            await stream.until(lambda s: s.of("run") and s.of("run")[-1]["lockedBy"] == "worker-A",
                               what="the run held by worker-A")
            assert await store.release(run.id, "worker-A", delay=600, epoch=claim.run.lease_epoch)
            await stream.until(lambda s: s.of("run")[-1]["lockedBy"] is None, timeout=15,
                               what="a run event for the handback")
        seen = stream.of("run")[-1]
        assert seen["modelRetries"] == 1 and seen["status"] == "QUEUED"
        view = (await http.get(f"/api/runs/{run.id}")).json()
        assert view["lockedBy"] is None and view["modelRetries"] == 1 and view["leaseEpoch"] == 1
        retry_at = datetime.datetime.fromisoformat(view["runAt"])
        assert retry_at > datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=300)
        # No worker drives it while it waits out its backoff: the cancel ends it now, not at runAt.
        assert (await http.post(f"/api/runs/{run.id}/cancel")).status_code == 202
        view = (await http.get(f"/api/runs/{run.id}")).json()
        assert view["status"] == "CANCELLED" and view["finishedAt"] is not None
        assert "handed back" in view["error"]
    # Claimed again later, it is not counted as a crash of its previous holder.
    after = await store.get(run.id)
    assert after is not None and after.crashes == 0


async def test_a_cancel_ends_a_run_released_on_drain_at_once(store: RunStore) -> None:
    """A release without a delay (a worker stopping) leaves no holder either: the cancel does not wait for
    another worker to claim the run and notice."""
    run, _ = await store.create(new_run())
    claim = await store.claim("worker-A", 30)
    assert claim is not None
    assert await store.release(run.id, "worker-A")
    cancelled = await store.cancel(run.id, by="alice")
    assert cancelled is not None and cancelled.status.value == "CANCELLED" and cancelled.locked_by is None
    assert cancelled.model_retries == 0 and cancelled.cancelled_by == "alice"
