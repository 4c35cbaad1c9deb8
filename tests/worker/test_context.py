"""Context-window management in the engine (issue 28): long runs kept within a small window by each
strategy, never a request over it, crashes around the summarising call, and `none` failing before sending.

The model here counts tokens as the local servers do (a character count over four) and refuses a request
over its window as the real API would: the engine is proven against that, not against its own estimate."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.core.types import LlmError, LlmRequest, LlmResponse, Usage
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker

WINDOW = 16_000
MAX_OUTPUT = 1024
MODEL = "claude-window-16k"
OPENAI_MODEL = "local/window-16k"
PRICES = PriceTable.from_toml(f"""
[models."{MODEL}"]
input = 3.0
output = 15.0
cache_write = 3.75
cache_read = 0.3
context_window = {WINDOW}
max_output_tokens = {MAX_OUTPUT}
server_compaction = true

[models."{OPENAI_MODEL}"]
input = 1.0
output = 2.0
cache_write = 0
cache_read = 0
context_window = {WINDOW}
max_output_tokens = {MAX_OUTPUT}
""")
RESULT = "x" * 2048  # each tool result: 2 KB
TURN_ID = re.compile(r"toolu_long_(\d+)")


def count(request: LlmRequest) -> int:
    parts = [request.system, request.tools, request.messages]
    return math.ceil(len(json.dumps(parts, separators=(",", ":"), ensure_ascii=False)) / 4)


class LongLlm:
    """A stateless model for long runs: the turn is one more than the newest `toolu_long_N` it can see
    (in kept turns or in a summary); it asks for `fetch` until `turns`, then ends. A request with no tools
    (the engine's summarising call) gets a summary naming the newest call. Refuses what passes the window."""

    def __init__(self, turns: int, window: int | None = WINDOW) -> None:
        self.turns, self.window = turns, window
        self.seen: list[LlmRequest] = []
        self.sizes: list[int] = []
        self.summaries = 0
        self.crash_on_summary = 0  # crash (the worker dies) on this many summarising calls, first
        self.crash_after_summary = 0  # crash on this many model calls that follow a summary

    async def send(self, request: LlmRequest) -> LlmResponse:
        size = count(request)
        self.seen.append(request)
        self.sizes.append(size)
        if self.window is not None and size + request.max_tokens > self.window:
            raise LlmError(400, None, f"prompt is too long: {size} + {request.max_tokens} > {self.window}")
        text = json.dumps(request.messages)
        turn = max((int(n) + 1 for n in TURN_ID.findall(text)), default=0)
        usage = Usage(size, 20)
        if not request.tools:
            if self.crash_on_summary:
                self.crash_on_summary -= 1
                raise SimulatedCrash()
            self.summaries += 1
            return LlmResponse([{"type": "text", "text": f"Summary: the newest call is toolu_long_{turn - 1}."}],
                               "end_turn", usage, context_tokens=size)
        if self.crash_after_summary and "was summarised" in text:
            self.crash_after_summary -= 1
            raise SimulatedCrash()
        if turn >= self.turns:
            return LlmResponse([{"type": "text", "text": f"done after {turn} tool turns"}], "end_turn", usage,
                               context_tokens=size)
        use = {"type": "tool_use", "id": f"toolu_long_{turn}", "name": "fetch", "input": {"turn": turn}}
        return LlmResponse([use], "tool_use", usage, context_tokens=size)


@tool(name="fetch", description="fetches a page")
async def fetch(args: dict[str, Any], ctx: ToolContext) -> str:
    return RESULT


async def long_run(store: RunStore, strategy: str, turns: int, model: str = MODEL, **policy: Any) -> uuid.UUID:
    run, _ = await store.create(new_run("work through the pages", model=model, max_steps=10 * turns,
                                        token_budget=100_000_000, tools=("fetch",)))
    async with store.pool.connection() as db:
        await db.execute("UPDATE run SET context_management = %s WHERE id = %s",
                         (json.dumps({"strategy": strategy, **policy}), run.id))
    return run.id


async def drive(store: RunStore, llm: LongLlm, name: str = "worker-A") -> None:
    await worker(store, llm, [fetch], name, prices=PRICES).run_once()


@pytest.mark.parametrize("strategy", ["summarize", "clear_tool_results"])
async def test_a_long_run_stays_within_a_small_window(store: RunStore, strategy: str) -> None:
    llm = LongLlm(turns=60)
    run_id = await long_run(store, strategy, 60)
    await drive(store, llm)
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    assert run.output == "done after 60 tool turns"
    assert all(size + MAX_OUTPUT <= WINDOW for size in llm.sizes)
    steps = await store.steps(run_id)
    compact = [s for s in steps if s.kind is StepKind.COMPACT]
    assert compact, "a 60-turn run of 2 KB results cannot fit 16,000 tokens without compaction"
    assert len([s for s in steps if s.kind is StepKind.TOOL]) == 60  # nothing deleted: every original step kept
    request = json.loads(compact[0].request or "{}")
    assert request["strategy"] == strategy and request["window"] == WINDOW
    if strategy == "summarize":
        assert llm.summaries == len(compact)
        assert compact[0].input_tokens > 0 and compact[0].cost_usd is not None  # counted like a model step
    else:
        assert llm.summaries == 0 and "result of fetch cleared; kept in step" in json.dumps(llm.seen[-1].messages)


async def test_a_summary_keeps_the_recent_turns_and_each_tool_use_with_its_result(store: RunStore) -> None:
    llm = LongLlm(turns=40)
    run_id = await long_run(store, "summarize", 40, keepRecentTurns=3)
    await drive(store, llm)
    after = next(r for r in llm.seen if r.tools and "was summarised" in json.dumps(r.messages))
    assert after.messages[0]["role"] == "user" and "Summary:" in json.dumps(after.messages[0])
    assert after.stable_messages == 1  # a cache breakpoint goes after the summary
    kept = after.messages[1:]
    assert [m["role"] for m in kept[:2]] == ["assistant", "user"]
    assert sum(1 for m in kept if m["role"] == "assistant") == 3
    use = kept[0]["content"][0]
    assert use["type"] == "tool_use" and kept[1]["content"][0]["tool_use_id"] == use["id"]
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED


async def test_none_fails_before_sending_a_request_over_the_window(store: RunStore) -> None:
    llm = LongLlm(turns=60)
    run_id = await long_run(store, "none", 60)
    await drive(store, llm)
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error is not None and f"> {WINDOW} tokens" in run.error and "it was not sent" in run.error
    assert "strategy none" in run.error
    assert all(size + MAX_OUTPUT <= WINDOW for size in llm.sizes)  # the one over it was never sent


async def test_a_crash_during_the_summarising_call_resumes_with_one_summary(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    llm = LongLlm(turns=30)
    llm.crash_on_summary = 1
    run_id = await long_run(store, "summarize", 30)
    with pytest.raises(SimulatedCrash):
        await drive(store, llm)
    steps = await store.steps(run_id)
    assert not [s for s in steps if s.kind is StepKind.COMPACT]  # the call died with its worker: no trace
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))
    await drive(store, llm, "worker-B")
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    steps = await store.steps(run_id)
    compact = [s for s in steps if s.kind is StepKind.COMPACT]
    assert len(compact) == llm.summaries  # one COMPACT step per summary made: none lost, none made twice
    first = compact[0]
    assert steps[first.seq - 2].kind is StepKind.TOOL and steps[first.seq].kind is StepKind.MODEL


async def test_a_crash_after_the_summary_resumes_from_it_without_a_second_one(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    llm = LongLlm(turns=30)
    llm.crash_after_summary = 1
    run_id = await long_run(store, "summarize", 30)
    with pytest.raises(SimulatedCrash):
        await drive(store, llm)
    steps = await store.steps(run_id)
    assert [s.kind for s in steps][-1] is StepKind.COMPACT and llm.summaries == 1
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))
    await drive(store, llm, "worker-B")
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    steps = await store.steps(run_id)
    kinds = [s.kind for s in steps]
    first = kinds.index(StepKind.COMPACT)
    assert kinds[first + 1] is StepKind.MODEL  # the next holder went on from the summary: no second one
    assert len([k for k in kinds if k is StepKind.COMPACT]) == llm.summaries


async def test_summarize_works_on_an_openai_compatible_model_and_server_is_refused_there(store: RunStore) -> None:
    llm = LongLlm(turns=40)
    auto = await long_run(store, "auto", 40, model=OPENAI_MODEL)  # auto is summarize where nothing compacts
    await drive(store, llm)
    run = await store.get(auto)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    assert any(s.kind is StepKind.COMPACT for s in await store.steps(auto))
    server = await long_run(store, "server", 5, model=OPENAI_MODEL)
    await drive(store, llm)
    run = await store.get(server)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error is not None and "strategy server needs a provider that compacts" in run.error


async def test_server_strategy_sends_the_edits_and_replays_the_compaction_block_exactly(store: RunStore) -> None:
    block = {"type": "compaction", "content": "Summary: the newest call is toolu_long_0.",
             "encrypted_content": "opaque\u2028bytes", "signature": "sig=="}

    class Compacting(LongLlm):
        async def send(self, request: LlmRequest) -> LlmResponse:
            response = await super().send(request)
            if len(self.seen) == 2:  # the provider compacted this request: its block comes first
                return LlmResponse([block, *response.content], response.stop_reason, response.usage,
                                   context_tokens=100)
            return response

    llm = Compacting(turns=3)
    run_id = await long_run(store, "server", 3, triggerTokens=5000)
    await drive(store, llm)
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    assert llm.seen[0].server_context is not None and llm.seen[0].server_context.trigger == 5000
    sent_back = llm.seen[2].messages[3]["content"][0]
    assert json.dumps(sent_back, sort_keys=True) == json.dumps(block, sort_keys=True)
    steps = await store.steps(run_id)
    assert json.loads(steps[2].request or "{}")["context"]["compacted"] is True


async def test_auto_is_the_providers_compaction_only_where_the_model_has_it(store: RunStore) -> None:
    llm = LongLlm(turns=1)
    compacting = await long_run(store, "auto", 1)  # marked server_compaction in the price table
    await drive(store, llm)
    plain = await long_run(store, "auto", 1, model="claude-sonnet-4-5")  # a Messages API model without it
    sent = len(llm.seen)
    await worker(store, llm, [fetch], "worker-A", prices=PriceTable.load()).run_once()
    assert llm.seen[0].server_context is not None
    assert all(r.server_context is None for r in llm.seen[sent:])
    for run_id, strategy in ((compacting, "server"), (plain, "summarize")):
        steps = await store.steps(run_id)
        assert json.loads(steps[0].request or "{}")["context"]["strategy"] == strategy


async def test_a_turn_too_long_for_the_window_fails_the_run_with_the_reason(store: RunStore) -> None:
    @tool(name="fetch", description="fetches a page")
    async def huge(args: dict[str, Any], ctx: ToolContext) -> str:
        return "y" * (WINDOW * 4)  # one result larger than the window: no strategy can send it

    llm = LongLlm(turns=5)
    run_id = await long_run(store, "summarize", 5)
    await worker(store, llm, [huge], "worker-A", prices=PRICES).run_once()
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error is not None and "the newest turns alone are too long" in run.error
    assert all(size + MAX_OUTPUT <= WINDOW for size in llm.sizes)


async def test_each_model_step_says_which_compact_step_it_was_sent_after(store: RunStore) -> None:
    llm = LongLlm(turns=40)
    run_id = await long_run(store, "summarize", 40)
    await drive(store, llm)
    steps = await store.steps(run_id)
    compact = [s.seq for s in steps if s.kind is StepKind.COMPACT]
    after = {s.seq: json.loads(s.request or "{}")["context"].get("compactedAt") for s in steps if s.kind is StepKind.MODEL}
    assert after[min(after)] is None and after[compact[0] + 1] == compact[0]
    assert after[max(after)] == compact[-1]


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _summaries(request: LlmRequest) -> list[int]:
    """The indexes of the messages of `request` that are a summary."""
    return [i for i, m in enumerate(request.messages)
            if any(b.get("type") == "text" and "was summarised" in b.get("text", "") for b in _blocks(m))]


def assert_sendable(request: LlmRequest) -> None:
    """`request` as the Messages API takes it: a user message first, the roles alternating, every tool_result
    in the user message right after the assistant message with its tool_use (and every tool_use answered
    there), and at most one summary, the first message."""
    messages = request.messages
    roles = [m["role"] for m in messages]
    assert roles[:1] == ["user"] and all(a != b for a, b in zip(roles, roles[1:], strict=False)), roles
    assert _summaries(request) in ([], [0]), f"summaries at {_summaries(request)}"
    for i, m in enumerate(messages):
        uses = {b["id"] for b in _blocks(m) if b.get("type") == "tool_use"}
        results = {b["tool_use_id"] for b in _blocks(m) if b.get("type") == "tool_result"}
        if uses:
            assert i + 1 < len(messages), "a tool_use with no tool_result after it"
            assert {b.get("tool_use_id") for b in _blocks(messages[i + 1])} >= uses, f"unanswered tool_use at {i}"
        if results:
            before = {b["id"] for b in _blocks(messages[i - 1]) if b.get("type") == "tool_use"} if i else set()
            assert results <= before, f"tool_result(s) {sorted(results - before)} at {i} with no tool_use before"


async def test_a_second_summary_soon_after_the_first_replaces_it_and_the_turns_it_covers(store: RunStore) -> None:
    # Under this trigger the conversation passes it again two turns after a summary, while the newest
    # three turns still reach back before that summary: the second must cover the first, not sit beside it.
    llm = LongLlm(turns=40)
    run_id = await long_run(store, "summarize", 40, keepRecentTurns=3, triggerTokens=3000)
    await drive(store, llm)
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    sent = [r for r in llm.seen if r.tools]
    for request in sent:
        assert_sendable(request)
    steps = await store.steps(run_id)
    compact = [s.seq for s in steps if s.kind is StepKind.COMPACT]
    assert len(compact) >= 2 and llm.summaries == len(compact)
    for seq in compact:  # each leaves its summary and the newest three turns, and the model is called on them
        after = json.loads(steps[seq].request or "{}")
        assert steps[seq].kind is StepKind.MODEL and after["message_count"] == 1 + 2 * 3
    # A summary and its three turns are under the trigger, and so is one more turn: the conversation passes
    # it again two turns later. So one summarising call every two model turns, not one before every call.
    kinds = [s.kind for s in steps]
    between = [kinds[a:b].count(StepKind.MODEL) for a, b in zip(compact, compact[1:], strict=False)]
    assert between and set(between) == {2}, between


CONTINUED = 12  # tool turns of a compacted parent: compacted once, near its end, its last request well under
PARENT_POLICY = {"keepRecentTurns": 2, "triggerTokens": 5000}


async def compacted_and_continued(store: RunStore, strategy: str, llm: LongLlm) -> tuple[uuid.UUID, uuid.UUID]:
    """A run that compacted its conversation and succeeded, and a continuation of it (not run yet)."""
    parent = await long_run(store, strategy, CONTINUED, **PARENT_POLICY)
    await drive(store, llm)
    run = await store.get(parent)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    assert any(s.kind is StepKind.COMPACT for s in await store.steps(parent))
    child, _ = await store.create(new_run(
        "go on", model=MODEL, max_steps=100, token_budget=100_000_000, tools=("fetch",), continue_from=parent,
        context_management={"strategy": strategy, **PARENT_POLICY}))
    return parent, child.id


async def assert_seqs_name_the_same_steps(store: RunStore, parent: uuid.UUID, child: uuid.UUID) -> None:
    """Every seq an inherited step names (a COMPACT step's keepFromSeq, coversSeqs and cleared results, a
    MODEL step's compactedAt) is the seq, in the child, of the step it named in the parent."""
    theirs, ours = await store.steps(parent), await store.steps(child)
    shift = ours[0].kind is StepKind.USER and theirs[0].kind is not StepKind.USER  # the parent's input, copied in
    mine = {s.seq - shift: s for s in ours if s.inherited and s.seq > shift}

    def same(seq: int) -> None:
        assert (ours[seq + shift - 1].kind, ours[seq + shift - 1].response) == (
            theirs[seq - 1].kind, theirs[seq - 1].response)

    for step in theirs:
        if step.seq not in mine:
            continue  # past a fork's last step
        copy = mine[step.seq]
        if step.kind is StepKind.COMPACT:
            was, now = json.loads(step.request or "{}"), json.loads(copy.request or "{}")
            if was["keepFromSeq"] is not None:
                assert now["keepFromSeq"] == was["keepFromSeq"] + shift
                same(was["keepFromSeq"])
            assert now["coversSeqs"] == [s + shift for s in was["coversSeqs"]]
            if was["strategy"] == "clear_tool_results":
                cleared = json.loads(copy.response or "[]")
                assert [c["seq"] for c in cleared] == [c["seq"] + shift for c in json.loads(step.response or "[]")]
                for c in cleared:
                    assert ours[c["seq"] - 1].tool_use_id == c["toolUseId"]
        elif step.kind is StepKind.MODEL:
            was = json.loads(step.request or "{}")["context"].get("compactedAt")
            now = json.loads(copy.request or "{}")["context"].get("compactedAt")
            assert now == (was + shift if was is not None else None)


async def test_a_continuation_of_a_summarised_run_sends_the_summary_and_the_turns_it_kept(store: RunStore) -> None:
    llm = LongLlm(turns=CONTINUED)
    parent, child = await compacted_and_continued(store, "summarize", llm)
    last, summaries = llm.seen[-1], llm.summaries
    await drive(store, llm, "worker-B")
    run = await store.get(child)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    first = llm.seen[-1]
    assert_sendable(first)
    # What the parent's last call was sent, then its answer and the new input: no tool_result without its
    # tool_use, and no second summary (no summarising call either).
    answer = {"role": "assistant", "content": [{"type": "text", "text": f"done after {CONTINUED} tool turns"}]}
    assert first.messages == [*last.messages, answer, {"role": "user", "content": "go on"}]
    assert llm.summaries == summaries and first.stable_messages == 1
    await assert_seqs_name_the_same_steps(store, parent, child)
    # A fork of the continuation copies its steps as they are (no input is put in front): it sends the same.
    steps = await store.steps(child)
    fork, _ = await store.create(new_run("work through the pages", model=MODEL, max_steps=100,
                                         token_budget=100_000_000, tools=("fetch",), fork_from=(child, len(steps) - 1),
                                         context_management={"strategy": "summarize", **PARENT_POLICY}))
    await drive(store, llm, "worker-C")
    assert llm.seen[-1].messages == first.messages and llm.summaries == summaries
    await assert_seqs_name_the_same_steps(store, child, fork.id)


async def test_a_continuation_of_a_run_that_cleared_tool_results_clears_them_all(store: RunStore) -> None:
    llm = LongLlm(turns=CONTINUED)
    parent, child = await compacted_and_continued(store, "clear_tool_results", llm)
    last = llm.seen[-1]
    await drive(store, llm, "worker-B")
    run = await store.get(child)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    first = llm.seen[-1]
    assert_sendable(first)

    def results(request: LlmRequest) -> list[tuple[str, bool]]:  # each tool result: (its id, cleared)
        return [(b["tool_use_id"], "cleared; kept in step" in str(b["content"]))
                for m in request.messages for b in _blocks(m) if b.get("type") == "tool_result"]

    assert results(first) == results(last)  # the same results cleared as in the parent's last call, every one
    listed = [c for s in await store.steps(parent) if s.kind is StepKind.COMPACT for c in json.loads(s.response or "")]
    assert sum(cleared for _, cleared in results(first)) == len(listed) > 0
    await assert_seqs_name_the_same_steps(store, parent, child)
    steps = {s.seq: s for s in await store.steps(child)}
    for block in (b for m in first.messages for b in _blocks(m) if b.get("type") == "tool_result"):
        kept = TURN_ID.sub("", str(block["content"]))
        if "cleared" in kept:  # the placeholder names the continuation's step that keeps the result
            seq = int(re.findall(r"kept in step (\d+)", kept)[0])
            assert steps[seq].tool_use_id == block["tool_use_id"]


@pytest.mark.parametrize("strategy", ["summarize", "clear_tool_results"])
async def test_a_continuation_copied_with_its_parents_seqs_still_sends_a_valid_request(
    store: RunStore, db: psycopg.AsyncConnection[Any], strategy: str
) -> None:
    """A continuation made before copying moved the seqs its steps name holds the parent's: replay still
    keeps the turns the parent kept (no tool_result without its tool_use, every listed result cleared)."""
    llm = LongLlm(turns=CONTINUED)
    parent, child = await compacted_and_continued(store, strategy, llm)
    last = llm.seen[-1]
    await db.execute(
        """UPDATE run_step c SET request = p.request, response = p.response FROM run_step p
           WHERE c.run_id = %s AND p.run_id = %s AND c.seq = p.seq + 1 AND c.kind IN ('COMPACT', 'MODEL')""",
        (child, parent))
    await drive(store, llm, "worker-B")
    run = await store.get(child)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    first = llm.seen[-1]
    assert_sendable(first)
    assert len(first.messages) == len(last.messages) + 2
    for sent, before in zip(first.messages, last.messages, strict=False):
        assert sent["role"] == before["role"]
        assert [b.get("type") for b in _blocks(sent)] == [b.get("type") for b in _blocks(before)]
        assert ["cleared; kept in step" in str(b.get("content")) for b in _blocks(sent)] == [
            "cleared; kept in step" in str(b.get("content")) for b in _blocks(before)]


async def test_a_fork_of_a_compacted_run_sends_what_its_parent_sent_there(store: RunStore) -> None:
    """A fork copies its parent's first steps with their seqs (nothing put in front): the seqs they name
    stay as they are, and the fork's first call is the parent's at that point."""
    llm = LongLlm(turns=CONTINUED)
    parent = await long_run(store, "summarize", CONTINUED, **PARENT_POLICY)
    await drive(store, llm)
    steps = await store.steps(parent)
    assert any(s.kind is StepKind.COMPACT for s in steps)
    last = llm.seen[-1]
    fork, _ = await store.create(new_run("work through the pages", model=MODEL, max_steps=100,
                                         token_budget=100_000_000, tools=("fetch",), fork_from=(parent, len(steps) - 1),
                                         context_management={"strategy": "summarize", **PARENT_POLICY}))
    await drive(store, llm, "worker-B")
    assert llm.seen[-1].messages == last.messages
    copied = (await store.steps(fork.id))[: len(steps) - 1]
    assert [(s.request, s.response) for s in copied] == [(s.request, s.response) for s in steps[:-1]]


class PausingLlm:
    """Calls `fetch` once, then pauses its turn (`pause_turn`); sent its paused turn back, it goes on with it
    and ends. Sent no paused turn where it left one, it starts the turn over: it pauses again."""

    def __init__(self) -> None:
        self.seen: list[LlmRequest] = []

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.seen.append(request)
        usage = Usage(100, 20)
        if not request.tools:  # the summarising call
            return LlmResponse([{"type": "text", "text": "Summary: fetch was called once."}], "end_turn", usage)
        if request.messages[-1]["role"] == "assistant":
            return LlmResponse([{"type": "text", "text": "went on with the paused turn"}], "end_turn", usage)
        if "toolu_once" not in json.dumps(request.messages) and "Summary:" not in json.dumps(request.messages):
            return LlmResponse([{"type": "tool_use", "id": "toolu_once", "name": "fetch", "input": {}}], "tool_use",
                               usage)
        paused = [{"type": "server_tool_use", "id": f"srvtoolu_{len(self.seen)}", "name": "web_search", "input": {}}]
        return LlmResponse(paused, "pause_turn", usage)


async def test_a_paused_turn_is_sent_back_whole_even_when_the_conversation_is_compacted_right_after_it(
    store: RunStore,
) -> None:
    """Found by the lifecycle model (issue 44): with `keepRecentTurns: 0`, a compaction between a `pause_turn`
    stop and its continuation summarised the paused turn too; the model, not sent it back, started the turn
    over, paused again, and the run compacted and paused until its step cap."""
    llm = PausingLlm()
    run_id = await long_run(store, "summarize", 3, triggerTokens=1, keepRecentTurns=0)
    await drive(store, llm)
    run = await store.get(run_id)
    assert run is not None and run.status is RunStatus.SUCCEEDED, run.error
    assert run.output == "went on with the paused turn"
    steps = await store.steps(run_id)
    assert [s.stop_reason for s in steps if s.kind is StepKind.MODEL] == ["tool_use", "pause_turn", "end_turn"]
    after = llm.seen[-1]
    assert after.messages[-1]["role"] == "assistant" and after.messages[-1]["content"][0]["type"] == "server_tool_use"
