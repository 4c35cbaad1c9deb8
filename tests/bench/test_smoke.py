"""The benchmarks at tiny sizes, so they keep working; no figure is asserted (no timing in the suite)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrun.worker.core.records import Progress
from agentrun.worker.store import Claim, RunStore
from bench import capacity, claim, fairness, long_run, memory, pickup, replay, submit, throughput


async def test_throughput_runs_every_run_to_the_end(database_url: str) -> None:
    figures = await throughput.bench(database_url, runs=6, turns=2, concurrency=3)
    assert figures["statuses"] == {"SUCCEEDED": 6} and figures["steps"] == 6 * 5


async def test_replay_serves_every_call_of_every_run_from_the_recording(database_url: str) -> None:
    figures = await replay.bench(database_url, runs=4, turns=2, concurrency=2)
    assert figures["statuses"] == {"SUCCEEDED": 4}
    assert (figures["served_calls"], figures["calls_not_served"]) == (4 * 2, 0)


async def test_long_run_times_every_step(database_url: str) -> None:
    per_step = await long_run.bench(database_url, steps=20)
    assert [seq for seq, _ in per_step] == list(range(1, 22))


async def test_pickup_measures_each_sample(database_url: str) -> None:
    figures = await pickup.bench(database_url, samples=3, poll=60.0, gap=0.0)
    assert figures["samples"] == 3


async def test_submit_makes_every_run_exactly_once_through_a_worker_process(database_url: str) -> None:
    figures = await submit.bench(database_url, clients=3, submissions=12, retry_every=4, warmup=0)
    assert (figures["submissions"], figures["retries"], figures["runs_made"]) == (12, 3, 12)
    assert figures["exactly_once"] and figures["errors"] == {}


def test_submit_verdict_is_the_whole_target() -> None:
    assert submit.missed_targets(2100, 40, True, 0) == []
    assert submit.missed_targets(2100, 60, True, 0) == ["p99 60.0 ms above 50"]
    assert submit.missed_targets(2100, 40, False, 0) == ["runs made differ from keys sent"]  # fast, not exact
    assert submit.missed_targets(1000, 40, True, 2) == ["1000 submissions/s below 2000", "2 failed requests"]


def test_claim_verdict_is_the_whole_target_not_the_p99_alone() -> None:
    assert claim.missed_targets(0.9, 0, True) == []
    assert claim.missed_targets(2.5, 0, True) == ["p99 ratio above 2"]
    assert claim.missed_targets(0.9, 3, True) == ["3 double claims"]  # a fast p99 with double claims is missed
    assert claim.missed_targets(0.9, 0, False) == ["claims recorded differ from claims made"]


async def test_claim_counts_no_double_claims(database_url: str) -> None:
    figures = await claim.measure(database_url, queued=50, claimers=3, claims_each=10)
    assert figures["double_claims"] == 0 and figures["runs_with_mismatched_claims"] == 0
    assert figures["claims_recorded"] == figures["claims"] == 30


class PeekingStore(RunStore):
    """A broken claim: it hands out the oldest queued run without taking it, so every claimer gets it."""

    async def claim(self, worker: str, lease_seconds: float, liveness: bool = False) -> Claim | None:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT id, now() FROM run WHERE status = 'QUEUED' ORDER BY run_at LIMIT 1")).fetchone()
        run = await self.get(row[0]) if row is not None else None
        if row is None or run is None:
            return None
        return Claim(run, Progress(run.tokens_used, run.cost_usd, run.cancel_requested, row[1]), None)


class StealingStore(RunStore):
    """A broken claim once: right after claimer-0's first claim, a second worker takes the same run from
    under it, live lease and liveness lock notwithstanding (the double claim of a lease that lapsed too
    early, or of a claim query that ignores the lock)."""

    stolen = False

    async def claim(self, worker: str, lease_seconds: float, liveness: bool = False) -> Claim | None:
        got = await super().claim(worker, lease_seconds, liveness)
        if got is not None and worker == "claimer-0" and not self.stolen:
            self.stolen = True
            async with self.pool.connection() as conn:
                await conn.execute("UPDATE run SET locked_by = 'thief', claims = claims + 1 WHERE id = %s",
                                   (got.run.id,))
        return got


@pytest.mark.parametrize(("store_factory", "doubles"), [(PeekingStore, 30), (StealingStore, 1)],
                         ids=["claim-takes-nothing", "run-taken-from-its-holder"])
async def test_claim_sees_an_injected_double_claim(database_url: str, store_factory: Any, doubles: int) -> None:
    figures = await claim.measure(database_url, queued=50, claimers=3, claims_each=10, store_factory=store_factory)
    assert figures["double_claims"] == doubles
    assert figures["runs_with_mismatched_claims"] >= 1


async def test_memory_reports_an_in_flight_target_never_reached(database_url: str) -> None:
    # One run at a time can never put three in flight: no RSS sample while all are in flight exists.
    figures = await asyncio.wait_for(memory.bench(database_url, runs=3, turns=1, latency=0.0, concurrency=1), 120)
    assert figures["peak_in_flight"] <= 1 and figures["rss_in_flight_max_mb"] is None and figures["met"] is False
    assert isinstance(figures["rss_peak_mb"], float) and figures["rss_peak_mb"] > 0


async def test_prune_bench_prunes_every_old_step(database_url: str) -> None:
    from bench import prune

    figures = await prune.bench(database_url, steps=200, steps_per_run=10, runs=4, turns=1, concurrency=2,
                                batch_size=5)
    assert figures["pruned"] == {"run_step": 200, "run_lease": 20, "run_decision": 0, "run_message": 0,
                                  "run_webhook_attempt": 0, "run_webhook": 0, "run": 20}
    assert figures["alone"]["before"]["steps"] == figures["alone"]["after"]["steps"] == 4 * 3


async def test_real_path_runs_every_run_through_a_worker_process(database_url: str, tmp_path: Path) -> None:
    from bench import real_path

    log = tmp_path / "worker.log"
    with real_path.model_server() as model_url:
        figures = await asyncio.wait_for(
            real_path.bench(database_url, model_url, runs=20, turns=2, concurrency=4, log=log), 240)
    assert figures["statuses"] == {"SUCCEEDED": 20} and figures["steps"] == 20 * 5
    assert 0 < figures["steps_measured"] <= 100 and figures["worker_cpu_s"] >= 0
    # The worker exits cleanly: its model client's HTTP session closed, not reported unclosed at exit.
    assert "Unclosed" not in log.read_text(), log.read_text()[-2000:]


async def test_in_flight_holds_every_run_at_once_within_the_pool(database_url: str) -> None:
    from bench import in_flight

    f = await in_flight.in_flight(database_url, runs=40, turns=1, latency=0.5)
    assert f["peak_in_flight"] == 40 and f["statuses"] == {"SUCCEEDED": 40}
    assert f["pool_connections_peak"] <= f["pool_size"] and f["writes"] == 40 * 4  # 2 checkpoints (the first starts the tool), its finish, the end


async def test_b1_reports_its_writes_per_batch(database_url: str) -> None:
    f = await throughput.bench(database_url, runs=16, turns=1, concurrency=8)
    assert f["statuses"] == {"SUCCEEDED": 16} and f["writes_per_batch"] >= 1


async def test_context_bench_runs_each_strategy(database_url: str) -> None:
    from bench import context

    figures = await context.bench(database_url, turns=30, result_bytes=2048, window=16_000, max_output=1024)
    statuses = [(r["provider"], r["strategy"], r["window"], r["status"]) for r in figures["runs"]]
    assert statuses == [
        ("anthropic", "none", None, "SUCCEEDED"), ("anthropic", "server", 16_000, "SUCCEEDED"),
        ("anthropic", "summarize", 16_000, "SUCCEEDED"), ("anthropic", "clear_tool_results", 16_000, "SUCCEEDED"),
        ("openai", "summarize", 16_000, "SUCCEEDED"), ("openai", "clear_tool_results", 16_000, "SUCCEEDED"),
        ("anthropic", "none", 16_000, "FAILED"),
    ]
    assert all(r["largest_request"] is None or r["largest_request"] + 1024 <= 16_000
               for r in figures["runs"][1:])


async def test_fairness_times_each_small_tenants_run(database_url: str) -> None:
    figures = await fairness.shared(database_url, backlog=30, small=3, turns=1, concurrency=2, head_start=0.0,
                                    window=0.0)
    assert figures["small"] == 3 and figures["steps"] > 0
    many = await claim.measure(database_url, queued=50, claimers=2, claims_each=5, tenants=5)
    assert many["double_claims"] == 0 and many["claims_recorded"] == many["claims"]


async def test_capacity_measures_a_step_and_a_renewal(database_url: str) -> None:
    measured = await capacity.measure(database_url, runs=4, turns=1, concurrency=2)
    assert measured["steps"] == 4 * 3 and measured["wal_bytes_per_step"] > 0
    renewed = await capacity.renewals(database_url, held=20, rounds=2)
    assert renewed["held"] == 20 and renewed["wal_bytes_per_renewal"] > 0


def test_capacity_counts_each_run_in_flight_for_its_steps_and_its_lease() -> None:
    measured = {"server_cpu_ms_per_step": 0.5, "wal_bytes_per_step": 1000.0,
                "renewal": {"server_cpu_ms_per_renewal": 0.05, "wal_bytes_per_renewal": 300.0, "renew_every_s": 10.0}}
    table = capacity.capacity(measured, cores=2, utilisation=0.5)
    assert table["steps_per_s_at_zero_latency"] == 2000
    # at 1 s: each run costs 2 steps (1 ms) and a twentieth of a renewal's 0.05 ms a second
    assert table["in_flight"]["1s"]["runs"] == round(1000 / (1.0 + 0.005))
    assert table["in_flight"]["30s"]["steps_per_s"] < table["in_flight"]["1s"]["steps_per_s"]


async def test_streams_bench_opens_every_stream_and_measures_three_phases(database_url: str) -> None:
    from bench import streams

    f = await streams.bench(database_url, runs=3, streams=6, latency=0.2, seconds=0.5)
    assert f["subscribers"] == 6 and f["streams_failed"] == 0
    assert [p["streams"] for p in f["phases"]] == [6, 3, 0] and set(f["met"]) == {"p99", "db_load_flat"}


async def test_in_flight_reports_what_a_waiting_run_holds(database_url: str) -> None:
    from bench import in_flight

    held = await in_flight.holders(database_url, runs=10, top=5)
    assert held["waiting"] == 10 and len(held["top"]) == 5 and held["python_bytes_per_run"] > 0
