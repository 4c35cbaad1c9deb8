"""Messages into a running run: stored at once, delivered as USER steps at turn boundaries, in order, once;
never lost to a run that succeeds without them (the race with the run's end, forced both ways)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import Progress, RunStatus, StepKind
from agentrun.worker.core.replay import MESSAGE
from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.running import finished
from tests.support.running import running as serving


def _texts(request: LlmRequest) -> list[str]:
    """Every text a request's user turns carry, in order (the input, tool results, messages)."""
    out: list[str] = []
    for m in request.messages:
        if m["role"] != "user":
            continue
        content = m["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for b in content:
            if b.get("type") == "text":
                out.append(b["text"])
            elif b.get("type") == "tool_result":
                out.append(f"result:{b['content']}")
    return out


def _alternates(request: LlmRequest) -> bool:
    roles = [m["role"] for m in request.messages]
    return all(a != b for a, b in zip(roles, roles[1:], strict=False))


async def test_a_message_posted_while_a_tool_runs_arrives_after_its_result(store: RunStore) -> None:
    entered, proceed = asyncio.Event(), asyncio.Event()

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        entered.set()
        await proceed.wait()
        return "slow done"

    llm = ScriptedLlm().then_tool_use("toolu_1", "slow").then_text("answered both")
    run, _ = await store.create(new_run("look it up"))
    async with serving(worker(store, llm, [slow])):
        await asyncio.wait_for(entered.wait(), 10)
        first, status = await store.post_message(run.id, "also check the EU region", by="alice")
        second, _ = await store.post_message(run.id, "and be brief", by="bob")
        assert first is not None and second is not None and status is RunStatus.RUNNING
        assert (first.n, second.n) == (1, 2)
        proceed.set()
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert (after.messages_sent, after.messages_delivered) == (2, 2)
    steps = await store.steps(run.id)
    assert [s.kind for s in steps] == [StepKind.MODEL, StepKind.TOOL, StepKind.USER, StepKind.USER, StepKind.MODEL]
    assert [(s.response, s.created_by, s.request) for s in steps[2:4]] == [
        ("also check the EU region", "alice", MESSAGE), ("and be brief", "bob", MESSAGE)]
    # The second model call has the tool's result, then both messages, in one user turn, in POST order.
    assert len(llm.seen) == 2
    assert _texts(llm.seen[1]) == ["look it up", "result:slow done", "also check the EU region", "and be brief"]
    assert _alternates(llm.seen[1])
    assert [m.seq for m in await store.messages(run.id)] == [3, 4]


class HeldModel:
    """A model whose first call waits for `proceed`: a message can be posted while it is in flight."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.entered, self.proceed = asyncio.Event(), asyncio.Event()
        self.seen: list[LlmRequest] = []

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.seen.append(request)
        if len(self.seen) == 1:
            self.entered.set()
            await self.proceed.wait()
        return LlmResponse([{"type": "text", "text": self.answers[len(self.seen) - 1]}], "end_turn", Usage(1, 1))


async def test_a_model_call_in_flight_is_not_interrupted_and_the_message_follows_its_turn(store: RunStore) -> None:
    llm = HeldModel(["first answer", "second answer"])
    run, _ = await store.create(new_run("hello"))
    async with serving(worker(store, llm)):
        await asyncio.wait_for(llm.entered.wait(), 10)
        await store.post_message(run.id, "one more thing", by="alice")
        llm.proceed.set()
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED and after.output == "second answer"
    assert [s.kind for s in await store.steps(run.id)] == [StepKind.MODEL, StepKind.USER, StepKind.MODEL]
    assert _texts(llm.seen[1]) == ["hello", "one more thing"]


class PostsBeforeFinish(RunStore):
    """Posts a message just before the worker's finishing write: after the model's last turn was
    checkpointed (its answer said no message waits), before the run ends."""

    posted: list[str] = []

    async def finish(self, run_id: uuid.UUID, *a: Any, **kw: Any) -> Any:
        if not self.posted:
            message, _ = await self.post_message(run_id, "wait, one more", by="alice")
            assert message is not None
            self.posted.append("wait, one more")
        return await super().finish(run_id, *a, **kw)


async def test_a_message_racing_the_final_turn_is_delivered_and_the_run_goes_on(store: RunStore) -> None:
    racing = PostsBeforeFinish(store.pool)
    racing.posted = []
    llm = ScriptedLlm().then_text("done").then_text("done, with the extra")
    run, _ = await store.create(new_run())
    async with serving(worker(racing, llm)):
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert after.output == "done, with the extra"  # the run did not succeed without the message
    assert [s.kind for s in await store.steps(run.id)] == [StepKind.MODEL, StepKind.USER, StepKind.MODEL]
    assert _texts(llm.seen[1])[-1] == "wait, one more"


async def test_a_message_whose_post_waits_on_the_runs_end_is_refused(store: RunStore, database_url: str) -> None:
    """The run's end holds the run row when the post comes: the post waits for it, re-checks the row, and
    refuses (409), never 202 for a run that has succeeded."""
    run, _ = await store.create(new_run())
    async with await psycopg.AsyncConnection.connect(database_url) as ending:
        async with ending.transaction():
            await ending.execute("SELECT id FROM run WHERE id = %s FOR UPDATE", (run.id,))
            post = asyncio.create_task(store.post_message(run.id, "too late?", by="alice"))
            await _blocked_on_lock(ending, post)
            await ending.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now() WHERE id = %s", (run.id,))
        message, status = await asyncio.wait_for(post, 10)
    assert message is None and status is RunStatus.SUCCEEDED
    assert await store.messages(run.id) == []


async def test_a_finish_that_waits_on_a_post_sees_its_message_and_does_not_succeed(
    store: RunStore, database_url: str
) -> None:
    """The other way round: a post is committing when the finish comes. The finish waits for the row and
    reads the counters of its new version: nothing is written, and the driver is told to go on."""
    run, _ = await store.create(new_run())
    claim = await store.claim("worker-A", 30)
    assert claim is not None and claim.run.id == run.id
    async with await psycopg.AsyncConnection.connect(database_url) as posting:
        async with posting.transaction():
            await posting.execute("UPDATE run SET messages_sent = messages_sent + 1 WHERE id = %s", (run.id,))
            await posting.execute("INSERT INTO run_message (run_id, n, text) VALUES (%s, 1, 'hi')", (run.id,))
            end = asyncio.create_task(store.finish(run.id, "worker-A", RunStatus.SUCCEEDED, None,
                                                   epoch=claim.run.lease_epoch, lease_seconds=600))
            await _blocked_on_lock(posting, end)
        owed = await asyncio.wait_for(end, 10)
        assert isinstance(owed, Progress) and owed.messages == 1
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.RUNNING and after.locked_by == "worker-A"
    assert after.locked_until is not None and claim.run.locked_until is not None
    assert after.locked_until > claim.run.locked_until  # the refused finish renewed the lease it goes on under
    # A failure is not fenced: a run may fail with a message undelivered (it never passes for an answer).
    assert isinstance(await store.finish(run.id, "worker-A", RunStatus.FAILED, "x", epoch=claim.run.lease_epoch), int)


async def _blocked_on_lock(conn: psycopg.AsyncConnection[Any], task: asyncio.Task[Any]) -> None:
    """Until another backend waits for a lock `conn`'s transaction holds (the task's statement)."""
    pid = conn.info.backend_pid
    for _ in range(500):
        assert not task.done(), task
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                 (pid,))
        row = await cur.fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the statement never waited for the lock")


class CrashesAfterDelivery(RunStore):
    """The worker dies right after its delivery write committed (a BaseException the engine lets through)."""

    async def deliver_messages(self, *a: Any, **kw: Any) -> Any:
        await super().deliver_messages(*a, **kw)
        raise SimulatedCrash("after the delivery write")


async def test_a_crash_after_the_delivery_replays_it_exactly_once(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    run, _ = await store.create(new_run("start"))
    await store.post_message(run.id, "hello from alice", by="alice")
    crashing = worker(CrashesAfterDelivery(store.pool), ScriptedLlm())
    try:
        await crashing.run_once()
    except SimulatedCrash:
        pass
    steps = await store.steps(run.id)
    assert [(s.kind, s.response) for s in steps] == [(StepKind.USER, "hello from alice")]
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    llm = ScriptedLlm().then_text("hi alice")
    assert await worker(store, llm, name="worker-B").run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED, after
    assert [s.kind for s in await store.steps(run.id)] == [StepKind.USER, StepKind.MODEL]
    # Replayed from the step log, once: the input and the message, one user turn.
    assert _texts(llm.seen[0]) == ["start", "hello from alice"] and len(llm.seen[0].messages) == 1


async def test_a_delivery_sent_again_finds_its_steps_and_delivers_nothing_twice(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    claim = await store.claim("worker-A", 30)
    assert claim is not None
    await store.post_message(run.id, "one")
    wid = uuid.uuid4()
    first, progress = await store.deliver_messages(run.id, "worker-A", 30, write_id=wid)
    assert [s.response for s in first] == ["one"] and progress.messages == 0
    await store.post_message(run.id, "two")
    again, progress = await store.deliver_messages(run.id, "worker-A", 30, write_id=wid, again=True)
    assert [(s.seq, s.response) for s in again] == [(first[0].seq, "one")]
    assert progress.messages == 1  # "two" waits for the next delivery, not this copy
    later, progress = await store.deliver_messages(run.id, "worker-A", 30, write_id=uuid.uuid4())
    assert [s.response for s in later] == ["two"] and progress.messages == 0
    assert [s.response for s in await store.steps(run.id)] == ["one", "two"]


async def test_a_waiting_run_gets_its_message_after_the_decision(store: RunStore) -> None:
    from agentrun.worker.core.records import Decision

    @tool(name="refund")
    def refund(args: dict[str, Any], ctx: ToolContext) -> str:
        return "refunded"

    llm = ScriptedLlm().then_tool_use("toolu_r", "refund").then_text("refund made, noted")
    run, _ = await store.create(new_run("refund order 7", require_approval=("refund",)))
    async with serving(worker(store, llm, [refund])):
        async def waiting() -> bool:
            r = await store.get(run.id)
            return r is not None and r.status is RunStatus.WAITING

        from tests.support.waiting import eventually
        await eventually(waiting, 30, "the run to wait for approval")
        message, status = await store.post_message(run.id, "the customer called again", by="carol")
        assert message is not None and status is RunStatus.WAITING
        await store.decide(run.id, "toolu_r", Decision.APPROVE, by="carol")
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert [s.kind for s in await store.steps(run.id)] == [StepKind.MODEL, StepKind.TOOL, StepKind.USER, StepKind.MODEL]
    assert _texts(llm.seen[1]) == ["refund order 7", "result:refunded", "the customer called again"]


async def test_no_step_left_for_an_answer_fails_the_run_rather_than_succeeding_without_it(store: RunStore) -> None:
    racing = PostsBeforeFinish(store.pool)
    racing.posted = []
    llm = ScriptedLlm().then_text("done")
    run, _ = await store.create(new_run(max_steps=1))
    async with serving(worker(racing, llm)):
        after = await finished(store, run.id)
    assert after.status is RunStatus.FAILED and "no step to answer it" in (after.error or "")


async def test_a_continuation_of_a_run_that_opened_with_a_message_keeps_its_input_and_who_sent_it(
    store: RunStore,
) -> None:
    run, _ = await store.create(new_run("first question"))
    await store.post_message(run.id, "context before it starts", by="alice")
    assert await worker(store, ScriptedLlm().then_text("first answer")).run_once() == run.id
    assert [s.kind for s in await store.steps(run.id)] == [StepKind.USER, StepKind.MODEL]  # opened with the message
    llm = ScriptedLlm().then_text("second answer")
    child, _ = await store.create(new_run("second question", continue_from=run.id))
    assert await worker(store, llm, name="worker-B").run_once() == child.id
    after = await store.get(child.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED, after
    sent = llm.seen[0]
    assert [m["role"] for m in sent.messages] == ["user", "assistant", "user"]
    assert _texts(sent) == ["first question", "context before it starts", "second question"]
    steps = await store.steps(child.id)
    assert [(s.kind, s.created_by, s.inherited) for s in steps[:3]] == [
        (StepKind.USER, None, True), (StepKind.USER, "alice", True), (StepKind.MODEL, None, True)]


async def test_a_message_the_budget_leaves_no_turn_for_fails_the_run_undelivered(store: RunStore) -> None:
    racing = PostsBeforeFinish(store.pool)
    racing.posted = []
    llm = ScriptedLlm().then_text("done", in_=600, out=500)
    run, _ = await store.create(new_run(token_budget=1000))
    async with serving(worker(racing, llm)):
        after = await finished(store, run.id)
    assert after.status is RunStatus.FAILED and "token budget exhausted" in (after.error or "")
    assert [m.seq for m in await store.messages(run.id)] == [None]  # not delivered: no turn could answer it


async def test_many_messages_posted_at_once_arrive_each_once_in_the_order_received(store: RunStore) -> None:
    entered, proceed = asyncio.Event(), asyncio.Event()

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        entered.set()
        await proceed.wait()
        return "ok"

    llm = ScriptedLlm().then_tool_use("toolu_1", "slow").then_text("read them all")
    run, _ = await store.create(new_run("go", max_steps=500))
    async with serving(worker(store, llm, [slow])):
        await asyncio.wait_for(entered.wait(), 10)
        posted = await asyncio.gather(*(store.post_message(run.id, f"message {i}", by=f"u{i % 3}") for i in range(150)))
        assert all(m is not None for m, _ in posted)
        proceed.set()
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    received = {m.text: m.n for m in await store.messages(run.id)}
    assert sorted(received.values()) == list(range(1, 151))
    users = [s for s in await store.steps(run.id) if s.kind is StepKind.USER]
    # One USER step each, in the order the run received them (n), the seqs consecutive after the tool's.
    assert [received[s.response or ""] for s in users] == list(range(1, 151))
    assert [s.seq for s in users] == list(range(3, 153))
    assert len(llm.seen) == 2 and _texts(llm.seen[1])[2:] == [s.response for s in users]
    assert _alternates(llm.seen[1])


async def test_the_store_refuses_text_it_cannot_hold(store: RunStore) -> None:
    import pytest

    run, _ = await store.create(new_run())
    with pytest.raises(ValueError, match="message text"):
        await store.post_message(run.id, "a\x00b")
    assert await store.messages(run.id) == [] and (await store.get(run.id)).messages_sent == 0  # type: ignore[union-attr]


PAUSED = [{"type": "text", "text": "Searching."},
          {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}]
COMPACTED = [{"type": "compaction", "content": "Summary of the work so far."}]


@pytest.mark.parametrize(("stop", "paused"), [("pause_turn", PAUSED), ("compaction", COMPACTED)])
async def test_a_message_posted_during_a_turn_the_model_pauses_waits_for_the_turn_to_end(
    store: RunStore, stop: str, paused: list[dict[str, Any]]
) -> None:
    """A turn paused by the provider (its server tools' `pause_turn`, or a `compaction` stop) is not over: the
    next call sends it back for the model to go on with. A message must come after the whole turn, not
    between the paused part and its continuation (where it would end the turn, with a server_tool_use left
    without its result)."""
    run, _ = await store.create(new_run("look it up"))

    class PostsDuringTheFirstCall(ScriptedLlm):
        async def send(self, request: LlmRequest) -> LlmResponse:
            if not self.seen:
                message, _ = await store.post_message(run.id, "also the EU region", by="alice")
                assert message is not None
            return await super().send(request)

    llm = PostsDuringTheFirstCall()
    llm.then_response(LlmResponse(paused, stop, Usage(10, 5)))
    llm.then_response(LlmResponse([{"type": "text", "text": "Found it."}], "end_turn", Usage(20, 3)))
    llm.then_text("Found it, and the EU region too.")
    assert await worker(store, llm).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED, after.error
    assert llm.seen[1].messages == [{"role": "user", "content": "look it up"}, {"role": "assistant", "content": paused}]
    assert llm.seen[2].messages == [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": [*paused, {"type": "text", "text": "Found it."}]},
        {"role": "user", "content": "also the EU region"}]
    assert after.output == "Found it, and the EU region too."
    assert [s.kind for s in await store.steps(run.id)] == [
        StepKind.MODEL, StepKind.MODEL, StepKind.USER, StepKind.MODEL]
