"""The benchmarks at tiny sizes, so they keep working; no figure is asserted (no timing in the suite)."""

from __future__ import annotations

from bench import claim, long_run, pickup, throughput


async def test_throughput_runs_every_run_to_the_end(database_url: str) -> None:
    figures = await throughput.bench(database_url, runs=6, turns=2, concurrency=3)
    assert figures["statuses"] == {"SUCCEEDED": 6} and figures["steps"] == 6 * 5


async def test_long_run_times_every_step(database_url: str) -> None:
    per_step = await long_run.bench(database_url, steps=20)
    assert [seq for seq, _ in per_step] == list(range(1, 22))


async def test_pickup_measures_each_sample(database_url: str) -> None:
    figures = await pickup.bench(database_url, samples=3, poll=60.0, gap=0.0)
    assert figures["samples"] == 3


async def test_claim_counts_no_double_claims(database_url: str) -> None:
    figures = await claim.measure(database_url, queued=50, claimers=3, claims_each=10)
    assert figures["double_claims"] == 0 and figures["claims_recorded"] == figures["claims"] == 30
