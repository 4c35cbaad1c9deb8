"""Replay is a pure function of the input and the ordered steps."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.worker.core.records import Step, StepKind, StepStatus
from agentrun.worker.core.replay import CORRECTION, Conversation, dump_content

RUN = uuid.uuid4()


def model(seq: int, blocks: list[dict[str, Any]], stop: str) -> Step:
    return Step(RUN, seq, StepKind.MODEL, StepStatus.DONE, response=json.dumps(blocks), stop_reason=stop)


def tool(seq: int, use_id: str, status: StepStatus = StepStatus.DONE, out: str = "ok") -> Step:
    return Step(RUN, seq, StepKind.TOOL, status, tool_name="t", tool_use_id=use_id, response=out)


def user(seq: int, text: str, request: str | None = None) -> Step:
    return Step(RUN, seq, StepKind.USER, StepStatus.DONE, request=request, response=text)


def use(id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": "t", "input": {}}


def test_empty_log_asks_the_model() -> None:
    c = Conversation.replay("hi", [])
    assert c.messages == [{"role": "user", "content": "hi"}]
    assert not c.pending and not c.finished


def test_tool_turn_then_answer() -> None:
    c = Conversation.replay("q", [model(1, [use("a")], "tool_use"), tool(2, "a"), model(3, [{"type": "text", "text": "x"}], "end_turn")])
    assert [m["role"] for m in c.messages] == ["user", "assistant", "user", "assistant"]
    assert c.messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}]
    assert c.finished and not c.pending


def test_started_tool_is_still_pending_and_marked() -> None:
    c = Conversation.replay("q", [model(1, [use("a")], "tool_use"), tool(2, "a", StepStatus.STARTED)])
    assert list(c.pending) == ["a"]
    assert c.started == {"a"}
    assert len(c.messages) == 2  # nothing flushed for an unfinished turn


def test_parallel_results_are_one_message_flushed_when_all_are_in() -> None:
    steps = [model(1, [{"type": "text", "text": "two"}, use("a"), use("b")], "tool_use"), tool(2, "a")]
    c = Conversation.replay("q", steps)
    assert list(c.pending) == ["b"] and len(c.messages) == 2
    c.apply(tool(3, "b", StepStatus.ERROR, "boom"))
    assert len(c.messages) == 3
    assert c.messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "ok"},
        {"type": "tool_result", "tool_use_id": "b", "content": "boom", "is_error": True},
    ]


def test_assistant_content_is_kept_verbatim() -> None:
    blocks = [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "ü"}, use("z")]
    c = Conversation.replay("q", [model(1, blocks, "tool_use")])
    assert c.messages[1]["content"] == blocks


def test_incremental_apply_equals_full_replay() -> None:
    steps = [model(1, [use("a"), use("b")], "tool_use"), tool(2, "a"), tool(3, "b"), model(4, [use("c")], "tool_use"), tool(5, "c")]
    inc = Conversation("q")
    for s in steps:
        inc.apply(s)
    full = Conversation.replay("q", steps)
    assert inc.messages == full.messages and inc.pending == full.pending and inc.steps == full.steps == 5


@st.composite
def step_logs(draw: st.DrawFn) -> list[Step]:
    """Logs as an engine writes them: model turns, then each tool of the turn (maybe with a crash
    leaving a STARTED row, maybe ending the log mid-turn, as a run parked for a decision does); a
    continued run opens with its parent's first message as a USER step and goes on after an answer
    with the next USER step; a corrected structured answer adds a USER step too."""
    steps: list[Step] = []
    seq = 0
    if draw(st.booleans()):
        seq += 1
        steps.append(user(seq, "the parent's first message"))
    for turn in range(draw(st.integers(0, 5))):
        for p in range(draw(st.integers(0, 2))):  # a server tool pausing the turn, which then goes on
            seq += 1
            paused = [{"type": "server_tool_use", "id": f"s{turn}_{p}", "name": "web_search", "input": {}}]
            steps.append(model(seq, paused, "pause_turn"))
            if draw(st.integers(0, 5)) == 0:
                return steps
        n = draw(st.integers(0, 3))
        ids = [f"t{turn}_{i}" for i in range(n)]
        blocks = ([{"type": "text", "text": "t"}] if draw(st.booleans()) else []) + [use(i) for i in ids]
        seq += 1
        steps.append(model(seq, blocks or [{"type": "text", "text": "."}], "tool_use" if ids else "end_turn"))
        if not ids:
            if draw(st.booleans()):
                return steps
            seq += 1  # continued (or corrected): the next user message, and the conversation goes on
            steps.append(user(seq, "and then?", request=draw(st.sampled_from([None, CORRECTION]))))
            continue
        for i in ids:
            if draw(st.integers(0, 9)) == 0:
                seq += 1
                steps.append(tool(seq, i, StepStatus.STARTED))
                return steps
            if draw(st.integers(0, 12)) == 0:
                return steps  # parked: the rest of the turn waits for a person
            seq += 1
            steps.append(tool(seq, i, draw(st.sampled_from([StepStatus.DONE, StepStatus.ERROR]))))
    return steps


@settings(max_examples=300, deadline=None)
@given(step_logs())
def test_replayed_messages_alternate_and_answer_every_tool_use_once(steps: list[Step]) -> None:
    c = Conversation.replay("input", steps)
    roles = [m["role"] for m in c.messages]
    assert roles[0] == "user"
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False)), roles
    for i, m in enumerate(c.messages):
        if m["role"] != "assistant":
            continue
        uses = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
        if not uses:
            continue
        if i + 1 == len(c.messages):
            assert list(c.pending) == [u for u in uses if u in c.pending]  # the open turn: owed in order
            continue
        answered = [b["tool_use_id"] for b in c.messages[i + 1]["content"] if b["type"] == "tool_result"]
        assert sorted(answered) == sorted(uses)
        assert len(answered) == len(set(answered))
    assert not (c.finished and c.pending)
    # Every model step's blocks are sent back, in order; a paused turn is continued as one assistant turn.
    sent = [b for m in c.messages if m["role"] == "assistant" for b in m["content"]]
    assert sent == [b for s in steps if s.kind is StepKind.MODEL for b in json.loads(s.response or "[]")]
    if c.last_stop == "pause_turn":
        assert c.messages[-1]["role"] == "assistant" and not c.pending and not c.finished  # the model goes on
    assert c.refused is None
    assert c.rejected_answers == sum(1 for s in steps if s.kind is StepKind.USER and s.request == CORRECTION)
    inc = Conversation.replay("input", steps[:1])
    for s in steps[1:]:
        inc.apply(s)
    assert inc.messages == c.messages and inc.pending == c.pending


def test_pause_turn_is_continued_and_the_continuation_joins_the_paused_turn() -> None:
    paused = [{"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}]
    c = Conversation.replay("q", [model(1, paused, "pause_turn")])
    assert not c.finished and not c.pending and c.messages[-1] == {"role": "assistant", "content": paused}
    c.apply(model(2, [use("a")], "tool_use"))
    assert c.messages[1:] == [{"role": "assistant", "content": [*paused, use("a")]}] and list(c.pending) == ["a"]


def test_tool_calls_of_a_reply_cut_off_at_max_tokens_are_not_owed() -> None:
    c = Conversation.replay("q", [model(1, [use("a")], "max_tokens")])
    assert c.finished and not c.pending and c.ignored_tool_uses == 1 and c.refused is None


def test_integers_beyond_64_bits_survive_the_step_log_exactly() -> None:
    content = [use("a") | {"input": {"n": 2**70, "m": -(2**63) - 1, "s": "1234567890123456789012"}}]
    c = Conversation.replay("q", [Step(RUN, 1, StepKind.MODEL, StepStatus.DONE, response=dump_content(content),
                                       stop_reason="tool_use")])
    assert c.messages[1]["content"] == content and not c.pending
    assert c.refused == "content block 0 (tool_use) of the model's response holds an integer beyond 64 bits"


def test_a_continued_conversation_opens_with_the_parents_message_and_goes_on() -> None:
    c = Conversation.replay("next question", [user(1, "first question"), model(2, [{"type": "text", "text": "a"}],
                                              "end_turn"), user(3, "next question")])
    assert [m["role"] for m in c.messages] == ["user", "assistant", "user"]
    assert c.messages[0]["content"] == "first question" and not c.finished and c.final_text == "a"


def compact(seq: int, keep_from: int | None, summary: str) -> Step:
    request = json.dumps({"strategy": "summarize", "keepFromSeq": keep_from})
    return Step(RUN, seq, StepKind.COMPACT, StepStatus.DONE, request=request, response=summary)


def test_a_second_summary_covers_the_first_and_the_turns_it_kept_that_it_does_not_keep() -> None:
    turns = [s for n in range(3) for s in (model(1 + 2 * n, [use(f"a{n}")], "tool_use"), tool(2 + 2 * n, f"a{n}"))]
    # The first keeps the turns of steps 3-6; the second, one turn later, keeps those of steps 5-9 only.
    steps = [*turns, compact(7, 3, "first"), model(8, [use("a3")], "tool_use"), tool(9, "a3"), compact(10, 5, "second")]
    c = Conversation.replay("q", steps)
    assert [m["role"] for m in c.messages] == ["user", "assistant", "user", "assistant", "user"]
    assert "second" in c.messages[0]["content"][0]["text"] and "first" not in json.dumps(c.messages)
    assert [m["content"][0]["id"] for m in c.messages[1::2]] == ["a2", "a3"]
    assert c.origins == [10, 5, 6, 8, 9] and c.stable == 1
