"""Chaos run: many runs through worker processes killed with SIGKILL every few seconds, every client
connection cut a few times, faults injected into single connections by a proxy between the workers and
PostgreSQL (delays, stalls, half-open connections, cuts, new connections slower than the liveness grace:
bench/fault_proxy.py), and a PostgreSQL restart in the middle; then the promises are checked against the
database, the tool's execution log, the lease history and the model's request log.

    .venv/bin/python -m bench.chaos                      # 200 runs, 4 workers, the full run
    .venv/bin/python -m bench.chaos --runs 20 --workers 2

Prints a report and exits non-zero if an invariant fails. Needs nothing but this repository's virtualenv:
the database is a private embedded PostgreSQL, the model a local Messages API server in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import math
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
from psycopg.rows import dict_row

from agentrun.worker.core.records import NewRun
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing.fake_server import FakeAnthropic, ScriptResponder
from bench.chaos_tools import EXEC_TABLE
from bench.fault_proxy import FaultPlan, ProxyThread
from bench.local_postgres import LocalPostgres

REPO = Path(__file__).resolve().parents[1]
MODEL = "claude-sonnet-4-5"  # priced in the shipped table, so cost is checked too
TIGHT_BUDGET = 250  # tokens: the ScriptResponder's turns cost 120+ each, so the guard stops before turn 3


@dataclasses.dataclass(frozen=True)
class Options:
    runs: int = 200
    workers: int = 4
    concurrency: int = 4
    """Runs in flight per worker."""
    lease_seconds: float = 2.5
    kill_every: float = 2.0
    """Mean seconds between two SIGKILLs (uniform between half and one and a half times this). Each kills
    a worker that holds a run, so that it interrupts work rather than a process still starting up."""
    max_claims: int = 4
    """A worker holding a run claimed this many times is not killed: every run gets to end, and stays
    below the worker's limit on claims of a run that keeps killing its workers."""
    pg_restart: bool = True
    pg_down_seconds: float = 2.0
    cuts: int = 3
    """How many times every client connection is cut (pg_terminate_backend), each while workers hold runs."""
    cut_every: float = 2.0
    """Seconds at least between two cuts (and from the start to the first)."""
    slow_seconds: float = 1.5
    """How long a slow tool call sleeps: long enough for kills to land inside tool calls."""
    model_latency: float = 0.05
    proxy_faults: int = 12
    """Faults the proxy injects (seeded by `seed`, each bounded: FaultPlan); 0 connects the workers to
    PostgreSQL directly."""
    seed: int = 1
    timeout: float = 900.0
    verbose: bool = False


@dataclasses.dataclass
class Plan:
    tag: str
    turns: int
    parallel: int
    slow: int
    budget: int

    @property
    def input(self) -> str:
        return f"chaos run={self.tag} turns={self.turns} parallel={self.parallel} slow={self.slow}"

    @property
    def expected(self) -> str:
        return "FAILED" if self.budget == TIGHT_BUDGET else "SUCCEEDED"


def plans(options: Options) -> list[Plan]:
    rng = random.Random(options.seed)
    out = []
    for i in range(options.runs):
        out.append(Plan(
            tag=str(i),
            turns=rng.randint(3, 8),
            parallel=rng.choice([1, 1, 2, 3]),
            slow=rng.choice([0, 0, 1, 2]),
            budget=TIGHT_BUDGET if rng.random() < 0.05 else 1_000_000,
        ))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class WorkerProc:
    name: str
    port: int
    proc: asyncio.subprocess.Process


class Fleet:
    """The worker processes: start, SIGKILL and restart under a new name (each life is its own worker)."""

    def __init__(self, options: Options, env: dict[str, str], logdir: Path) -> None:
        self.options, self.env, self.logdir = options, env, logdir
        self.slots: list[WorkerProc | None] = [None] * options.workers
        self.generation = [0] * options.workers
        self.pids: dict[int, str] = {}
        self.kills: list[tuple[float, str]] = []  # (epoch seconds just before the SIGKILL, worker name)

    async def start(self, slot: int) -> None:
        self.generation[slot] += 1
        name = f"w{slot}.{self.generation[slot]}"
        port = _free_port()
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentrun.worker.cli", "worker", "--id", name, "--port", str(port),
            "--host", "127.0.0.1", "--concurrency", str(self.options.concurrency),
            "--lease-seconds", f"{self.options.lease_seconds:g}", "--poll-interval", "0.2",
            "--shutdown-grace", "2", "--no-migrate",
            env=self.env, stdout=log, stderr=log, cwd=REPO,
        )
        log.close()
        self.pids[proc.pid] = name
        self.slots[slot] = WorkerProc(name, port, proc)

    async def kill_one(self, rng: random.Random, busy: set[str]) -> str | None:
        """SIGKILL one of the workers named in `busy` and start another in its slot; None if none is there."""
        slots = [i for i, w in enumerate(self.slots) if w and w.name in busy and w.proc.returncode is None]
        if not slots:
            return None
        slot = rng.choice(slots)
        w = self.slots[slot]
        assert w is not None
        # Taken before the signal: a takeover of its runs can follow the kill at once.
        self.kills.append((time.time(), w.name))
        if w.proc.returncode is None:
            w.proc.send_signal(signal.SIGKILL)
        await w.proc.wait()
        await self.start(slot)
        return w.name

    async def stop(self) -> None:
        for w in self.slots:
            if w and w.proc.returncode is None:
                w.proc.terminate()
        for w in self.slots:
            if w:
                try:
                    await asyncio.wait_for(w.proc.wait(), 15)
                except TimeoutError:
                    w.proc.kill()
                    await w.proc.wait()

    async def live(self, deadline: float) -> tuple[list[WorkerProc], list[str]]:
        """The current workers once each answers /healthz (a worker just started may still be coming
        up); and the names of those that exited or did not answer by the monotonic `deadline`."""
        workers = [w for w in self.slots if w]
        answered = await asyncio.gather(*(_until(w, "/healthz", 200, deadline) for w in workers))
        return ([w for w, ok in zip(workers, answered, strict=True) if ok],
                [w.name for w, ok in zip(workers, answered, strict=True) if not ok])


async def _get(port: int, path: str) -> int | None:
    """The status of one request, None if nothing answered."""
    try:
        async with httpx.AsyncClient(timeout=5) as c:
            return (await c.get(f"http://127.0.0.1:{port}{path}")).status_code
    except httpx.HTTPError:
        return None


async def _until(w: WorkerProc, path: str, status: int, deadline: float) -> bool:
    """Whether the worker answered `path` with `status` before the monotonic deadline (False once it exited)."""
    while w.proc.returncode is None:
        if await _get(w.port, path) == status:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return False


@dataclasses.dataclass
class Outage:
    started: float = 0.0
    ended: float = 0.0
    probed: list[str] = dataclasses.field(default_factory=list)
    """The workers that answered /healthz before the outage: the ones whose /readyz is judged."""
    not_live: list[str] = dataclasses.field(default_factory=list)
    readyz_while_down: collections.Counter[int | None] = dataclasses.field(default_factory=collections.Counter)
    not_ready_after: list[str] = dataclasses.field(default_factory=list)
    seconds_to_ready: float = 0.0


async def restart_postgres(pg: LocalPostgres, fleet: Fleet, options: Options) -> Outage:
    """Stop PostgreSQL for a while and back: every live worker's /readyz must say 503 while it is down
    and 200 again after, without the worker being restarted. No worker is killed meanwhile."""
    live, not_live = await fleet.live(time.monotonic() + 60)
    out = Outage(probed=[w.name for w in live], not_live=not_live)
    out.started = time.time()
    await asyncio.to_thread(pg.stop)
    deadline = time.monotonic() + options.pg_down_seconds
    rounds = 0
    while rounds == 0 or time.monotonic() < deadline:  # at least one full round while it is down
        for code in await asyncio.gather(*(_get(w.port, "/readyz") for w in live)):
            out.readyz_while_down[code] += 1
        rounds += 1
        await asyncio.sleep(0.3)
    await asyncio.to_thread(pg.start)
    out.ended = time.time()
    back = time.monotonic()
    # The pools reconnect on their own, with backoff; generous, as the machine may be loaded.
    ready = await asyncio.gather(*(_until(w, "/readyz", 200, back + 60) for w in live))
    out.seconds_to_ready = time.monotonic() - back
    out.not_ready_after = [w.name for w, ok in zip(live, ready, strict=True) if not ok]
    return out


CUT_CONNECTIONS = """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()"""


@dataclasses.dataclass(frozen=True)
class Cut:
    at: float
    """Epoch seconds, just before the connections were cut."""
    connections: int
    tools_in_flight: int


async def busy_workers(conn: psycopg.AsyncConnection[Any], max_claims: int | None = None) -> set[str]:
    """The workers holding a run now; with `max_claims`, only those whose every run was claimed fewer times."""
    cur = await conn.execute(
        """SELECT locked_by FROM run WHERE status = 'RUNNING' AND locked_until > now()
           GROUP BY locked_by HAVING max(claims) < %s""", (max_claims or 2**31 - 1,))
    return {row[0] for row in await cur.fetchall()}


async def cut_connections(conn: psycopg.AsyncConnection[Any], fleet: Fleet) -> Cut | None:
    """Terminate every other session of the database at once, as a pooler restart or a failover would;
    only while some worker holds a run (mid-run), else None."""
    if not await busy_workers(conn):
        return None
    pids = [w.proc.pid for w in fleet.slots if w and w.proc.returncode is None]
    cur = await conn.execute("SELECT count(*) FROM chaos_tool_exec WHERE ended_at IS NULL AND pid = ANY(%s)", (pids,))
    row = await cur.fetchone()
    tools = int(row[0]) if row else 0
    at = time.time()
    cur = await conn.execute(CUT_CONNECTIONS)
    killed = await cur.fetchone()
    return Cut(at=at, connections=int(killed[0]) if killed else 0, tools_in_flight=tools)


# -- the check ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclasses.dataclass
class Report:
    lines: list[str]
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def text(self) -> str:
        out = [*self.lines, ""]
        out += [f"[{'PASS' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in self.checks]
        out.append("")
        out.append("chaos: all invariants hold" if self.ok else "chaos: INVARIANTS VIOLATED")
        return "\n".join(out)


async def _rows(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(query.encode(), params)
    return await cur.fetchall()


def _noted_ends(folder: Path) -> dict[str, float]:
    ends: dict[str, float] = {}
    for path in folder.glob("*.ends"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:  # a line cut short by a kill is skipped
                with contextlib.suppress(ValueError):
                    ends[parts[0]] = float(parts[1])
    return ends


def _sample(items: Sequence[Any], n: int = 5) -> str:
    return ", ".join(map(str, items[:n])) + (" …" if len(items) > n else "")


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the run left behind: the database's runs, steps, tool executions and lease history."""

    runs: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    execs: list[dict[str, Any]]
    history: list[dict[str, Any]]
    tag_of: dict[Any, str]
    """Each run's plan tag, by run id."""


async def check(url: str, plan_list: list[Plan], model: FakeAnthropic, fleet: Fleet, outage: Outage | None,
                seconds: float, cuts: Sequence[Cut] = ()) -> Report:
    seen = await observe(url, fleet)
    checks = [
        runs_end_as_scripted(seen, plan_list),
        *model_call_checks(seen, model),
        tool_execution_check(seen, fleet, outage, cuts),
        counters_check(seen),
        *step_writer_checks(seen),
        *overlap_and_tenure_checks(seen.execs, seen.history, seen.runs, seen.tag_of, fleet, outage, cuts),
    ]
    if outage is not None:
        checks.append(readyz_check(outage))
    return Report(summary(seen, plan_list, fleet, outage, cuts, seconds), checks)


async def observe(url: str, fleet: Fleet) -> Observed:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        runs = await _rows(conn, """SELECT id, input, status, error, tokens_used, cost_usd, claims,
                                           extract(epoch FROM finished_at)::float8 AS finished FROM run""")
        steps = await _rows(conn, """SELECT run_id, seq, kind, status, tool_use_id, request, attempts, worker,
                                            input_tokens + output_tokens + cache_creation_input_tokens
                                              + cache_read_input_tokens AS tokens, cost_usd, finished_at,
                                            (SELECT l.worker FROM run_lease l WHERE l.run_id = s.run_id
                                               AND l.claimed_at <= s.finished_at
                                             ORDER BY l.claimed_at DESC LIMIT 1) AS holder
                                     FROM run_step s""")
        execs = await _rows(conn, """SELECT e.execution_id, e.idempotency_key, e.run_tag, e.pid,
                                            extract(epoch FROM e.executed_at)::float8 AS at,
                                            extract(epoch FROM e.ended_at)::float8 AS ended
                                     FROM chaos_tool_exec e ORDER BY e.executed_at""")
        history = await _rows(conn, """SELECT run_id, worker, extract(epoch FROM claimed_at)::float8 AS at
                                       FROM run_lease ORDER BY run_id, claimed_at""")
    # Ends the tool noted in its own file, for executions whose end never reached the database (its
    # process was killed while that write waited for the database).
    noted = _noted_ends(fleet.logdir)
    for e in execs:
        if e["ended"] is None:
            e["ended"] = noted.get(str(e["execution_id"]))
    tag_of = {r["id"]: ScriptResponder.plan({"messages": [{"content": r["input"]}]})["run"] for r in runs}
    return Observed(runs, steps, execs, history, tag_of)


def runs_end_as_scripted(seen: Observed, plan_list: list[Plan]) -> Check:
    """1. every run terminal, with the status its script calls for"""
    by_tag = {p.tag: p for p in plan_list}
    runs, tag_of = seen.runs, seen.tag_of
    status = collections.Counter(r["status"] for r in runs)
    wrong = [f"{tag_of[r['id']]}:{r['status']}({r['error']})" for r in runs
             if r["status"] != by_tag[tag_of[r["id"]]].expected]
    return Check("runs end as scripted", len(runs) == len(plan_list) and not wrong,
                 f"{len(runs)} runs, {dict(status)}; unexpected: {len(wrong)} {_sample(wrong)}")


def model_call_checks(seen: Observed, model: FakeAnthropic) -> list[Check]:
    """2. MODEL steps: never two for one turn; requests repeated only across a hand-over of the run"""
    model_steps = [s for s in seen.steps if s["kind"] == "MODEL"]
    turns_seen = collections.Counter((s["run_id"], orjson.loads(s["request"])["message_count"]) for s in model_steps)
    doubled = [k for k, n in turns_seen.items() if n > 1]
    requests = collections.Counter(ScriptResponder.key(body) for body in model.requests)
    claims = {seen.tag_of[r["id"]]: r["claims"] for r in seen.runs}
    extra_by_run: collections.Counter[str] = collections.Counter()
    for (tag, _turn), n in requests.items():
        extra_by_run[tag] += n - 1
    over = [f"{tag}: {n} repeats, {claims.get(tag, 0) - 1} hand-overs" for tag, n in extra_by_run.items()
            if n > claims.get(tag, 0) - 1]
    return [
        Check("no MODEL step repeated", not doubled,
              f"{len(model_steps)} MODEL steps, {len(doubled)} turns checkpointed twice"),
        Check(
            "model calls repeated only by a crash in their window", not over,
            f"{len(model.requests)} requests for {len(requests)} (run, turn) pairs; {sum(extra_by_run.values())} "
            f"repeated, in {sum(1 for n in extra_by_run.values() if n)} runs; each run's repeats <= its hand-overs "
            f"(violations: {len(over)} {_sample(over)})"),
    ]


def tool_execution_check(seen: Observed, fleet: Fleet, outage: Outage | None, cuts: Sequence[Cut]) -> Check:
    """3. tool executions: beyond the first, same key, after a crash of the previous executor"""
    tool_steps = {s["tool_use_id"]: s for s in seen.steps if s["kind"] == "TOOL"}
    per_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in seen.execs:
        per_key[e["idempotency_key"]].append(e)
    bad_exec = []
    for key, es in per_key.items():
        step = tool_steps.get(key)
        if step is None:
            bad_exec.append(f"{key}: no step with this tool_use id")
            continue
        if len(es) > step["attempts"]:
            bad_exec.append(f"{key}: {len(es)} executions but attempts={step['attempts']}")
        bad_exec += [why for prev, nxt in zip(es, es[1:], strict=False)
                     if (why := _unexplained_again(key, prev, nxt, fleet, outage, cuts))]
    again = sum(len(es) - 1 for es in per_key.values())
    return Check(
        "tool re-executions share the key and follow a crash", not bad_exec,
        f"{len(seen.execs)} executions of {len(per_key)} tool calls ({len(tool_steps)} tool steps); {again} "
        f"re-executions in {sum(1 for es in per_key.values() if len(es) > 1)} calls "
        f"(violations: {len(bad_exec)} {_sample(bad_exec)})")


def _unexplained_again(key: str, prev: dict[str, Any], nxt: dict[str, Any], fleet: Fleet, outage: Outage | None,
                       cuts: Sequence[Cut]) -> str | None:
    """Why executing the call again as `nxt` after `prev` broke a promise; None if a crash of prev's
    worker or the database's outage came between them."""
    who = fleet.pids.get(prev["pid"], "?")
    crashed = any(prev["at"] <= t <= nxt["at"] and name == who for t, name in fleet.kills)
    db_down = outage is not None and prev["at"] <= outage.ended and outage.started <= nxt["at"]
    if crashed or db_down:
        return None
    # A cut acts until the pools have reconnected: one a little before counts too.
    lease = fleet.options.lease_seconds
    cut = max((c.at for c in cuts if prev["at"] - lease <= c.at <= nxt["at"]), default=None)
    why = f" ({nxt['at'] - cut:.1f}s after a connection cut)" if cut is not None else ""
    return (f"{key}: executed again at {nxt['at']:.2f} by {fleet.pids.get(nxt['pid'], '?')} without a "
            f"crash of {who} since {prev['at']:.2f}{why}")


def counters_check(seen: Observed) -> Check:
    """4. counters equal the sum over the steps"""
    runs = seen.runs
    tokens: collections.Counter[Any] = collections.Counter()
    cost: dict[Any, Any] = collections.defaultdict(int)
    for s in seen.steps:
        tokens[s["run_id"]] += s["tokens"]
        cost[s["run_id"]] += s["cost_usd"] or 0
    mismatched = [seen.tag_of[r["id"]] for r in runs
                  if r["tokens_used"] != tokens[r["id"]] or r["cost_usd"] != cost[r["id"]]]
    return Check("tokens_used and cost_usd equal the sums over the steps", not mismatched,
                 f"{sum(r['tokens_used'] for r in runs)} tokens, ${sum(r['cost_usd'] for r in runs):.4f}; "
                 f"{len(mismatched)} runs differ {_sample(mismatched)}")


def step_writer_checks(seen: Observed) -> list[Check]:
    """5. every step written by the lease holder of that moment"""
    steps = seen.steps
    trespass = [f"{seen.tag_of[s['run_id']]}#{s['seq']} by {s['worker']}, holder {s['holder']}" for s in steps
                if s["finished_at"] is not None and s["holder"] != s["worker"]]
    unfinished = [s for s in steps if s["status"] == "STARTED"]
    return [
        Check("every step written by the worker holding the lease", not trespass,
              f"{sum(1 for s in steps if s['finished_at'])} finished steps checked against {len(seen.history)} "
              f"claims; {len(trespass)} outside their writer's tenure {_sample(trespass)}"),
        Check("no step left half-written", not unfinished, f"{len(unfinished)} tool steps still STARTED"),
    ]


def readyz_check(outage: Outage) -> Check:
    answers = outage.readyz_while_down
    return Check(
        "readyz not ready while the database is down, ready after",
        bool(outage.probed) and not outage.not_live and set(answers) == {503} and not outage.not_ready_after,
        f"{len(outage.probed)} live workers probed ({len(outage.not_live)} never answered /healthz "
        f"{_sample(outage.not_live)}); readyz during the {outage.ended - outage.started:.1f}s outage: "
        f"{dict(answers)}; after: all 200 within {outage.seconds_to_ready:.1f}s except "
        f"{len(outage.not_ready_after)} {_sample(outage.not_ready_after)}")


def summary(seen: Observed, plan_list: list[Plan], fleet: Fleet, outage: Outage | None, cuts: Sequence[Cut],
            seconds: float) -> list[str]:
    """The report's head: what the run did."""
    runs, leases = seen.runs, len(seen.history)
    return [
        "chaos report",
        f"  runs: {len(plan_list)} ({sum(p.turns for p in plan_list)} tool turns, "
        f"{sum(1 for p in plan_list if p.parallel > 1)} with parallel tool_use, {sum(1 for p in plan_list if p.slow)} "
        f"with slow tools, {sum(1 for p in plan_list if p.expected == 'FAILED')} scripted to exhaust their budget)",
        f"  workers: {len(fleet.slots)} processes, {sum(fleet.generation)} started, "
        f"{len(fleet.kills)} killed with SIGKILL",
        f"  postgres restarts: {1 if outage else 0}"
        + (f" (down {outage.ended - outage.started:.1f}s)" if outage else ""),
        f"  connection cuts: {len(cuts)} ({sum(c.connections for c in cuts)} connections terminated, "
        f"with {sum(c.tools_in_flight for c in cuts)} tool executions in flight)",
        f"  claims: {leases} ({leases - len(runs)} hand-overs; at most {max((r['claims'] for r in runs), default=0)} "
        "for one run)",
        f"  wall time: {seconds:.1f}s",
    ]


def overlap_and_tenure_checks(execs: list[dict[str, Any]], history: list[dict[str, Any]],
                              runs: list[dict[str, Any]], tag_of: dict[Any, str], fleet: Fleet,
                              outage: Outage | None, cuts: Sequence[Cut]) -> list[Check]:
    """The promises a dropped connection must not break, and proof that the kills hit work in flight."""
    checks: list[Check] = []
    killed_at = {name: t for t, name in fleet.kills}
    lease = fleet.options.lease_seconds

    # (a) a tool call never runs twice at the same time: per tool_use id, no two executions overlap.
    # An execution without an end died with its process, at the kill; one whose process was never
    # killed and that recorded no end is taken to run to the end of the benchmark.
    def end_of(e: dict[str, Any]) -> float:
        if e["ended"] is not None:
            return float(e["ended"])
        return killed_at.get(fleet.pids.get(e["pid"], "?"), math.inf)

    per_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in execs:
        per_key[e["idempotency_key"]].append(e)
    overlaps = []
    for key, es in per_key.items():
        es.sort(key=lambda e: e["at"])
        for i, later in enumerate(es):
            for earlier in es[:i]:
                if later["at"] < end_of(earlier):
                    overlaps.append(
                        f"{key}: {fleet.pids.get(later['pid'], '?')} started it at {later['at']:.2f} while "
                        f"{fleet.pids.get(earlier['pid'], '?')} ran it ({earlier['at']:.2f}–{end_of(earlier):.2f})")
    unended = sum(1 for e in execs if e["ended"] is None)
    checks.append(Check(
        "no tool call executed twice at the same time", not overlaps,
        f"{len(execs)} executions of {len(per_key)} tool calls, {unended} cut short by a kill; "
        f"overlapping: {len(overlaps)} {_sample(overlaps)}"))

    # (b) a run changes hands only when its holder died, or could not reach the database long enough that
    # it had to give its runs up (about 2/3 of the lease without a renewal): never because a connection
    # dropped under a live holder.
    claims: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for h in history:
        claims[h["run_id"]].append(h)
    long_outage = outage is not None and outage.ended - outage.started >= 2 * lease / 3
    handovers, stolen = 0, []
    for run_id, hs in claims.items():
        for prev, nxt in zip(hs, hs[1:], strict=False):
            if prev["worker"] == nxt["worker"]:
                continue
            handovers += 1
            if prev["worker"] in killed_at and killed_at[prev["worker"]] <= nxt["at"]:
                continue
            if long_outage and outage is not None and prev["at"] <= outage.ended and outage.started <= nxt["at"]:
                continue
            # A cut acts until the pools have reconnected: one a little before the earlier claim counts.
            cut = max((c.at for c in cuts if prev["at"] - lease <= c.at <= nxt["at"]), default=None)
            why = f", {nxt['at'] - cut:.1f}s after a connection cut" if cut is not None else ""
            stolen.append(f"{tag_of[run_id]}: {prev['worker']} (alive) → {nxt['worker']} at {nxt['at']:.2f}{why}")
    checks.append(Check(
        "no run changes hands while its holder is alive", not stolen,
        f"{handovers} hand-overs between workers; {len(stolen)} from a live holder {_sample(stolen)}"))

    # (c) the kills hit work in flight: the killed worker held a run that was not finished yet (so it
    # was in a model call, a tool call or a checkpoint), or was running a tool.
    finished = {r["id"]: (math.inf if r["finished"] is None else float(r["finished"])) for r in runs}
    in_flight = in_tool = 0
    for t, name in fleet.kills:
        held = any(
            hs[j]["worker"] == name and finished[run_id] > t
            for run_id, hs in claims.items()
            for j in [max((i for i, h in enumerate(hs) if h["at"] <= t), default=-1)] if j >= 0
        )
        tool = any(fleet.pids.get(e["pid"]) == name and e["at"] <= t < end_of(e) + 1e-6 for e in execs)
        in_flight += held or tool
        in_tool += tool
    checks.append(Check(
        "kills hit steps in flight", in_flight > 0,
        f"{len(fleet.kills)} kills; {in_flight} landed while the worker had a step in flight "
        f"({in_tool} during a tool execution)"))
    return checks


def proxy_check(proxy: ProxyThread) -> Check:
    """The proxy's schedule played to its end and every kind of fault hit a connection: the invariants
    above held under all of them."""
    kinds = {f.kind for f in proxy.plan.schedule()}
    counts = proxy.counts()
    hit = {k for k in kinds if counts.get(k)}
    return Check("faults injected at the connection", proxy.played and hit == kinds,
                 f"{'played to its end' if proxy.played else 'not played to its end'}; "
                 f"kinds that hit a connection: {sorted(hit)} of {sorted(kinds)}")


# -- the run --------------------------------------------------------------------------------------


async def chaos(options: Options) -> Report:
    rng = random.Random(options.seed)
    plan_list = plans(options)
    pg = await asyncio.to_thread(LocalPostgres)
    model = FakeAnthropic(ScriptResponder(latency=options.model_latency, slow_seconds=options.slow_seconds))
    fleet: Fleet | None = None
    proxy: ProxyThread | None = None
    try:
        await migrate.migrate(pg.url)
        async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
            await conn.execute(EXEC_TABLE)
        pool = await open_pool(pg.url, max_size=4)
        try:
            store = RunStore(pool)
            for p in plan_list:
                await store.create(NewRun(input=p.input, model=MODEL, token_budget=p.budget, timeout_seconds=3600))
        finally:
            await pool.close()
        await model.start()
        if options.proxy_faults:
            proxy = ProxyThread(pg.url, FaultPlan(seed=options.seed, faults=options.proxy_faults))
        env = {
            **os.environ,
            "AGENTRUN_DATABASE_URL": proxy.url if proxy is not None else pg.url,
            "AGENTRUN_TOOLS": "bench.chaos_tools",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "chaos-local-key",
            "AGENTRUN_LLM_TIMEOUT_SECONDS": "30",
            "AGENTRUN_LOG_LEVEL": "INFO" if options.verbose else "WARNING",
        }
        logdir = Path(tempfile.mkdtemp(prefix="agentrun-chaos-logs-"))
        env["AGENTRUN_CHAOS_ENDS"] = str(logdir)  # chaos_tools notes each execution's end there too
        fleet = Fleet(options, env, logdir)
        for slot in range(options.workers):
            await fleet.start(slot)
        await fleet.live(time.monotonic() + 120)  # the clock starts once the first workers are up
        t0 = time.monotonic()
        if proxy is not None:
            proxy.play()
        outage: Outage | None = None
        cuts: list[Cut] = []
        last_cut = t0
        next_kill = t0 + options.kill_every * rng.uniform(0.5, 1.5)
        last_note = t0
        async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
            async def terminal() -> int:
                cur = await conn.execute("SELECT count(*) FROM run WHERE finished_at IS NOT NULL")
                row = await cur.fetchone()
                return int(row[0]) if row else 0

            done = 0
            while True:
                with contextlib.suppress(psycopg.OperationalError):
                    if conn.closed:
                        conn = await psycopg.AsyncConnection.connect(pg.url, autocommit=True)
                    done = await terminal()
                if done >= len(plan_list):
                    break
                now = time.monotonic()
                if now - t0 > options.timeout:
                    print(f"chaos: timed out after {options.timeout:g}s with {done} runs finished", file=sys.stderr)
                    break
                # Once the cuts and a first kill are behind: the restart takes long enough that the runs
                # left after it may not give them a chance.
                if options.pg_restart and outage is None and done >= len(plan_list) * 0.4 and (
                        len(cuts) >= options.cuts and fleet.kills):
                    print(f"chaos: restarting PostgreSQL ({done} of {len(plan_list)} runs finished)", file=sys.stderr)
                    outage = await restart_postgres(pg, fleet, options)
                    with contextlib.suppress(Exception):
                        await conn.close()
                    conn = await psycopg.AsyncConnection.connect(pg.url, autocommit=True)
                    continue
                if len(cuts) < options.cuts and now - last_cut >= options.cut_every:
                    with contextlib.suppress(psycopg.OperationalError):
                        if cut := await cut_connections(conn, fleet):
                            cuts.append(cut)
                            last_cut = now
                            print(f"chaos: cut {cut.connections} connections ({cut.tools_in_flight} tools in "
                                  f"flight; {done} of {len(plan_list)} runs finished)", file=sys.stderr)
                if now >= next_kill:
                    name = None
                    with contextlib.suppress(psycopg.OperationalError):
                        name = await fleet.kill_one(rng, await busy_workers(conn, options.max_claims))
                    if name is not None:  # else a worker holding a run is waited for
                        if options.verbose:
                            print(f"chaos: killed {name}", file=sys.stderr)
                        next_kill = time.monotonic() + options.kill_every * rng.uniform(0.5, 1.5)
                if now - last_note > 10:
                    print(f"chaos: {done} of {len(plan_list)} runs finished, {len(fleet.kills)} kills", file=sys.stderr)
                    last_note = now
                await asyncio.sleep(0.1)
            await conn.close()
        seconds = time.monotonic() - t0
        await fleet.stop()
        report = await check(pg.url, plan_list, model, fleet, outage, seconds, cuts)
        if proxy is not None:
            report.checks.append(proxy_check(proxy))
            error = proxy.proxy.last_upstream_error
            report.lines.append("  fault proxy: " + ", ".join(f"{k} {n}" for k, n in sorted(proxy.counts().items()))
                                + (f" (the last unreachable: {error})" if error else ""))
        report.lines.append(f"  worker logs: {logdir}")
        return report
    finally:
        if fleet is not None:
            await fleet.stop()
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
        await model.stop()
        await asyncio.to_thread(pg.close)


def main(argv: Sequence[str] | None = None) -> int:
    d = Options()
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=int, default=d.runs)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="runs in flight per worker")
    p.add_argument("--lease-seconds", type=float, default=d.lease_seconds)
    p.add_argument("--kill-every", type=float, default=d.kill_every, help="mean seconds between SIGKILLs")
    p.add_argument("--max-claims", type=int, default=d.max_claims,
                   help="spare a worker holding a run claimed this many times")
    p.add_argument("--no-pg-restart", action="store_true", help="skip the PostgreSQL restart")
    p.add_argument("--pg-down-seconds", type=float, default=d.pg_down_seconds)
    p.add_argument("--cuts", type=int, default=d.cuts, help="times every client connection is cut, each mid-run")
    p.add_argument("--cut-every", type=float, default=d.cut_every, help="seconds at least between two cuts")
    p.add_argument("--slow-seconds", type=float, default=d.slow_seconds, help="sleep of a slow tool call")
    p.add_argument("--model-latency", type=float, default=d.model_latency, help="seconds the model takes")
    p.add_argument("--proxy-faults", type=int, default=d.proxy_faults,
                   help="faults the proxy between workers and PostgreSQL injects; 0: no proxy")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the scripts, the kills and the faults")
    p.add_argument("--timeout", type=float, default=d.timeout, help="give up after this many seconds")
    p.add_argument("--verbose", action="store_true", help="workers log at INFO; print each kill")
    a = p.parse_args(argv)
    options = Options(
        runs=a.runs, workers=a.workers, concurrency=a.concurrency, lease_seconds=a.lease_seconds,
        kill_every=a.kill_every, pg_restart=not a.no_pg_restart, pg_down_seconds=a.pg_down_seconds, cuts=a.cuts,
        cut_every=a.cut_every, max_claims=a.max_claims,
        slow_seconds=a.slow_seconds, model_latency=a.model_latency, proxy_faults=a.proxy_faults,
        seed=a.seed, timeout=a.timeout, verbose=a.verbose,
    )
    report = asyncio.run(chaos(options))
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
