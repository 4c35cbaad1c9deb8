"""The `runs` commands' requests and text for issue 29's fields: `runs list`'s filters and paging, labels,
`unpriced` costs, `runs submit --output-schema/--label`, a watched run that waits for a person. Against a
recording transport: the requests the CLI builds are checked as the API (tests/api/test_runs_api.py) reads them."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrun.worker.api.schemas import rfc3339
from agentrun.worker.cli import client, runs
from agentrun.worker.cli.parser import build_parser

RUN_ID = "0e9b3c8a-8f3f-4a8e-9a53-6d2f0c1b7a11"


def summary(**fields: Any) -> dict[str, Any]:
    return {"id": RUN_ID, "status": "SUCCEEDED", "createdAt": "2026-12-02T10:00:00.123Z", "steps": 3,
            "tokensUsed": 437, "costUsd": None, "inputPreview": "Which acme tickets are overdue?",
            "labels": {}, **fields}


class Api:
    """A server answering from `answer(request)`, keeping the requests."""

    def __init__(self, answer: Callable[[httpx.Request], Any]) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json=self.answer(request))


def run_command(server: Api, *argv: str) -> tuple[int, str]:
    """`agentrun runs ARGV` against `server`: its exit status and what it printed."""
    args = build_parser().parse_args(["runs", *argv])
    out: list[str] = []

    def show(value: object, text: str) -> None:
        out.append(json.dumps(value) if args.json else text)

    with client.RunsClient("http://agentrun.test", transport=httpx.MockTransport(server)) as api:
        code = runs.COMMANDS[args.runs_command](api, args, show)
    return code, "\n".join(out)


def test_every_filter_is_a_query_parameter_by_its_api_name() -> None:
    server = Api(lambda r: {"items": [], "next": None})
    code, _ = run_command(server, "list", "--status", "running,Waiting", "-l", "team=billing,env!=prod",
                          "--model", "claude-sonnet-4-5", "--agent", "triage@2", "--created-by", "alice",
                          "--parent", RUN_ID, "--created-after", "2026-12-01", "--created-before",
                          "2026-12-02T09:00:00Z", "-q", "acme", "--limit", "20")
    assert code == 0
    assert dict(server.requests[0].url.params) == {
        "status": "RUNNING,WAITING", "labelSelector": "team=billing,env!=prod", "model": "claude-sonnet-4-5",
        "agent": "triage@2", "createdBy": "alice", "parent": RUN_ID,
        "createdAfter": datetime.datetime(2026, 12, 1).astimezone().isoformat(),  # this machine's midnight
        "createdBefore": "2026-12-02T09:00:00+00:00", "q": "acme", "limit": "20"}
    code, _ = run_command(server, "list", "--label-selector", "tier in (a,b)", "--query", "x")
    assert dict(server.requests[1].url.params) == {"labelSelector": "tier in (a,b)", "q": "x"}


@pytest.mark.parametrize("written", ["2026-12-01", "2026-12-01T09:30", "2026-12-01T09:30:00Z",
                                     "2026-12-01T09:30:00.5+05:30"])
def test_a_time_is_sent_as_an_instant_the_api_takes(written: str) -> None:
    """The API takes a time with its offset only; the CLI reads a date or a time without one in this
    machine's time zone, and sends it with that offset."""
    sent = runs.timestamp(written)
    assert rfc3339(sent) == datetime.datetime.fromisoformat(sent)
    if written.endswith("Z") or "+" in written:
        assert datetime.datetime.fromisoformat(sent) == datetime.datetime.fromisoformat(written.replace("Z", "+00:00"))
    else:
        assert datetime.datetime.fromisoformat(sent).replace(tzinfo=None) == datetime.datetime.fromisoformat(written)


@pytest.mark.parametrize(("argv", "said"), [
    (["--status", "runing"], "use one or more of"),
    (["--created-after", "yesterday"], "is not an ISO 8601 date or time"),
    (["--after", RUN_ID, "--all"], "not allowed with argument"),
])
def test_bad_filters_are_refused_before_any_request(argv: list[str], said: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["runs", "list", *argv])
    assert exit.value.code == 2 and said in capsys.readouterr().err


def test_all_follows_the_cursor_to_the_last_page() -> None:
    def answer(request: httpx.Request) -> Any:
        item, following = pages[request.url.params.get("after")]
        return {"items": [summary(id=item["id"])], "next": following}

    cursors = {"c1": "11111111-1111-4111-8111-111111111111", "c2": "22222222-2222-4222-8222-222222222222"}
    pages: dict[str | None, tuple[dict[str, str], str | None]] = {None: ({"id": "r1"}, cursors["c1"]), cursors["c1"]: ({"id": "r2"}, cursors["c2"]),
             cursors["c2"]: ({"id": "r3"}, None)}
    server = Api(answer)
    code, out = run_command(server, "list", "--all", "--status", "succeeded", "--limit", "1")
    assert code == 0
    assert [r.url.params.get("after") for r in server.requests] == [None, cursors["c1"], cursors["c2"]]
    assert all(r.url.params["status"] == "SUCCEEDED" for r in server.requests)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["r1", "r2", "r3"]
    assert "more:" not in out


def test_the_table_shows_labels_and_unpriced_costs() -> None:
    server = Api(lambda r: {"items": [summary(labels={"team": "billing", "env": "dev"}),
                                      summary(costUsd=0.0123, labels={})], "next": RUN_ID})
    code, out = run_command(server, "list")
    header, unpriced, priced, more = out.splitlines()
    assert header.split() == ["ID", "STATUS", "CREATED", "STEPS", "TOKENS", "COST", "LABELS", "INPUT"]
    assert unpriced.split()[6:8] == ["unpriced", "env=dev,team=billing"]
    assert priced.split()[6:8] == ["$0.0123", "-"]
    assert "$0.0000" not in out
    assert more == f"more: --after {RUN_ID} (or --all)"


def test_get_says_unpriced_labels_and_one_decision() -> None:
    run = {"id": RUN_ID, "status": "WAITING", "model": "local", "tokensUsed": 40, "tokenBudget": 50000,
           "costUsd": None, "costUsdTotal": None, "steps": 1, "maxSteps": 100, "timeoutSeconds": 300,
           "tools": None, "createdAt": "2026-12-02T10:00:00Z", "pending": 1, "labels": {"team": "billing"},
           "agent": "triage@2", "agentVersion": 2, "input": "hi"}
    text = client.run_details(run)
    assert any(line.split() == ["cost", "unpriced"] for line in text.splitlines())
    assert f"1 decision (agentrun runs pending {RUN_ID})" in text
    assert "labels" in text and "team=billing" in text
    assert "triage@2" in text and "triage@2@2" not in text
    assert client.finished_line(run).startswith(f"run {RUN_ID} WAITING tokens=40 cost=unpriced")
    assert "unpriced" in client.tree_text(run, [(1, {**run, "id": "child"})])


def test_pending_inputs_are_json() -> None:
    calls = [{"toolUseId": "toolu_01", "tool": "refund", "kind": "approval", "attempt": 0,
              "since": "2026-12-02T10:00:00Z", "input": {"order": "A-1", "amount": 12.5, "note": "héllo"}}]
    table = client.pending_table(calls)
    assert '{"order": "A-1", "amount": 12.5, "note": "héllo"}' in table
    assert "'{" not in table


def test_submit_sends_the_output_schema_file_and_labels(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    server = Api(lambda r: {"id": RUN_ID, "status": "QUEUED"})
    code, out = run_command(server, "submit", "How many?", "--output-schema", str(tmp_path / "schema.json"),
                            "--label", "team=billing", "--label", "env=dev")
    assert (code, out) == (0, f"{RUN_ID} QUEUED")
    body = json.loads(server.requests[0].content)
    assert body["outputSchema"] == schema and body["labels"] == {"team": "billing", "env": "dev"}


@pytest.mark.parametrize(("content", "said"), [(None, "cannot read"), ("{not json", "is not JSON")])
def test_a_bad_output_schema_file_is_said(tmp_path: Path, content: str | None, said: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["runs", "submit", "x", "--output-schema", str(path)])
    err = capsys.readouterr().err
    assert "--output-schema" in err and said in err


def test_watching_a_waiting_run_prints_the_call_and_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    waiting = {"id": RUN_ID, "status": "WAITING", "pending": 1, "tokensUsed": 40, "costUsd": None}
    done = {**waiting, "status": "SUCCEEDED", "pending": 0, "output": "approved and done"}
    events = (f"id: 1\nevent: run\ndata: {json.dumps(waiting)}\n\n"
              f"id: 2\nevent: run\ndata: {json.dumps(waiting)}\n\n"  # a second change: said once
              f"id: 3\nevent: end\ndata: {{}}\n\n")
    pending = [{"toolUseId": "toolu_01_refund", "tool": "refund", "kind": "approval", "attempt": 0,
                "since": "2026-12-02T10:00:00Z", "input": {"order": "A-1"}}]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, text=events, headers={"Content-Type": "text/event-stream"})
        if request.url.path.endswith("/pending"):
            return httpx.Response(200, json=pending)
        return httpx.Response(200, json=done)

    args = build_parser().parse_args(["runs", "watch", RUN_ID])
    with client.RunsClient("http://agentrun.test", transport=httpx.MockTransport(handler)) as api:
        code = runs.COMMANDS["watch"](api, args, lambda value, text: client.emit(sys.stdout, text))
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("waiting for a decision: refund {\"order\": \"A-1\"} (approval, call toolu_01_refund)") == 1
    assert f"decide: agentrun runs decide {RUN_ID} toolu_01_refund approve|deny" in out
    assert "None" not in out
