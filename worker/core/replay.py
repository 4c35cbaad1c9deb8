"""Replay: the conversation rebuilt from a run's input and its ordered steps. Pure, no I/O.

The step log is the single source of truth. A worker replays it in full when it claims a run and then
applies each step it writes, so continuing and resuming are the same code path and a long run costs
the same per step at step 500 as at step 5.

Model output is untrusted input. Each model turn is checked as it is applied (`Conversation.refused`
says why it cannot be acted on), so a worker that resumes a run refuses exactly what the live one did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import orjson

from agentrun.worker.core import context
from agentrun.worker.core.answer import FINAL_ANSWER
from agentrun.worker.core.records import Step, StepKind, StepStatus
from agentrun.worker.core.types import Block, Message

CORRECTION = "correction"
"""The `request` of a USER step the engine wrote to correct a structured answer (not a person's input)."""

MESSAGE = "message"
"""The `request` of a USER step that delivered a message posted to the run while it worked
(POST /api/runs/{id}/messages); its `created_by` says who sent it."""

STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded",
     "compaction"}
)
CONTINUES = frozenset({"tool_use", "pause_turn", "compaction"})
"""Stop reasons after which the run goes on: with the tools the model asked for, or with the paused turn
(a turn paused by the model's server tools, or after the provider compacted the conversation)."""
PAUSES = frozenset({"pause_turn", "compaction"})

# Content block types of Messages API responses: the model's own and those of server tools (which is
# where a `pause_turn` comes from). Anything else is not something this engine can send back.
BLOCK_TYPES = frozenset({
    "text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "web_search_tool_result",
    "web_fetch_tool_result", "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result", "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result",
    "container_upload", "compaction",
})

# What orjson (the step log's JSON codec) can write: a signed or unsigned 64-bit integer.
MIN_INT, MAX_INT = -(2**63), 2**64 - 1
MAX_DEPTH = 128
"""Deepest nesting of a block accepted: orjson writes at most 255 levels, and no tool input needs 128."""
_LONG_NUMBER = re.compile(r"\d{19}")
# Every ASCII digit as "0", every other byte as " ": a run of 19 digits is then a plain substring search,
# a fraction of orjson's own parse (a regex scan costs several times the parse).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_DIGIT_RUN = b"0" * 19
_MAX_SHOWN = 80  # characters of a model-chosen value quoted in a reason


def dump_content(content: Any) -> str:
    """Model content as step-log JSON. orjson refuses integers beyond 64 bits: those are written
    exactly by the standard library instead, so the turn is stored as it came and refused on replay."""
    try:
        return orjson.dumps(content).decode()
    except TypeError:
        return json.dumps(content, ensure_ascii=False)


BLOCKS_MARK = "\ufffe"
"""How a TOOL step's `response` that holds content blocks (an MCP tool's image) begins: U+FFFE, a
noncharacter no text a tool returns starts with (ToolBox replaces it in a plain output), followed by the
blocks as JSON. Any other response is the tool_result's text, so step logs written before blocks existed
replay as they did."""


def dump_tool_blocks(blocks: list[Block]) -> str:
    return BLOCKS_MARK + dump_content(blocks)


def tool_result_content(response: str | None) -> str | list[Block]:
    """The `content` of a tool_result for a TOOL step's response: its text, or its content blocks."""
    if response is None:
        return ""
    if response.startswith(BLOCKS_MARK):
        try:
            blocks = load_content(response[len(BLOCKS_MARK):])
        except ValueError:
            return response  # not blocks after all: sent as the text it is
        if isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks):
            return blocks
    return response


def load_content(text: str) -> Any:
    """The inverse of `dump_content`. orjson reads integers beyond 64 bits as floats, which would hide
    them: text with a long digit run is read exactly by the standard library."""
    if _LONG_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # nested deeper than orjson reads, say
    return json.loads(text)


def exact_json(data: bytes | str) -> Any:
    """JSON from outside (a model's answer) with every number as it was written. orjson reads an integer
    beyond 64 bits as a float (2**70 would reach a tool as 1.18e21, and `_value_problem` would never see
    it): data with a run of 19 digits or more, the shortest that can be such an integer, is read by the
    standard library instead, which keeps it exact. Anything else is orjson's alone: the common path
    pays one translate and search of the bytes (about a quarter of orjson's parse of an answer).
    Raises orjson.JSONDecodeError (a ValueError) if it is not JSON."""
    raw = data if isinstance(data, bytes) else data.encode(errors="surrogatepass")
    if _DIGIT_RUN not in raw.translate(_DIGITS_ONLY):
        return orjson.loads(data)
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError too
        raise orjson.JSONDecodeError(str(e), data if isinstance(data, str) else data.decode(errors="replace"), 0) from e


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON, and orjson refuses them: so does the exact reading."""
    raise ValueError(f"{name} is not a JSON value")


class Conversation:
    """Messages for the next model call, the tool calls still owed, and whether the run is finished."""

    def __init__(self, input: str) -> None:
        self.messages: list[Message] = [{"role": "user", "content": input}]
        self.pending: dict[str, Block] = {}  # tool_use id → block, in the order the model asked
        self.started: set[str] = set()  # pending tool_use ids with a STARTED row: executed before, outcome unknown
        self.attempts: dict[str, int] = {}  # of each of those: the executions its row counts (Step.attempts)
        self._results: list[Block] = []  # tool_result blocks of the current turn, not yet flushed
        self._results_seq = 0  # the seq of the first of them
        self._used: set[str] = set()  # every tool_use id the model has used, in any turn
        self.last_stop: str | None = None
        self.refused: str | None = None
        """Why the last model turn cannot be acted on (the run fails with it), or None."""
        self.ignored_tool_uses = 0
        """Tool calls in the last model turn that are not run because it stopped for another reason."""
        self.steps = 0  # the highest seq applied
        self.model_steps = 0
        self.rejected_answers = 0  # structured answers refused (a final_answer that did not validate, or none)
        self.origins: list[int] = [0]
        """The seq of the step each message began with (0: the run's input), for COMPACT steps to name a point."""
        self.results: dict[str, tuple[int, str]] = {}  # tool_use id → (seq, tool) of the step holding its result
        self.stable = 0  # leading messages every later request sends unchanged (a summary)
        self.cleared: set[str] = set()  # tool_use ids whose results a COMPACT step cleared
        self.compacted_at: int | None = None  # the seq of the newest COMPACT step applied
        self._last_model: tuple[str | None, int] | None = None  # the newest MODEL step's request and output tokens
        self._counted = 0  # messages the newest MODEL step's request and answer hold (or a COMPACT step left)
        self._after_compact: int | None = None  # the newest COMPACT step's estimate of what it left

    @classmethod
    def replay(cls, input: str, steps: Iterable[Step]) -> Conversation:
        """The run's conversation. One continued from another begins with a USER step (its parent's
        opening message, inherited), and then `input` is a USER step of its own, further on."""
        c = cls(input)
        for i, s in enumerate(steps):
            if i == 0 and s.kind is StepKind.USER and s.request != MESSAGE:
                c.messages, c.origins = [], []
            c.apply(s)
        return c

    @property
    def finished(self) -> bool:
        """The model stopped for a reason other than asking for tools or pausing, and nothing is owed."""
        return self.last_stop is not None and self.last_stop not in CONTINUES and not self.pending

    @property
    def final_text(self) -> str:
        """The text blocks of the newest assistant message, joined: a finished run's answer."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                content = message["content"]
                if isinstance(content, str):
                    return content
                return "".join(
                    str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
                )
        return ""

    @property
    def at_boundary(self) -> bool:
        """Between two turns, where a message posted to the run may go: nothing owed for the model's turn,
        and the turn not paused (after a `pause_turn` or a `compaction` stop the next call sends it back for
        the model to go on with, and a user message there would end it half done)."""
        return not self.pending and self.last_stop not in PAUSES

    @property
    def next_tool_use(self) -> Block | None:
        return next(iter(self.pending.values()), None)

    @property
    def owed(self) -> int:
        """Tool steps still to be written for the current turn (a STARTED one already has its row)."""
        return len(self.pending) - len(self.started)

    def acted_on(self, content: str, stop_reason: str | None) -> list[Block]:
        """The tool calls a model turn with this content (as its MODEL step holds it) and stop reason would
        leave owed, were it applied now: none when it stops for another reason or would be refused."""
        if stop_reason != "tool_use":
            return []
        blocks = load_content(content)
        if problem(blocks, stop_reason, self._used) is not None:
            return []
        return [b for b in blocks if b.get("type") == "tool_use"]

    def apply(self, step: Step) -> None:
        self.steps = max(self.steps, step.seq)
        if step.kind is StepKind.USER:
            if step.request == CORRECTION:
                self.rejected_answers += 1
            self._flush()
            if step.request == MESSAGE and self.messages and self.messages[-1]["role"] == "user":
                # A message delivered right after the tool results of a turn (or after the input, or another
                # message) joins that user turn: the roles alternate, as the Messages API wants them.
                self.messages[-1] = {"role": "user", "content": [
                    *_blocks(self.messages[-1]["content"]), {"type": "text", "text": step.response or ""}]}
            else:
                self._append({"role": "user", "content": step.response or ""}, step.seq)
            self.last_stop = None
            self.refused = None
            self.pending = {}
            self.started.clear()
        elif step.kind is StepKind.MODEL:
            self._apply_model(step)
        elif step.kind is StepKind.COMPACT:
            self._apply_compact(step)
        elif step.status is StepStatus.STARTED:
            if step.tool_use_id in self.pending:
                self.started.add(step.tool_use_id)
                self.attempts[step.tool_use_id] = step.attempts
        elif step.tool_use_id in self.pending:
            self.results[step.tool_use_id] = (step.seq, step.tool_name or "?")
            del self.pending[step.tool_use_id]
            self.started.discard(step.tool_use_id)
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": step.tool_use_id,
                "content": tool_result_content(step.response),
            }
            if step.status is StepStatus.ERROR:
                result["is_error"] = True
                if step.tool_name == FINAL_ANSWER:
                    self.rejected_answers += 1
            if not self._results:
                self._results_seq = step.seq
            self._results.append(result)
            if not self.pending:
                self._flush()

    def _apply_model(self, step: Step) -> None:
        self._flush()
        content = load_content(step.response or "[]")
        stop = step.stop_reason
        self.refused = problem(content, stop, self._used)
        blocks: list[Block] = content if isinstance(content, list) else []
        if self.last_stop in PAUSES and self.messages[-1]["role"] == "assistant":
            # The paused turn was sent back as it was and the model went on with it: one assistant turn.
            self.messages[-1] = {"role": "assistant", "content": [*self.messages[-1]["content"], *blocks]}
        else:
            self._append({"role": "assistant", "content": blocks}, step.seq)
        self._last_model, self._counted = (step.request, step.output_tokens), len(self.messages)
        self._after_compact = None
        self.model_steps += 1
        self.last_stop = stop
        uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        self._used.update(b["id"] for b in uses if isinstance(b.get("id"), str))
        # Only a turn that stopped to use tools is acted on: a reply cut off at max_tokens may end in a
        # half-written call, and a refused turn is not acted on at all.
        acted_on = stop == "tool_use" and self.refused is None
        self.pending = {b["id"]: b for b in uses} if acted_on else {}
        self.ignored_tool_uses = 0 if acted_on else len(uses)
        self.started.clear()

    def _flush(self) -> None:
        """All tool_result blocks of one turn go into ONE user message, as the API requires."""
        if self._results:
            self._append({"role": "user", "content": self._results}, self._results_seq)
            self._results = []

    def _append(self, message: Message, seq: int) -> None:
        self.messages.append(message)
        self.origins.append(seq)

    # Context management (core/context.py): what a request would take, and the COMPACT steps replayed.

    def estimate(self, system: str | None, tools: list[dict[str, Any]]) -> int:
        """Input tokens the next request would take: the provider's count of the newest model call's input
        and its answer, plus an estimate of the messages added since; an estimate of all of it when there
        is no such count (no model call yet, a client that does not count, a COMPACT step since)."""
        base = self._provider_count()
        if base is not None:
            return base + context.estimate_tokens(self.messages[self._counted:])
        return context.estimate_tokens([system, tools, self.messages])

    def _provider_count(self) -> int | None:
        if self._last_model is None:
            return self._after_compact
        request, output_tokens = self._last_model
        try:
            summary = orjson.loads(request) if request else None
        except orjson.JSONDecodeError:
            return None
        counted = summary.get("context", {}).get("contextTokens") if isinstance(summary, dict) else None
        if not isinstance(counted, int) or isinstance(counted, bool) or counted <= 0:
            return None
        return counted + output_tokens

    def cut(self, keep_turns: int) -> int | None:
        """Where the kept turns begin (an index of `messages`: an assistant message, or the end) when the
        newest `keep_turns` turns are kept; None if that leaves nothing before it worth compacting (no
        model turn after the run's input or the last summary). A turn is an assistant message and the user
        message after it, so a tool_use is never parted from its tool_result. A paused turn (the newest, after
        a `pause_turn` or `compaction` stop) is always kept: it is sent back for the model to go on with."""
        turns = [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]
        if keep_turns == 0:
            paused = self.last_stop in PAUSES and bool(turns) and turns[-1] == len(self.messages) - 1
            at = turns[-1] if paused else len(self.messages)
        elif len(turns) <= keep_turns:
            return None
        else:
            at = turns[-keep_turns]
        return at if any(self.stable <= i < at for i in turns) else None

    def uncleared(self, at: int) -> list[dict[str, Any]]:
        """The tool results before messages[at] not cleared yet: [{"toolUseId", "tool", "seq"}]."""
        found = []
        for message in self.messages[:at]:
            for block in _blocks(message["content"]) if message["role"] == "user" else []:
                use = block.get("tool_use_id")
                if block.get("type") == "tool_result" and use in self.results and use not in self.cleared:
                    seq, tool = self.results[use]
                    found.append({"toolUseId": use, "tool": tool, "seq": seq})
        return found

    def compacted(self, step: Step) -> list[Message]:
        """The messages as `step` (a COMPACT step not applied yet) would leave them: for its estimate."""
        saved = (self.messages, self.origins, self.stable, set(self.cleared), self.compacted_at, self._last_model,
                 self._counted, self._after_compact)
        try:
            self._apply_compact(step)
            return self.messages
        finally:
            (self.messages, self.origins, self.stable, self.cleared, self.compacted_at, self._last_model,
             self._counted, self._after_compact) = saved

    def _apply_compact(self, step: Step) -> None:
        self._flush()
        try:
            request = orjson.loads(step.request or "{}")
        except orjson.JSONDecodeError:
            request = {}
        request = request if isinstance(request, dict) else {}
        after = request.get("estimatedAfter")
        keep_from = request.get("keepFromSeq")
        # The kept turns begin with an assistant message (`cut`): the first one at or past keepFromSeq. Not an
        # earlier summary, a user message whose origin is its own COMPACT step, later than the turns it kept
        # (a later summary covers them too). Nor the tool results before the kept turns in a continuation
        # copied before the copy moved the seqs its steps name (store/submit.py): there keepFromSeq, one
        # short, names those results.
        at = next((i for i, seq in enumerate(self.origins) if self.messages[i]["role"] == "assistant"
                   and isinstance(keep_from, int) and seq >= keep_from), len(self.messages))
        if request.get("strategy") == "clear_tool_results":
            try:
                listed = orjson.loads(step.response or "[]")
            except orjson.JSONDecodeError:
                listed = []
            gone = {c["toolUseId"]: c for c in listed if isinstance(c, dict) and isinstance(c.get("toolUseId"), str)}
            self.cleared.update(gone)
            for i in range(at):
                message = self.messages[i]
                if message["role"] == "user" and isinstance(message["content"], list):
                    self.messages[i] = {**message, "content": [_cleared(b, gone) for b in message["content"]]}
        else:
            self.messages = [context.summary_message(step.response or ""), *self.messages[at:]]
            self.origins = [step.seq, *self.origins[at:]]
            self.stable = 1
        self.compacted_at = step.seq
        # What the provider counted is gone: until the next call, the step's own estimate of what it left.
        self._last_model, self._counted = None, len(self.messages)
        self._after_compact = after if isinstance(after, int) and not isinstance(after, bool) and after > 0 else None


def _cleared(block: Block, gone: dict[str, dict[str, Any]]) -> Block:
    """A tool_result block with its content replaced by a placeholder, if it is one of those cleared."""
    use = block.get("tool_use_id")
    if block.get("type") != "tool_result" or use not in gone:
        return block
    c = gone[use]
    seq = c.get("seq")
    return {**block, "content": context.cleared(str(c.get("tool", "?")), seq if isinstance(seq, int) else 0)}


def _blocks(content: Any) -> list[Block]:
    """A message's content as a list of blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def problem(content: Any, stop_reason: str | None, used: set[str]) -> str | None:
    """Why a model turn cannot be acted on, naming the problem; None if it can be.

    `used` holds the tool_use ids of earlier turns: an id names one call for the whole run (it is the
    call's idempotency key), so a reused one would mix up two calls.
    """
    if stop_reason not in STOP_REASONS:
        return f"the model's response has an unknown stop_reason {_shown(stop_reason)}"
    if not isinstance(content, list):
        return "the model's content is not a list of blocks"
    if not content:
        return f"the model's response has no content blocks (stop_reason {stop_reason})"
    ids: set[str] = set()
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not block:
            return f"content block {i} of the model's response is empty"
        kind = block.get("type")
        if not isinstance(kind, str) or not kind:
            return f"content block {i} of the model's response has no type"
        if kind not in BLOCK_TYPES:
            return f"content block {i} of the model's response has an unknown type {_shown(kind)}"
        value_problem = _value_problem(block)
        if value_problem is not None:
            return f"content block {i} ({kind}) of the model's response {value_problem}"
        if kind == "text" and not isinstance(block.get("text"), str):
            return f"content block {i} (text) of the model's response has no text"
        if kind == "text" and not block["text"] and stop_reason in CONTINUES:
            return f"content block {i} of the model's response is an empty text block, which cannot be sent back"
        if kind == "tool_use":
            found = _tool_use_problem(i, block, ids, used)
            if found is not None:
                return found
    if stop_reason == "tool_use" and not ids:
        return "the model stopped to use a tool (stop_reason tool_use) but asked for none"
    if ids and stop_reason in ("end_turn", "stop_sequence", "pause_turn"):
        return f"the model asked for tools but its turn ended with stop_reason {stop_reason}; they were not run"
    return None


def _tool_use_problem(i: int, block: Block, ids: set[str], used: set[str]) -> str | None:
    use_id, name = block.get("id"), block.get("name")
    if not isinstance(use_id, str) or not use_id:
        return f"tool_use block {i} of the model's response has no id string"
    if not isinstance(name, str) or not name:
        return f"tool_use {_shown(use_id)} of the model's response has no name string"
    if not isinstance(block.get("input"), dict):
        return f"tool_use {_shown(use_id)} ({_shown(name)}) has an input that is not a JSON object"
    if use_id in ids:
        return f"the model used tool_use id {_shown(use_id)} twice in one turn"
    if use_id in used:
        return f"the model reused tool_use id {_shown(use_id)} from an earlier turn"
    ids.add(use_id)
    return None


def _value_problem(value: Any) -> str | None:
    """What in a JSON value the step log could not hold or replay exactly, or None. Walked without
    recursion: the nesting is the model's to choose."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested deeper than {MAX_DEPTH} levels"
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not MIN_INT <= v <= MAX_INT:
                return "holds an integer beyond 64 bits"
        elif isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
    return None


def _shown(value: Any) -> str:
    """A model-chosen value quoted in a reason, cut short: a reason is read by people and stored."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"
