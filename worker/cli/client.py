"""The HTTP client behind `agentrun runs …`: calls the REST API and formats its answers for people."""

from __future__ import annotations

import dataclasses
import json
import time
import unicodedata
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import httpx
import orjson

from agentrun.worker.cli.errors import ClientError as ClientError
from agentrun.worker.core.records import RunStatus

DEFAULT_URL = "http://localhost:8080"
TERMINAL = frozenset(s.value for s in RunStatus if s.terminal)


class RunsClient:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, tenant: str | None = None) -> None:
        if token is not None and not _header_safe(token):
            # Never echo the token itself, not even in an encoding error.
            raise ClientError(0, "the API token (AGENTRUN_API_TOKEN) must be printable ASCII characters")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        # The tenant a platform operator's identity acts for (--tenant): what it makes is that tenant's, the agents
        # and schedules it reads are, and the runs it lists. None: the identity's own.
        self._tenant = {"tenant": tenant} if tenant is not None else {}
        try:
            self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        except httpx.InvalidURL as e:
            raise ClientError(0, f"not a usable server URL {_shown(url)}: {e}") from None

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RunsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._answer(method, path, **kw)[0]

    def _answer(self, method: str, path: str, **kw: Any) -> tuple[Any, int]:
        """The answer's JSON (None for a 204) and its status; ClientError for a refusal or no answer."""
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ClientError(0, f"cannot reach {self.url}: {e}") from None
        except (UnicodeError, ValueError, httpx.InvalidURL) as e:  # not encodable as JSON, a header or a URL
            raise ClientError(0, f"cannot send the request: {e}") from None
        if r.status_code >= 400:
            raise ClientError(r.status_code, _error_message(r))
        if r.status_code == 204:
            return None, 204
        try:
            return r.json(), r.status_code
        except ValueError:
            raise ClientError(r.status_code, f"{self.url} answered {method} {path} with something other than JSON; "
                           "is it an agentrun worker?") from None

    def submit(self, body: Mapping[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        if idempotency_key is not None and not _header_safe(idempotency_key):
            raise ClientError(0, f"the idempotency key {_shown(idempotency_key)} must be printable ASCII characters")
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/api/runs", json={**body, **self._tenant},  # type: ignore[no-any-return]
                          headers=headers)

    def get(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/runs/{checked_run_id(run_id)}")  # type: ignore[no-any-return]

    def create_replay(self, body: Mapping[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """POST /api/replays (cli/replay.py)."""
        if idempotency_key is not None and not _header_safe(idempotency_key):
            raise ClientError(0, f"the idempotency key {_shown(idempotency_key)} must be printable ASCII characters")
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/api/replays", json=dict(body), headers=headers)  # type: ignore[no-any-return]

    def replay(self, replay_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/replays/{checked_run_id(replay_id, 'replay id')}")  # type: ignore[no-any-return]

    def replays(self, limit: int | None = None, after: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in {"limit": limit, "after": checked_run_id(after, "--after") if after else None
                                    }.items() if v is not None}
        return self._call("GET", "/api/replays", params=params)  # type: ignore[no-any-return]

    def timeline(self, run_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/api/runs/{checked_run_id(run_id)}/timeline")  # type: ignore[no-any-return]

    def cancel(self, run_id: str) -> dict[str, Any]:
        return self._call("POST", f"/api/runs/{checked_run_id(run_id)}/cancel")  # type: ignore[no-any-return]

    def message(self, run_id: str, text: str) -> dict[str, Any]:
        return self._call("POST", f"/api/runs/{checked_run_id(run_id)}/messages", json={"text": text})  # type: ignore[no-any-return]

    def send_event(self, key: str, payload: Any, idempotency_key: str | None = None) -> tuple[dict[str, Any], bool]:
        """POST /api/events: its answer ({"woke": [...]}) and whether it was a replay of an earlier copy."""
        if idempotency_key is not None and not _header_safe(idempotency_key):
            raise ClientError(0, f"the idempotency key {_shown(idempotency_key)} must be printable ASCII characters")
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        try:
            r = self.http.post("/api/events", json={"key": key, "payload": payload, **self._tenant}, headers=headers)
        except httpx.HTTPError as e:
            raise ClientError(0, f"cannot reach {self.url}: {e}") from None
        except (UnicodeError, ValueError) as e:
            raise ClientError(0, f"cannot send the request: {e}") from None
        if r.status_code >= 400:
            raise ClientError(r.status_code, _error_message(r))
        try:
            return r.json(), r.headers.get("Idempotent-Replayed") == "true"
        except ValueError:
            raise ClientError(r.status_code, f"{self.url} answered POST /api/events with something other than JSON; "
                              "is it an agentrun worker?") from None

    def step(self, run_id: str, seq: int) -> dict[str, Any]:
        return self._call("GET", f"/api/runs/{checked_run_id(run_id)}/steps/{int(seq)}")  # type: ignore[no-any-return]

    def pending(self, run_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/api/runs/{checked_run_id(run_id)}/pending")  # type: ignore[no-any-return]

    def decide(self, run_id: str, tool_use_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if not tool_use_id or not tool_use_id.isascii() or not tool_use_id.isprintable() or "/" in tool_use_id:
            raise ClientError(0, f"tool_use id {_shown(tool_use_id)} must be printable ASCII without '/'")
        path = f"/api/runs/{checked_run_id(run_id)}/pending/{urllib.parse.quote(tool_use_id, safe='')}"
        return self._call("POST", path, json=dict(body))  # type: ignore[no-any-return]

    def children(self, run_id: str) -> list[dict[str, Any]]:
        """The runs the run's sub-agent calls started, in call order."""
        return self._call("GET", f"/api/runs/{checked_run_id(run_id)}/children")  # type: ignore[no-any-return]

    def tree(self, run: Mapping[str, Any], max_runs: int = 200) -> list[tuple[int, dict[str, Any]]]:
        """The run's descendants, depth-first in call order, each with its level below `run` (1: a child);
        asks only of runs that may have children (see `may_have_children`), at most `max_runs` of them."""
        found: list[tuple[int, dict[str, Any]]] = []

        def below(parent: Mapping[str, Any], level: int) -> None:
            if len(found) >= max_runs or not may_have_children(parent):
                return
            for child in self.children(str(parent["id"])):
                if len(found) >= max_runs:
                    return
                found.append((level, child))
                below(child, level + 1)

        below(run, 1)
        return found

    def list(self, status: str | None = None, limit: int | None = None, after: str | None = None,
             parent: str | None = None, **filters: str | None) -> dict[str, Any]:
        """A page of runs, newest first. `filters` are the other query parameters of GET /api/runs by their
        API names (labelSelector, model, agent, createdBy, createdAfter, createdBefore, q)."""
        if after is not None:
            after = checked_run_id(after, "cursor --after")
        if parent is not None:
            parent = checked_run_id(parent, "--parent")
        params = {k: v for k, v in {"status": status, "limit": limit, "after": after, "parent": parent,
                                    **self._tenant, **filters}.items() if v is not None}
        return self._call("GET", "/api/runs", params=params)  # type: ignore[no-any-return]

    def list_all(self, status: str | None = None, limit: int | None = None, parent: str | None = None,
                 **filters: str | None) -> dict[str, Any]:
        """Every run the filters match, page after page (`limit` per page), as one page without `next`."""
        items: list[Any] = []
        after: str | None = None
        while True:
            page = self.list(status, limit, after, parent, **filters)
            items += page["items"]
            after = page.get("next")
            if not after or not page["items"]:
                return {"items": items, "next": None}

    def create_agent(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The agent's version the definition is (its name and version), and whether it is new."""
        answer, status = self._answer("POST", "/api/agents", json={**body, **self._tenant})
        return answer, status == 201

    def agents(self) -> dict[str, Any]:
        return self._call("GET", "/api/agents", params=self._tenant)  # type: ignore[no-any-return]

    def agent(self, name: str, version: int | None = None) -> dict[str, Any]:
        path = f"/api/agents/{_agent_name(name)}" + (f"/versions/{version}" if version is not None else "")
        return self._call("GET", path, params=self._tenant)  # type: ignore[no-any-return]

    def agent_versions(self, name: str) -> dict[str, Any]:
        path = f"/api/agents/{_agent_name(name)}/versions"
        return self._call("GET", path, params=self._tenant)  # type: ignore[no-any-return]

    def delete_agent(self, name: str) -> None:
        self._call("DELETE", f"/api/agents/{_agent_name(name)}", params=self._tenant)

    def create_schedule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/api/schedules", json={**body, **self._tenant})  # type: ignore[no-any-return]

    def schedules(self) -> dict[str, Any]:
        return self._call("GET", "/api/schedules", params=self._tenant)  # type: ignore[no-any-return]

    def schedule(self, name: str) -> dict[str, Any]:
        path = f"/api/schedules/{_agent_name(name, 'schedule')}"
        return self._call("GET", path, params=self._tenant)  # type: ignore[no-any-return]

    def schedule_runs(self, name: str) -> Any:  # a list of runs (`list` names a method here)
        return self._call("GET", f"/api/schedules/{_agent_name(name, 'schedule')}/runs", params=self._tenant)

    def patch_schedule(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/api/schedules/{_agent_name(name, 'schedule')}"
        return self._call("PATCH", path, json=dict(body), params=self._tenant)  # type: ignore[no-any-return]

    def delete_schedule(self, name: str) -> None:
        self._call("DELETE", f"/api/schedules/{_agent_name(name, 'schedule')}", params=self._tenant)

    def tenants(self) -> dict[str, Any]:
        return self._call("GET", "/api/tenants")  # type: ignore[no-any-return]

    def tenant(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/tenants/{_agent_name(name, 'tenant')}")  # type: ignore[no-any-return]

    def put_tenant(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/api/tenants/{_agent_name(name, 'tenant')}"
        return self._call("PUT", path, json=dict(body))  # type: ignore[no-any-return]

    def events(self, run_id: str, last_event_id: str | None = None) -> Iterator[ServerEvent]:
        """The run's server-sent events (GET /api/runs/{id}/events) until the server closes the stream."""
        path = f"/api/runs/{checked_run_id(run_id)}/events"
        headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_event_id} if last_event_id else {})}
        try:
            # No read timeout: the server sends a keep-alive comment every 15 s, and a run may take hours.
            with self.http.stream("GET", path, headers=headers, timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ClientError(r.status_code, _error_message(r))
                parser = SseParser()
                for line in r.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.HTTPError as e:
            raise ClientError(0, f"cannot reach {self.url}: {e}") from None

    def watch(
        self, run_id: str, on_step: Callable[[dict[str, Any]], None], interval: float = 1.0,
        sleep: Callable[[float], None] = time.sleep, on_text: Callable[[int, str], None] | None = None,
        reconnects: int = 5, on_run: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Follow the run's events until it ends, calling `on_step` for each step when it appears and when
        it changes status (a tool step is seen STARTED, then DONE) and `on_text(seq, text)` with model text
        as it streams, and `on_run` with the run each time it changes; returns the finished run. A dropped
        stream is resumed (Last-Event-ID) after
        `interval` seconds, up to `reconnects` times in a row."""
        run_id = checked_run_id(run_id)  # a bad id is said at once, not retried as if the server were away
        seen: dict[int, str] = {}
        last: str | None = None
        failures = 0
        while True:
            try:
                for event in self.events(run_id, last):
                    failures = 0
                    last = event.id or last
                    if event.event == "step":
                        step = event.json()
                        if seen.get(step["seq"]) != step["status"]:
                            seen[step["seq"]] = step["status"]
                            on_step(step)
                    elif event.event == "run" and on_run is not None:
                        on_run(event.json())
                    elif event.event == "delta" and on_text is not None:
                        delta = event.json()
                        on_text(int(delta["seq"]), str(delta["text"]))
                    elif event.event == "end":
                        return self.get(run_id)
            except ClientError as e:
                if e.status != 0 or failures >= reconnects:
                    raise
                failures += 1
            else:
                failures += 1  # closed without an end: the server is stopping; resume on the next one
                if failures > reconnects:
                    raise ClientError(0, f"{self.url} keeps closing the event stream of run {run_id}")
            sleep(interval)


@dataclasses.dataclass(frozen=True)
class ServerEvent:
    """One server-sent event: its `id`, its type (`event`) and its `data` text."""

    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError:
            raise ClientError(0, f"a {self.event!r} event whose data is not JSON: {_shown(self.data)}") from None


class SseParser:
    """The text/event-stream format, a line at a time (the WHATWG rules clients follow)."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> ServerEvent | None:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = ServerEvent(self._id, self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment: the keep-alive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def checked_run_id(text: str, what: str = "run id") -> str:
    """The id as the server spells it. Checked here so that no argument can steer the request elsewhere
    (`../../metrics`, `?x=1`) or fail to encode (a NUL, bytes that were not UTF-8)."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise ClientError(0, f"{what} {_shown(text)} is not a valid UUID") from None


def _agent_name(text: str, what: str = "agent") -> str:
    """An agent's (or schedule's) name, checked here as `checked_run_id` checks ids: no argument can steer the
    request elsewhere."""
    from agentrun.worker.core.agents import name_problem  # here: it imports jsonschema, which `runs` needs not

    if name_problem(text) is not None:
        raise ClientError(0, f"{what} name {_shown(text)} is not a DNS label (lowercase letters, digits and '-')")
    return text


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable()


def _shown(text: str, limit: int = 60) -> str:
    """A value quoted for a message: escapes for anything unprintable, cut to `limit` characters."""
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def _error_message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    text = r.text.strip()
    return text[:300] or r.reason_phrase


# -- formatting ----------------------------------------------------------------------------------

STEP_COLUMNS: tuple[tuple[str, int], ...] = (
    ("SEQ", 4), ("KIND", 5), ("TOOL", 16), ("STATUS", 7), ("STOP", 10), ("IN", 7), ("OUT", 7),
    ("CACHE W/R", 13), ("LATENCY", 9), ("WORKER", 0),
)


def _cells(step: Mapping[str, Any]) -> list[str]:
    latency = step.get("latencyMs")
    return [
        str(step["seq"]) if step.get("seq") is not None else "-", step["kind"],  # a WAITING row has no seq
        step.get("toolName") or _compaction(step) or "-", step["status"],
        step.get("stopReason") or "-",
        str(step.get("inputTokens", 0)), str(step.get("outputTokens", 0)),
        f"{step.get('cacheCreationInputTokens', 0)}/{step.get('cacheReadInputTokens', 0)}",
        f"{latency}ms" if latency is not None else "-", step.get("worker") or "-",
    ]


def _compaction(step: Mapping[str, Any]) -> str | None:
    """A COMPACT step's TOOL cell: what it did (`summarised 1-6`, `cleared 4`)."""
    done = step.get("compaction")
    if not isinstance(done, Mapping):
        return None
    covers = done.get("coversSeqs")
    if done.get("strategy") == "clear_tool_results":
        return f"cleared {done.get('cleared', 0)}"
    if isinstance(covers, list) and len(covers) == 2:
        return f"summarised {covers[0]}-{covers[1]}"
    return "summarised"


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    numeric = {0, 5, 6, 7, 8}  # right-aligned so digits line up
    parts = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
    return "  ".join(parts).rstrip()


def step_header(widths: Sequence[int] | None = None) -> str:
    widths = widths or [w for _, w in STEP_COLUMNS]
    return _line([name for name, _ in STEP_COLUMNS], widths)


def step_row(step: Mapping[str, Any], widths: Sequence[int] | None = None) -> str:
    return _line(_cells(step), widths or [w for _, w in STEP_COLUMNS])


def timeline_table(steps: Sequence[Mapping[str, Any]]) -> str:
    rows = [_cells(s) for s in steps]
    widths = [max([w, len(name), *(len(r[i]) for r in rows)]) for i, (name, w) in enumerate(STEP_COLUMNS)]
    widths[-1] = 0
    return "\n".join([step_header(widths), *(_line(r, widths) for r in rows)])


def run_details(run: Mapping[str, Any]) -> str:
    cost = usd(run.get("costUsd")) + (f" of ${run['costBudgetUsd']:.4f}" if run.get("costBudgetUsd") else "")
    fields = [
        ("id", run["id"]), ("status", run["status"]), ("model", run["model"]),
        ("tokens", f"{run['tokensUsed']} of {run['tokenBudget']}"), ("cost", cost),
        ("steps", f"{run['steps']} (at most {run['maxSteps']})"), ("timeout", f"{run['timeoutSeconds']}s"),
        ("tools", ", ".join(run["tools"]) if run.get("tools") is not None else "all"),
        ("worker", run.get("lockedBy") or "-"), ("created", run["createdAt"]),
        ("started", run.get("startedAt") or "-"), ("finished", run.get("finishedAt") or "-"),
        ("priority", str(run.get("priority", 0))), ("claimable", run.get("runAt") or "-"),
    ]
    if run.get("createdBy"):
        fields.append(("created by", run["createdBy"]))
    if run.get("cancelRequested") and run["status"] not in TERMINAL:
        fields.append(("cancel", "requested"))
    if run.get("cancelledBy"):
        fields.append(("cancelled by", run["cancelledBy"]))
    if run.get("pending") and run.get("waitingFor") not in ("children", "timer", "event"):  # those: below
        fields.append(("pending", f"{plural(run['pending'], 'decision')} (agentrun runs pending {run['id']})"))
    if run.get("parentRunId") and run.get("parentToolUseId"):
        fields.append(("started by", f"run {run['parentRunId']} for call {run['parentToolUseId']}"))
    elif run.get("parentRunId"):
        how = f"forked at step {run['forkedAtSeq']}" if run.get("forkedAtSeq") else "continued"
        fields.append(("parent", f"{run['parentRunId']} ({how})"))
    if run.get("agent"):
        fields.append(("agent", agent_of(run)))
    if run.get("labels"):
        fields.append(("labels", labels_text(run["labels"])))
    if run.get("subAgents"):
        fields.append(("sub-agents", ", ".join(run["subAgents"])))
    if isinstance(context := run.get("contextManagement"), Mapping) and context.get("strategy"):
        counts = [f"{k}={context[k]}" for k in ("keepRecentTurns", "triggerTokens") if k in context]
        fields.append(("context", " ".join([context["strategy"], *counts])))
    if run.get("waitingFor") == "children":
        fields.append(("waiting", f"for its sub-agents: {run.get('childrenActive', 0)} at work"))
    elif run.get("waitingFor") in ("timer", "event") and run["status"] == "WAITING":
        fields.append(("waiting", f"for {'a timer' if run['waitingFor'] == 'timer' else 'an event'} "
                       f"(agentrun runs pending {run['id']})"))
    if run.get("error"):
        fields.append(("error", run["error"]))
    width = max(len(k) for k, _ in fields)
    lines = [f"{k.ljust(width)}  {v}" for k, v in fields]
    lines.append(f"{'input'.ljust(width)}  {run['input']}")
    if run.get("output") is not None:
        lines.append(f"{'output'.ljust(width)}  {answer_text(run['output'])}")
    return "\n".join(lines)


def may_have_children(run: Mapping[str, Any]) -> bool:
    """Whether a run may have started sub-agent runs: it lists sub-agents, has some at work, or its
    totals hold more than its own spending."""
    return bool(run.get("subAgents") or run.get("childrenActive")
                or run.get("tokensUsedTotal", 0) > run.get("tokensUsed", 0)
                or (run.get("costUsdTotal") or 0) > (run.get("costUsd") or 0))


def agent_of(run: Mapping[str, Any]) -> str:
    """`name@version` of the agent a run was made from (a sub-agent's run always is); `-` for none."""
    if run.get("agent"):
        agent = str(run["agent"])  # `name@version` since issue 29; a bare name (and agentVersion) before
        return f"{agent}@{run['agentVersion']}" if run.get("agentVersion") and "@" not in agent else agent
    return "-"


def tree_text(run: Mapping[str, Any], tree: Sequence[tuple[int, Mapping[str, Any]]]) -> str:
    """A parent's sub-agent runs as an indented tree (id, agent, status, tokens, cost), and its totals."""
    lines = []
    if tree:
        rows = [("  " * level + str(c["id"]), agent_of(c), str(c["status"]), f"{c.get('tokensUsedTotal', 0)} tokens",
                 usd(c.get("costUsdTotal"))) for level, c in tree]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines.append(f"children ({sum(1 for level, _ in tree if level == 1)}):")
        lines += ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)), r[4]]) for r in rows]
    if tree or may_have_children(run):
        lines.append(f"totals: {run.get('tokensUsedTotal', run['tokensUsed'])} tokens, "
                     f"{usd(run.get('costUsdTotal', run.get('costUsd')))} with its sub-agents "
                     f"(own: {run['tokensUsed']} tokens, {usd(run.get('costUsd'))})")
    return "\n".join(lines)


def children_table(children: Sequence[Mapping[str, Any]]) -> str:
    if not children:
        return "no children"
    header = ["ID", "AGENT", "CALL", "STATUS", "TOKENS", "COST", "ACTIVE", "ERROR"]
    rows = [[c["id"], agent_of(c), c.get("parentToolUseId") or "-", c["status"], str(c.get("tokensUsedTotal", 0)),
             usd(c.get("costUsdTotal")), str(c.get("childrenActive", 0)),
             (c.get("error") or "-").replace("\n", " ")[:60]] for c in children]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def answer_text(output: Any) -> str:
    """A run's answer for a terminal: its text, or a structured one as JSON."""
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2)


def pending_table(calls: Sequence[Mapping[str, Any]]) -> str:
    if not calls:
        return "nothing pending"
    header = ["TOOL_USE_ID", "TOOL", "KIND", "ATTEMPT", "SINCE", "INPUT"]
    rows = [[c["toolUseId"], c["tool"], c["kind"], str(c.get("attempt", 0)), c["since"][:19].replace("T", " "),
             json_text(c.get("input"), 60)] for c in calls]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def runs_table(page: Mapping[str, Any]) -> str:
    header = ["ID", "STATUS", "CREATED", "STEPS", "TOKENS", "COST", "LABELS", "INPUT"]
    rows = [
        [r["id"], r["status"], r["createdAt"][:19].replace("T", " "), str(r["steps"]), str(r["tokensUsed"]),
         usd(r.get("costUsd")), labels_text(r.get("labels")), r["inputPreview"].replace("\n", " ")[:60]]
        for r in page["items"]
    ]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    if page.get("next"):
        lines.append(f"more: --after {page['next']} (or --all)")
    return "\n".join(lines)


def usd(cost: Any) -> str:
    """A cost for people: `$0.0123`, or `unpriced` when the API says null (the model has no price, so the
    cost is unknown, not zero)."""
    return "unpriced" if cost is None else f"${cost:.4f}"


def labels_text(labels: Any) -> str:
    """A run's labels as `k=v,k2=v2` (sorted), `-` for none."""
    if not isinstance(labels, Mapping) or not labels:
        return "-"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def plural(n: int, word: str) -> str:
    """`1 decision`, `2 decisions`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def json_text(value: Any, limit: int | None = None) -> str:
    """A value as compact JSON (a tool's input as the model wrote it), cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


def waiting_text(run_id: str, calls: Sequence[Mapping[str, Any]]) -> str:
    """What a person must do for a WAITING run's pending calls: each call, and the command that decides it."""
    lines = []
    for c in calls:
        kind = c.get("kind")
        if kind == "approval":
            choices = "approve|deny"
        elif kind in ("timer", "event", "children"):
            what = "its sub-agents" if kind == "children" else f"a {kind}"
            lines.append(f"  waiting for {what}" + (f" (key {c['key']})" if c.get("key") else "")
                         + (f" until {c['wakeAt']}" if c.get("wakeAt") else ""))
            continue
        else:
            choices = "retry|record --output TEXT|fail"
        lines.append(f"  waiting for a decision: {c.get('tool')} {json_text(c.get('input'), 200)} ({kind}, "
                     f"call {c.get('toolUseId')})")
        lines.append(f"    decide: agentrun runs decide {run_id} {c.get('toolUseId')} {choices}")
    return "\n".join(lines)


def finished_line(run: Mapping[str, Any]) -> str:
    why = f" error={run['error']}" if run.get("error") else ""
    line = f"run {run['id']} {run['status']} tokens={run['tokensUsed']} cost={usd(run.get('costUsd'))}{why}"
    if run.get("output") is not None:
        line += f"\n{answer_text(run['output'])}"
    return line


# Bidirectional overrides and isolates: they reorder what a terminal shows ("Trojan Source").
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def terminal_safe(text: str) -> str:
    """Text for a person's terminal: control characters (escape sequences among them) and bidi overrides
    shown as `\\x1b`-style escapes, so run input or a model's output cannot rewrite the screen."""
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if c in _BIDI or (unicodedata.category(c) in ("Cc", "Cs") and c not in "\n\t") else c
        for c in text
    )


def emit(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()
