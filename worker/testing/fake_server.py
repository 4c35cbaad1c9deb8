"""A small local server speaking the Messages API (`POST /v1/messages`), for tests, the demo and benchmarks.

It serves the same API at Bedrock's and Vertex's paths too, for their SDK clients (`FakeAnthropic`);
`FakeApi` is the scripted server under it and under the Chat Completions one (fake_openai_server.py).

Point the real SDK at it with ANTHROPIC_BASE_URL. It answers from a queue of scripted replies
(model turns, or faults such as 429 with retry-after, 529, 500, 400 and slow answers), else from a
responder: by default a stateless agent that asks for one tool, then summarises its result. It checks
requests the way the real API does where it matters (tool_result pairing, at most 4 cache breakpoints)
and logs every JSON body it received. Run it alone with
`python -m agentrun.worker.testing.fake_server --port 8088`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import re
import signal
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from aiohttp import web
from multidict import CIMultiDict

Json = dict[str, Any]
MAX_CACHE_BREAKPOINTS = 4
DISCONNECT = 0  # the status of a reply that drops the connection instead of answering


@dataclasses.dataclass(frozen=True)
class Reply:
    """One HTTP answer: a status, a JSON body and headers, sent after `delay` seconds.

    A success body may leave out `id` and `model`; the server fills them in from the request.
    """

    status: int = 200
    body: Json = dataclasses.field(default_factory=dict)
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    delay: float = 0.0
    chunk_delay: float = 0.0
    """When the request asks for a stream: seconds between the text fragments, so a watcher sees it grow."""

    @classmethod
    def message(cls, content: list[Json], stop_reason: str, usage: Mapping[str, int] | None = None) -> Reply:
        return cls(body={
            "type": "message", "role": "assistant", "content": content, "stop_reason": stop_reason,
            "stop_sequence": None, "usage": {**usage_of(10, 5), **(usage or {})},
        })

    @classmethod
    def tool_use(
        cls, name: str, input: Json | None = None, id: str | None = None, usage: Mapping[str, int] | None = None
    ) -> Reply:
        block = {"type": "tool_use", "id": id or f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": input or {}}
        return cls.message([block], "tool_use", usage)

    @classmethod
    def text(cls, text: str, usage: Mapping[str, int] | None = None) -> Reply:
        return cls.message([{"type": "text", "text": text}], "end_turn", usage)

    @classmethod
    def error(cls, status: int, message: str, type: str = "api_error", retry_after: float | None = None) -> Reply:
        headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
        body = {"type": "error", "error": {"type": type, "message": message}}
        return cls(status=status, body=body, headers=headers)

    @classmethod
    def rate_limited(cls, retry_after: float | None = None) -> Reply:
        return cls.error(429, "Number of request tokens has exceeded your rate limit.", "rate_limit_error", retry_after)

    @classmethod
    def overloaded(cls) -> Reply:
        return cls.error(529, "Overloaded", "overloaded_error")

    @classmethod
    def server_error(cls) -> Reply:
        return cls.error(500, "Internal server error", "api_error")

    @classmethod
    def bad_request(cls, message: str) -> Reply:
        return cls.error(400, message, "invalid_request_error")

    @classmethod
    def disconnect(cls) -> Reply:
        """No answer at all: the connection is dropped (an I/O error for the client)."""
        return cls(status=DISCONNECT)

    def after(self, seconds: float) -> Reply:
        """The same reply, sent `seconds` later (longer than the client's attempt limit, say)."""
        return dataclasses.replace(self, delay=seconds)

    def streamed_slowly(self, seconds_per_chunk: float) -> Reply:
        """The same reply whose streamed text fragments come `seconds_per_chunk` apart."""
        return dataclasses.replace(self, chunk_delay=seconds_per_chunk)


def usage_of(input: int, output: int, cache_write: int = 0, cache_read: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input, "output_tokens": output,
        "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read,
    }


def token_count(value: Any) -> int:
    """A rough token count (four characters a token), enough for believable usage numbers."""
    return max(1, len(json.dumps(value)) // 4)


def count_tokens(body: Json) -> int:
    """The input a request is charged, as this server counts it: four characters of its JSON (without the
    spaces a JSON encoder may add) a token."""
    parts = [body.get("system"), body.get("tools"), body.get("messages")]
    return math.ceil(len(json.dumps(parts, separators=(",", ":"), ensure_ascii=False)) / 4)


LONG_ID = re.compile(r"(?:toolu|call)_long_(\d+)")


def long_turn(body: Json) -> int:
    """One more than the newest `toolu_long_N` (or `call_long_N`) anywhere in the request, 0 if none."""
    return max((int(n) + 1 for n in LONG_ID.findall(json.dumps(body.get("messages")))), default=0)


@dataclasses.dataclass(frozen=True)
class LongResponder:
    """A stateless agent for long runs: asks for `tool` (input {"turn": N}, id `toolu_long_N`) until `turns`,
    then answers "done after {turns} tool turns". The turn is found in the request's ids (`long_turn`), in
    kept turns, a compaction block or a summary alike, so a run goes on after any of them. A request that
    offers no tools (the engine's summarising call) gets a summary naming the newest call it saw."""

    tool: str = "fetch_page"
    turns: int = 200

    def __call__(self, body: Json) -> Reply:
        turn = long_turn(body)
        usage = usage_of(count_tokens(body), 12)
        if not body.get("tools"):
            return Reply.text(f"Summary: {turn} tool calls so far; the newest is toolu_long_{turn - 1}.", usage)
        if turn >= self.turns:
            return Reply.text(f"done after {self.turns} tool turns", usage)
        return Reply.tool_use(self.tool, {"turn": turn}, id=f"toolu_long_{turn}", usage=usage)


def tool_results(message: Json) -> list[Json]:
    content = message.get("content")
    return [b for b in content if b.get("type") == "tool_result"] if isinstance(content, list) else []


@dataclasses.dataclass(frozen=True)
class AgentResponder:
    """A stateless agent: asks for `tool` until the conversation has a tool_result, then answers with text.

    Stateless, so any number of concurrent runs can share it and a resumed run gets the same answers.
    Usage counts the conversation before the newest message as read from the cache and the newest
    message as written to it, as prompt caching with a breakpoint on the newest message would.
    """

    tool: str = "list_tickets"
    input: Json = dataclasses.field(default_factory=lambda: {"status": "open"})
    chunk_delay: float = 0.0
    """Seconds between streamed text fragments (`agentrun dev` slows them down to be seen arriving)."""

    def __call__(self, body: Json) -> Reply:
        return self._reply(body).streamed_slowly(self.chunk_delay)

    def _reply(self, body: Json) -> Reply:
        messages: list[Json] = body.get("messages", [])
        prefix = [body.get("system"), body.get("tools"), messages[:-1]]
        cached = token_count(prefix) if len(messages) > 1 else 0
        write = token_count(messages[-1:]) + (0 if cached else token_count(prefix))
        results = [r for m in messages if m.get("role") == "user" for r in tool_results(m)]
        offered = any(t.get("name") == self.tool for t in body.get("tools", []))
        if not results and offered:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            return Reply.tool_use(
                self.tool, self.input, id=f"toolu_{turn:02d}_{self.tool}", usage=usage_of(3, 40, write, cached)
            )
        if results:
            text = f"Summary of {self.tool}: {as_text(results[-1].get('content'))[:300]}"
        else:
            text = f"No {self.tool} tool was offered, so here is an answer without it."
        return Reply.text(text, usage_of(3, token_count(text), write, cached))


@dataclasses.dataclass(frozen=True)
class ScriptResponder:
    """A deterministic agent whose plan is written in the run's input, e.g. "chaos run=17 turns=5 parallel=2
    slow=1": `turns` tool turns, then a text answer. Turns 1, 3, 5… ask for `parallel` tool calls at once,
    the others for one; the first call of the first `slow` turns asks the tool to sleep `slow_seconds`.

    Stateless (the turn is the number of assistant messages so far), so a resumed run gets the same
    answers and every request can be attributed to a (run, turn) with `key`. Tool-use ids name both.
    """

    tool: str = "chaos_step"
    latency: float = 0.0
    slow_seconds: float = 1.0

    @staticmethod
    def plan(body: Json) -> dict[str, str]:
        messages = body.get("messages") or [{}]
        return dict(re.findall(r"(\w+)=(\S+)", as_text(messages[0].get("content"))))

    @classmethod
    def key(cls, body: Json) -> tuple[str, int]:
        """(the plan's `run`, the turn) of a request."""
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        return cls.plan(body).get("run", "?"), turn

    def __call__(self, body: Json) -> Reply:
        plan = self.plan(body)
        tag, turn = self.key(body)
        turns, parallel, slow = (int(plan.get(k, d)) for k, d in (("turns", 3), ("parallel", 1), ("slow", 0)))
        usage = usage_of(100 + turn, 20)
        if turn >= turns:
            return Reply.text(f"run {tag} done after {turns} tool turns", usage).after(self.latency)
        blocks = []
        for part in range(parallel if turn % 2 == 1 else 1):
            args: Json = {"run": tag, "turn": turn, "part": part}
            if part == 0 and turn < slow:
                args["sleep"] = self.slow_seconds
            blocks.append({"type": "tool_use", "id": f"toolu_{tag}_{turn}_{part}", "name": self.tool, "input": args})
        return Reply.message(blocks, "tool_use", usage).after(self.latency)


@dataclasses.dataclass(frozen=True)
class TreeResponder:
    """A stateless planner and its sub-agents, like `scripted.TreeLlm` but over HTTP: a request offering
    `agent__*` tools calls each once, in one turn, with a task naming its part of the run's input, then
    joins the answers it gets back; a request offering none answers `<system>: <task>` after
    `child_latency` seconds (a sub-agent at work, for as long as a test needs to kill its worker)."""

    child_latency: float = 0.0

    def __call__(self, body: Json) -> Reply:
        messages: list[Json] = body.get("messages") or [{}]
        agents = [t.get("name") for t in body.get("tools", []) if str(t.get("name", "")).startswith("agent__")]
        task = as_text(messages[0].get("content")) if not isinstance(messages[0].get("content"), str) \
            else messages[0]["content"]
        results = [r for m in messages if m.get("role") == "user" for r in tool_results(m)]
        if agents and not results:
            blocks = [{"type": "tool_use", "id": f"toolu_{i}_{name}", "name": name,
                       "input": {"task": f"part {i + 1} of: {task}"}} for i, name in enumerate(agents)]
            return Reply.message(blocks, "tool_use")
        if agents:
            joined = " | ".join(f"{'ERROR ' if r.get('is_error') else ''}{as_text(r.get('content'))}"
                                if not isinstance(r.get("content"), str) else r["content"] for r in results)
            return Reply.text(f"combined: {joined}")
        system = body.get("system")
        who = system if isinstance(system, str) else as_text(system) if system else "agent"
        return Reply.text(f"{who}: {task}").after(self.child_latency)


def as_text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "")


def check_request(body: Any) -> str | None:
    """What the real API would refuse with a 400, for the mistakes a client of it can make; None if fine."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            return f"{field}: Field required"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if not all(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages):
        return "messages: each message must be an object with role \"user\" or \"assistant\""
    if messages[0].get("role") != "user":
        return "messages: first message must use the \"user\" role"
    for i, m in enumerate(messages):
        results = {r.get("tool_use_id") for r in tool_results(m)}
        asked = _tool_use_ids(messages[i - 1]) if i > 0 and messages[i - 1].get("role") == "assistant" else set()
        if unexpected := results - asked:
            return (f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{', '.join(sorted(map(str, unexpected)))}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.")
        if m.get("role") == "assistant" and (ids := _tool_use_ids(m)) and i + 1 < len(messages):
            missing = ids - {r.get("tool_use_id") for r in tool_results(messages[i + 1])}
            if missing:
                return (f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately "
                        f"after: {', '.join(sorted(missing))}. Each `tool_use` block must have a corresponding "
                        "`tool_result` block in the next message.")
    for t in body.get("tools", []):
        if "name" not in t or "input_schema" not in t:
            return "tools: each tool needs a name and an input_schema"
    if (n := _breakpoints(body)) > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {n}."
    return None


def _tool_use_ids(message: Json) -> set[str]:
    content = message.get("content")
    return {b["id"] for b in content if b.get("type") == "tool_use"} if isinstance(content, list) else set()


def _breakpoints(body: Json) -> int:
    blocks: list[Any] = list(body.get("tools", []))
    if isinstance(body.get("system"), list):
        blocks += body["system"]
    for m in body["messages"]:
        if isinstance(m.get("content"), list):
            blocks += m["content"]
    return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)


Responder = Callable[[Json], Reply]
COMPACTION_MIN_TRIGGER = 50_000
"""The lowest `compact_20260112` trigger the Messages API accepts."""


@dataclasses.dataclass
class Managed:
    """A request after the server's context management: what the model sees (`seen`), or the error that
    refuses it, and what the answer gains (a compaction block, usage iterations, the edits applied)."""

    seen: Json
    refused: Reply | None = None
    compaction: Json | None = None
    compaction_usage: Json | None = None
    applied_edits: list[Json] | None = None

    def finish(self, payload: Json) -> None:
        if self.compaction is not None:
            payload["content"] = [self.compaction, *(payload.get("content") or [])]
            usage = dict(payload.get("usage") or {})
            message = {"type": "message", **{k: usage.get(k, 0) for k in (
                "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}}
            payload["usage"] = {**usage, "iterations": [self.compaction_usage, message]}
        if self.applied_edits is not None:
            payload["context_management"] = {"applied_edits": self.applied_edits}


@dataclasses.dataclass(frozen=True)
class Received:
    """One request as it arrived: its path, headers (case-insensitive) and JSON body (None if not JSON)."""

    path: str
    headers: Mapping[str, str]
    body: Json | None


class FakeApi:
    """A scripted JSON-over-HTTP model server. `script(...)` queues replies (served first, in order); then
    `responder` answers. Subclasses say which paths they serve (`routes`), what they refuse (`check`)
    and what a success body gains from the request (`complete`).

    `requests` holds every JSON body received, in order, including those answered with a fault;
    `received` the same requests with their paths and headers. `record=False` keeps neither (a
    benchmark's long-lived server).
    """

    kind = "fake API"

    def __init__(self, responder: Responder, host: str = "127.0.0.1", port: int = 0, record: bool = True) -> None:
        self.responder: Responder = responder
        self.record = record
        self.requests: list[Json] = []
        self.received: list[Received] = []
        self._queue: collections.deque[Reply] = collections.deque()
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    def script(self, *replies: Reply) -> Self:
        self._queue.extend(replies)
        return self

    @property
    def pending(self) -> int:
        """Scripted replies not served yet."""
        return len(self._queue)

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError(f"the {self.kind} server is not started")
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def check(self, body: Any, request: web.Request) -> str | None:
        """What the real API would refuse with a 400; None if fine."""
        return None

    def refuse(self, problem: str) -> Reply:
        return Reply.bad_request(problem)

    def complete(self, payload: Json, body: Json, request: web.Request) -> None:
        """Fill in what a success body takes from the request (ids, the model)."""

    def manage(self, body: Json, request: web.Request) -> Managed:
        """The request as the model sees it (after the provider's own context management) or its refusal."""
        return Managed(body)

    async def start(self) -> Self:
        app = web.Application()
        self.routes(app)
        self._closing.clear()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port, shutdown_timeout=1.0).start()
        return self

    async def stop(self) -> None:
        self._closing.set()  # slow replies stop waiting
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        json_body = body if isinstance(body, dict) else None
        if self.record:
            if json_body is not None:
                self.requests.append(json_body)
            self.received.append(Received(request.path, CIMultiDict(request.headers), json_body))
        problem = self.check(body, request)
        managed = Managed(body if isinstance(body, dict) else {})
        if problem is None and isinstance(body, dict):
            managed = self.manage(body, request)
        if problem is not None:
            reply = self.refuse(problem)
        elif managed.refused is not None:
            reply = managed.refused
        elif self._queue:
            reply = self._queue.popleft()
        else:
            reply = self.responder(self.as_messages(managed.seen, request))
        if reply.delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(reply.delay):
                    await self._closing.wait()
        if reply.status == DISCONNECT:
            if request.transport is not None:
                request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        payload = dict(reply.body)
        if reply.status == 200 and isinstance(body, dict):
            self.complete(payload, body, request)
            managed.finish(payload)
            if body.get("stream") is True:
                return await self.stream(request, payload, reply)
        return web.json_response(payload, status=reply.status, headers=dict(reply.headers))

    async def stream(self, request: web.Request, message: Json, reply: Reply) -> web.StreamResponse:
        """A success answer to a request that asked for a stream; this server does not stream: JSON."""
        return web.json_response(message, status=reply.status, headers=dict(reply.headers))

    def as_messages(self, body: Json, request: web.Request) -> Json:
        """The request as the responder reads it."""
        return body


BEDROCK_INVOKE = "/model/{model}/invoke"
VERTEX_PREDICT = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model:[^/:]+}:rawPredict"


class FakeAnthropic(FakeApi):
    """The Messages API at `POST /v1/messages`, and the same API as Amazon Bedrock (`POST /model/{id}/invoke`)
    and Google Vertex AI (`POST /v1/projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict`)
    serve it: the model in the path, `anthropic_version` in the body. Vertex's clients are pointed at
    `base_url + "/v1"`. `POST /token` answers OAuth refreshes (google-auth's), for dummy credentials.
    """

    kind = "fake Messages API"

    def __init__(
        self, responder: Responder | None = None, host: str = "127.0.0.1", port: int = 0, record: bool = True,
        context_window: int | None = None, compaction_min_trigger: int = COMPACTION_MIN_TRIGGER,
    ) -> None:
        super().__init__(responder or AgentResponder(), host, port, record)
        self.context_window = context_window
        self.compaction_min_trigger = compaction_min_trigger
        self.input_tokens: list[int] = []
        """The input each request was counted at (after the drop before a compaction block and clearing)."""

    def manage(self, body: Json, request: web.Request) -> Managed:
        """The compaction and context-editing betas, and the window, as the Messages API has them: content
        before the newest compaction block is ignored; `clear_tool_uses_20250919` past its trigger clears
        the oldest tool results; `compact_20260112` past its trigger summarises what is left into a
        compaction block that begins the answer; a request over the window is refused with its 400."""
        betas = {b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()}
        betas |= {b for b in body.get("anthropic_beta") or [] if isinstance(b, str)}
        edits, problem = _edits(body.get("context_management"), betas, self.compaction_min_trigger)
        if problem is not None:
            return Managed(body, Reply.bad_request(problem))
        seen = {**body, "messages": _after_compaction(body.get("messages") or [])}
        managed = Managed(seen)
        if (clear := edits.get("clear_tool_uses_20250919")) is not None:
            managed.applied_edits = []
            if count_tokens(seen) > _value(clear, "trigger", 100_000):
                seen, edit = _cleared(seen, clear)
                if edit is not None:
                    managed.applied_edits.append(edit)
            managed.seen = seen
        n = count_tokens(seen)
        self.input_tokens.append(n)
        if self.context_window is not None:
            if n > self.context_window:
                too_long = f"prompt is too long: {n} tokens > {self.context_window} maximum"
                return Managed(seen, Reply.bad_request(too_long))
            asked = body.get("max_tokens")
            max_tokens = asked if isinstance(asked, int) else 0
            if n + max_tokens > self.context_window:
                return Managed(seen, Reply.bad_request(
                    f"input length and `max_tokens` exceed context limit: {n} + {max_tokens} > {self.context_window}, "
                    "decrease input length or `max_tokens` and try again"))
        if (compact := edits.get("compact_20260112")) is not None and n > _value(compact, "trigger", 150_000):
            newest = long_turn(seen) - 1
            ids = re.findall(r"toolu_[A-Za-z0-9_]+", json.dumps(seen.get("messages")))
            summary = (f"Summary of {len(seen.get('messages') or [])} messages and {len(set(ids))} tool calls; "
                       f"the newest is {ids[-1] if ids else 'none'}"
                       + (f" (toolu_long_{newest})." if newest >= 0 else "."))
            managed.compaction = {"type": "compaction", "content": summary}
            managed.compaction_usage = {"type": "compaction", "input_tokens": n, "output_tokens": token_count(summary),
                                        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
            managed.seen = {**seen, "messages": [{"role": "user", "content": summary}]}
        return managed

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.answer)
        app.router.add_post(BEDROCK_INVOKE, self.answer)
        app.router.add_post(VERTEX_PREDICT, self.answer)
        app.router.add_post("/token", self._token)

    def as_messages(self, body: Json, request: web.Request) -> Json:
        model = request.match_info.get("model")
        return {**body, "model": model} if model is not None and isinstance(body, dict) else body

    def check(self, body: Any, request: web.Request) -> str | None:
        if "model" in request.match_info:
            if not isinstance(body, dict):
                return "request body must be a JSON object"
            if "model" in body:
                return "model: Extra inputs are not permitted (the model is in the path)"
            if not body.get("anthropic_version"):
                return "anthropic_version: Field required"
            body = self.as_messages(body, request)
        return check_request(body)

    def complete(self, payload: Json, body: Json, request: web.Request) -> None:
        payload.setdefault("id", f"msg_{uuid.uuid4().hex[:24]}")
        payload.setdefault("model", self.as_messages(body, request).get("model"))

    async def stream(self, request: web.Request, message: Json, reply: Reply) -> web.StreamResponse:
        """The message as the Messages API streams it: server-sent events, text in fragments of a few words."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **dict(reply.headers)})
        await response.prepare(request)

        async def send(event: str, data: Json) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode())

        usage = dict(message.get("usage") or {})
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        await send("message_start", {"message": start})
        for index, block in enumerate(message.get("content") or []):
            if block.get("type") == "text":
                await send("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                for fragment in re.findall(r"\S*\s*", block.get("text", "")):
                    if fragment:
                        if reply.chunk_delay > 0:
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(reply.chunk_delay):
                                    await self._closing.wait()
                        await send("content_block_delta",
                                   {"index": index, "delta": {"type": "text_delta", "text": fragment}})
            elif block.get("type") == "tool_use":
                await send("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
                await send("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}})
            elif block.get("type") == "compaction":  # its summary comes as a delta, as the API streams it
                await send("content_block_start", {"index": index, "content_block": {"type": "compaction",
                                                                                     "content": None}})
                await send("content_block_delta", {"index": index, "delta": {
                    "type": "compaction_delta", "content": block.get("content")}})
            else:
                await send("content_block_start", {"index": index, "content_block": block})
            await send("content_block_stop", {"index": index})
        final: Json = {"delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": None},
                       "usage": {"output_tokens": usage.get("output_tokens", 0)}}
        if "iterations" in usage:  # the counts of a compaction are in the final usage only
            final["usage"] = usage
        if "context_management" in message:
            final["context_management"] = message["context_management"]
        await send("message_delta", final)
        await send("message_stop", {})
        await response.write_eof()
        return response

    async def _token(self, request: web.Request) -> web.Response:
        self.received.append(Received(request.path, CIMultiDict(request.headers), None))
        return web.json_response({"access_token": "ya29.fake-token", "expires_in": 3600, "token_type": "Bearer"})


EDIT_BETAS = {"compact_20260112": "compact-2026-01-12", "clear_tool_uses_20250919": "context-management-2025-06-27"}
CLEARED = "[cleared]"


def _edits(config: Any, betas: set[str], min_trigger: int) -> tuple[dict[str, Json], str | None]:
    """The context_management edits of a request by type, or the 400 the API answers them with."""
    if config is None:
        return {}, None
    if not betas & set(EDIT_BETAS.values()):
        return {}, "context_management: Extra inputs are not permitted"
    edits = config.get("edits") if isinstance(config, dict) else None
    if not isinstance(edits, list):
        return {}, "context_management.edits: Field required"
    found: dict[str, Json] = {}
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in EDIT_BETAS:
            return {}, f"context_management.edits.{i}.type: Input tag {kind!r} found using 'type' does not match " \
                       f"any of the expected tags: {', '.join(map(repr, EDIT_BETAS))}"
        if EDIT_BETAS[kind] not in betas:
            return {}, f"context_management.edits.{i}: {kind} requires the {EDIT_BETAS[kind]} beta"
        if kind == "compact_20260112" and _value(edit, "trigger", 150_000) < min_trigger:
            return {}, (f"context_management.edits.{i}.trigger.value: Input should be greater than or equal to "
                        f"{min_trigger}")
        found[kind] = edit
    return found, None


def _value(edit: Json, field: str, default: int) -> int:
    part = edit.get(field)
    value = part.get("value") if isinstance(part, dict) else None
    return value if isinstance(value, int) else default


def _after_compaction(messages: list[Json]) -> list[Json]:
    """The messages from the newest compaction block on (a block with null content is a no-op), the block
    itself as the user turn the model reads it as."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if messages[i].get("role") != "assistant" or not isinstance(content, list):
            continue
        at = [j for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "compaction"
              and isinstance(b.get("content"), str)]
        if at:
            j = at[-1]
            rest = [b for b in content[j + 1:]]
            head = [{"role": "user", "content": content[j]["content"]}]
            return head + ([{"role": "assistant", "content": rest}] if rest else []) + messages[i + 1:]
    return messages


def _cleared(body: Json, edit: Json) -> tuple[Json, Json | None]:
    """`body` with the oldest tool results cleared, keeping the newest `keep` tool uses; the edit applied."""
    keep = _value(edit, "keep", 3)
    excluded = set(edit.get("exclude_tools") or [])
    names = {b.get("id"): b.get("name") for m in body.get("messages") or [] if m.get("role") == "assistant"
             and isinstance(m.get("content"), list) for b in m["content"] if b.get("type") == "tool_use"}
    results = [(i, j) for i, m in enumerate(body.get("messages") or []) for j, b in enumerate(tool_results(m))
               if names.get(b.get("tool_use_id")) not in excluded and b.get("content") != CLEARED]
    old = results[:max(len(results) - keep, 0)]
    if not old:
        return body, None
    messages = [dict(m) for m in body["messages"]]
    targets = {(i, b.get("tool_use_id")) for i, j in old for b in [tool_results(body["messages"][i])[j]]}
    before = count_tokens(body)
    for i in {i for i, _ in old}:
        messages[i]["content"] = [{**b, "content": CLEARED} if b.get("type") == "tool_result"
                                  and (i, b.get("tool_use_id")) in targets else b for b in messages[i]["content"]]
    after = {**body, "messages": messages}
    freed = before - count_tokens(after)
    if freed < _value(edit, "clear_at_least", 0):
        return body, None
    return after, {"type": "clear_tool_uses_20250919", "cleared_tool_uses": len(old), "cleared_input_tokens": freed}


async def serve_until_signalled(server: FakeApi, banner: str) -> None:
    """Start `server`, print `banner` (its URL, for whoever started this process), and serve until
    SIGTERM or SIGINT."""
    await server.start()
    print(banner.format(server=server), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


async def _serve(args: argparse.Namespace, tool_input: Json) -> None:
    server = FakeAnthropic(AgentResponder(args.tool, tool_input), args.host, args.port,
                           context_window=args.context_window)
    await serve_until_signalled(server, "fake Messages API listening on {server.base_url}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.worker.testing.fake_server",
        description="A local Messages API for demos and benchmarks: asks for one tool, then summarises its "
        "result. Point a worker at it with ANTHROPIC_BASE_URL=http://HOST:PORT.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8088, help="port, 0 for any free one (default: 8088)")
    parser.add_argument("--tool", default="list_tickets", help="the tool the model asks for (default: list_tickets)")
    parser.add_argument("--tool-input", default='{"status": "open"}', metavar="JSON",
                        help='input of that tool call (default: {"status": "open"})')
    parser.add_argument("--context-window", type=int, default=None, metavar="TOKENS",
                        help="refuse a request over this many tokens with the API's 400 (default: no limit)")
    args = parser.parse_args(argv)
    try:
        tool_input = json.loads(args.tool_input)
    except ValueError as e:
        parser.error(f"--tool-input is not JSON: {e}")
    if not isinstance(tool_input, dict):
        parser.error("--tool-input must be a JSON object")
    asyncio.run(_serve(args, tool_input))


if __name__ == "__main__":
    main()
