"""`agentrun runs ...`: the REST API's client commands (worker/cli/client.py makes the calls and the text)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentrun.worker.cli.arguments import context_management, duration, positive_float, positive_int
from agentrun.worker.core.records import Decision, RunStatus

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient

CLIENT_ENV = (
    "Environment: AGENTRUN_URL (server, default http://localhost:8080), AGENTRUN_API_TOKEN (bearer token, "
    "when the server requires one)."
)

Show = Callable[[object, str], None]
"""Prints an answer: the server's JSON with --json, else the text made of it."""
Command = Callable[[str, str, str], argparse.ArgumentParser]
"""Adds a client sub-command: its name, help and description."""


def client_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], func: Callable[[argparse.Namespace], int],
    tenant: bool = False,
) -> Command:
    """The sub-command maker of a REST client command group: each takes --url and --json (and with `tenant`,
    --tenant), runs `func`, and says which environment it reads."""

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=f"{description} {CLIENT_ENV}")
        p.add_argument("--url", help="server URL (default: $AGENTRUN_URL or http://localhost:8080)")
        p.add_argument("--json", action="store_true", help="print the server's JSON instead of text")
        if tenant:
            add_tenant(p)
        p.set_defaults(func=func, client=True)
        return p

    return command


def add_tenant(p: argparse.ArgumentParser, help: str = "the tenant to act for (a platform operator's identity only; "
               "default: the identity's own tenant, or `default` for a platform operator's)") -> None:
    """--tenant: the tenant a platform operator's identity (tenant "*") acts for."""
    p.add_argument("--tenant", metavar="NAME", help=help)


# -- the parser ------------------------------------------------------------------------------------------


def add_runs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser(
        "runs",
        help="submit, inspect, follow and cancel runs through the REST API",
        description="A client of the REST API of a running `agentrun worker`. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    command = client_commands(commands, cmd_runs)

    _add_submit(command("submit", "queue a run", "Queue a run and print its id and status."))
    _add_fork(command("fork", "start a run from the first steps of another",
                      "Start a new run from the first --seq steps of run ID, whatever its status, and go on from "
                      "there; budgets and tools are the source's unless given."))
    p = command("pending", "list the tool calls waiting for a decision",
                "List the tool calls of a WAITING run that wait for a person: approvals, and calls in doubt "
                "after a crash.")
    p.add_argument("id", help="run id")
    _add_decide(command("decide", "decide a pending tool call",
                        "Decide a pending call: approve or deny an approval; retry, record (with --output) or fail a "
                        "call in doubt. When the last open call is decided, the run goes on."))
    p = command("get", "show a run", "Show a run: status, budgets, tokens, cost, error and times; for a "
                "sub-agent's run the parent run and call that started it, for a parent its sub-agents' runs as "
                "a tree (grandchildren indented) and the totals with them. --json prints the run alone.")
    p.add_argument("id", help="run id")
    p = command("children", "list the runs a run's sub-agent calls started",
                "List the child runs of a run's sub-agent calls, in call order: id, agent, call, status, tokens "
                "and cost (with their own descendants'), children at work, error.")
    p.add_argument("id", help="run id")
    p = command("timeline", "show a run's steps as a table",
                "Show a run's steps: seq, kind, tool, status, stop reason, tokens in/out, cache writes/reads, "
                "latency and the worker that wrote each.")
    p.add_argument("id", help="run id")
    p = command("cancel", "cancel a run",
                "Cancel a run: a queued or waiting run ends CANCELLED at once; for a running one the worker "
                "holding it is told at once, interrupts the model call or tool in flight (the tool step is "
                "recorded ERROR \"cancelled\") and ends it CANCELLED, within about a second. Its unfinished "
                "sub-agents' runs are cancelled too. Fails if the run has already finished.")
    p.add_argument("id", help="run id")
    p = command("watch", "follow a run's steps until it ends",
                "Print each step of a run as it happens, and the model's text as it streams, until the run "
                "ends (it follows GET /api/runs/{id}/events). While the run waits for a person it prints each "
                "pending call and the `runs decide` command for it, and goes on watching. Exits 0 if it "
                "SUCCEEDED, else 1.")
    p.add_argument("id", help="run id")
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds before resuming a dropped event stream (default: 1)")
    p = command("message", "send a message to a running run",
                "Send a message to a run while it works: it is stored at once and the model gets it as a user "
                "turn at the run's next turn boundary (after its current turn and tool calls; a WAITING run when "
                "it resumes). A finished run takes none: go on with `runs submit TEXT --continue-from ID`.")
    p.add_argument("id", help="run id")
    p.add_argument("text", metavar="TEXT", help="the message")
    p = command("list", "list runs, newest first",
                "List runs, newest first, a page at a time (--all: every page): id, status, creation time, "
                "steps, tokens, cost (`unpriced` when the model has no price), labels and the input's start. "
                "The filters combine (GET /api/runs's query parameters).")
    p.add_argument("--status", type=statuses, metavar="STATUS[,STATUS]",
                   help="only runs in this status, any case; several comma-separated (running,waiting)")
    add_tenant(p, "only runs of this tenant (an identity sees its own tenant's only; a platform operator's, every "
               "tenant's)")
    p.add_argument("-l", "--label-selector", metavar="SELECTOR",
                   help="only runs whose labels match, Kubernetes syntax: team=billing,env!=prod,"
                   "'tier in (a,b)',tier notin (c),key,!key")
    p.add_argument("--model", metavar="MODEL", help="only runs of this model")
    p.add_argument("--agent", metavar="NAME[@N]", help="only runs of this agent (any version, or version N)")
    p.add_argument("--created-by", metavar="IDENTITY", help="only runs submitted by this API identity")
    p.add_argument("--parent", metavar="ID",
                   help="only runs whose parent is this run: its sub-agents' runs, continuations and forks")
    p.add_argument("--created-after", type=timestamp, metavar="TIME",
                   help="only runs created at or after TIME (ISO 8601: 2026-12-01T09:00:00Z; a date or a time "
                   "without an offset is in this machine's time zone)")
    p.add_argument("--created-before", type=timestamp, metavar="TIME", help="only runs created before TIME")
    p.add_argument("-q", "--query", metavar="TEXT", help="only runs whose input contains TEXT (any case)")
    p.add_argument("--replays", action="store_true",
                   help="include the runs of replays (`agentrun replay`), left out by default")
    p.add_argument("--replay-id", metavar="ID", help="only the runs of this replay")
    p.add_argument("--limit", type=positive_int, metavar="N", help="runs per page (default: 50, at most 200)")
    paging = p.add_mutually_exclusive_group()
    paging.add_argument("--after", metavar="ID", help="the cursor a previous page printed, for the next page")
    paging.add_argument("--all", action="store_true", help="every matching run, fetching page after page")


def statuses(text: str) -> str:
    """--status: one status or several comma-separated, any case, as the API takes them; a typo is said
    here with the statuses there are."""
    names = [t.strip().upper() for t in text.split(",") if t.strip()]
    known = {s.value for s in RunStatus}
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"{text!r}: use one or more of {', '.join(sorted(known))}, comma-separated")
    return ",".join(names)


def timestamp(text: str) -> str:
    """--created-after/--created-before: an ISO 8601 date or datetime. The API takes an instant only (a time
    with its offset), so a date is its midnight and a time without an offset is this machine's local time,
    sent with that offset: what a person at this terminal means by `2026-12-01`."""
    import datetime

    written = text.strip()
    try:
        if len(written) == 10:  # a date alone, YYYY-MM-DD
            when = datetime.datetime.combine(datetime.date.fromisoformat(written), datetime.time())
        else:
            when = datetime.datetime.fromisoformat(written.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date or time (like 2026-12-01 or "
                                         "2026-12-01T09:00:00Z)") from None
    if when.tzinfo is None:
        when = when.astimezone()  # this machine's zone at that time (its DST included)
    return when.isoformat()


def label(text: str) -> tuple[str, str]:
    """--label KEY=VALUE (the API checks the syntax and names the label that is wrong)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value.strip()


def json_file(text: str) -> object:
    """--output-schema FILE: the JSON in FILE (`-`: standard input)."""
    import orjson

    try:
        data = sys.stdin.buffer.read() if text == "-" else open(text, "rb").read()  # noqa: SIM115
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e.strerror or e}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text} is not JSON: {e}") from None


def _add_submit(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="the request for the agent (the first user message)")
    add_tenant(p)
    p.add_argument("--budget", type=positive_int, metavar="N",
                   help="token budget, all kinds of tokens (default: 50000; with --agent, the agent's)")
    p.add_argument("--timeout", type=positive_int, metavar="S",
                   help="wall-clock limit in seconds (default: 300; with --agent, the agent's)")
    p.add_argument("--tool", action="append", metavar="NAME",
                   help="a tool the model may call (repeatable; default: every tool of the worker)")
    p.add_argument("--model", help="model name; a prefix picks the provider: bedrock/ID, vertex/MODEL, "
                   "NAME/MODEL for an endpoint of the server's AGENTRUN_PROVIDERS (default: the server's "
                   "AGENTRUN_DEFAULT_MODEL)")
    p.add_argument("--max-steps", type=positive_int, metavar="N", help="most steps the run may take (default: 100)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--output-schema", type=json_file, metavar="FILE",
                   help="a JSON Schema file (`-`: standard input): the run answers with a JSON value valid "
                   "against it (its `output`), through a `final_answer` tool call")
    p.add_argument("--label", type=label, action="append", metavar="KEY=VALUE",
                   help="a label of the run, to find it by (`runs list -l KEY=VALUE`); repeatable")
    p.add_argument("--cost-budget", type=positive_float, metavar="USD", help="spending limit in USD")
    p.add_argument("--priority", type=int, metavar="N",
                   help="higher runs are claimed first (default: 0; from -1000000 to 1000000)")
    p.add_argument("--delay", type=duration, metavar="DURATION",
                   help="start no sooner than this from now: seconds, or with a unit (90s, 15m, 2h, 1d); "
                   "the timeout counts from then")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="retrying with the same key returns the same run instead of queueing another")
    p.add_argument("--continue-from", metavar="ID",
                   help="go on with the whole conversation of this SUCCEEDED run; INPUT is the next message")
    p.add_argument("--require-approval", action="append", metavar="TOOL",
                   help="calls of this tool wait for a person's approval (repeatable; '*' for every tool)")
    p.add_argument("--agent", metavar="NAME[@N]",
                   help="run this agent definition (`agentrun agents`): its version N, else the latest, pinned "
                   "at submission; options given here override its fields, limits only downwards")
    p.add_argument("--sub-agent", action="append", metavar="NAME[@N]",
                   help="an agent the run may hand work to (repeatable; default: the agent's)")
    p.add_argument("--context-management", type=context_management, metavar="VALUE",
                   help="how the conversation is kept within the model's context window: a strategy (auto, "
                   "server, summarize, clear_tool_results, none) or a JSON object such as "
                   "'{\"strategy\": \"summarize\", \"keepRecentTurns\": 3, \"triggerTokens\": 150000}' "
                   "(default: the agent's, else the source's with --continue-from, else auto)")


def _add_fork(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="the run to fork")
    p.add_argument("--seq", type=positive_int, required=True, metavar="N", help="how many of its steps to keep")
    p.add_argument("--model", help="another model for the fork (default: the source's)")
    p.add_argument("--budget", type=positive_int, metavar="N", help="token budget (default: the source's)")
    p.add_argument("--timeout", type=positive_int, metavar="S", help="wall-clock limit (default: the source's)")


def _add_decide(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="run id")
    p.add_argument("tool_use_id", metavar="TOOL_USE_ID", help="the pending call (from `runs pending`)")
    p.add_argument("decision", choices=[d.value for d in Decision], metavar="DECISION",
                   help="approve | deny | retry | record | fail")
    p.add_argument("--output", metavar="TEXT", help="with record: what the call returned")
    p.add_argument("--is-error", action="store_true", help="with record: the call failed")
    p.add_argument("--reason", metavar="TEXT", help="why (the model sees it when a call is denied)")


# -- the commands ----------------------------------------------------------------------------------------
# Each makes its call(s) with `api` and prints with `show`; its return value is the exit status. The client
# module is imported when a command runs, not with the parser: `agentrun worker` does not need it.


def cmd_runs(args: argparse.Namespace) -> int:
    return calling(args, COMMANDS[args.runs_command])


def calling(args: argparse.Namespace, command: Callable[[RunsClient, argparse.Namespace, Show], int]) -> int:
    """Run a client command against the server of --url (or AGENTRUN_URL): its exit status, 1 with a
    message on stderr when the server refuses or cannot be reached."""
    import orjson

    from agentrun.worker.cli import client

    def show(value: object, text: str) -> None:
        client.emit(sys.stdout, orjson.dumps(value).decode() if args.json else client.terminal_safe(text))

    url = args.url or os.environ.get("AGENTRUN_URL") or client.DEFAULT_URL
    try:
        with client.RunsClient(url, os.environ.get("AGENTRUN_API_TOKEN") or None,
                               tenant=getattr(args, "tenant", None)) as api:
            return command(api, args, show)
    except client.ClientError as e:
        print(f"agentrun: {client.terminal_safe(str(e))}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, AttributeError) as e:  # JSON, but not the API's shapes: --url names another server
        print(f"agentrun: {url} answered without the expected fields ({type(e).__name__}: {e}); "
              "is it an agentrun worker?", file=sys.stderr)
        return 1


def _submit(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client
    from agentrun.worker.core.text import unstorable

    body: dict[str, object] = {"input": args.input}
    if args.agent is None:  # without an agent the run names its limits; an agent gives its own
        body.update(tokenBudget=args.budget or 50_000, timeoutSeconds=args.timeout or 300)
    optional = {"tokenBudget": args.budget, "timeoutSeconds": args.timeout, "agent": args.agent,
                "subAgents": args.sub_agent,
                "model": args.model, "maxSteps": args.max_steps, "tools": args.tool,
                "system": args.system, "costBudgetUsd": args.cost_budget,
                "continueFrom": client.checked_run_id(args.continue_from, "--continue-from")
                if args.continue_from else None,
                "requireApproval": args.require_approval, "priority": args.priority,
                "delaySeconds": args.delay, "contextManagement": args.context_management,
                "outputSchema": args.output_schema, "labels": dict(args.label) if args.label else None}
    body.update({k: v for k, v in optional.items() if v is not None})
    texts = [("input", args.input), ("model", args.model), ("system", args.system),
             *((f"tools[{i}]", t) for i, t in enumerate(args.tool or ())), ("agent", args.agent),
             *((f"subAgents[{i}]", t) for i, t in enumerate(args.sub_agent or ()))]
    for field, text in texts:
        # Bytes that were not UTF-8 arrive as lone surrogates, which no JSON body can carry.
        if why := unstorable(text):
            raise client.ClientError(0, f"{field}: {why}")
    created = api.submit(body, args.idempotency_key)
    show(created, f"{created['id']} {created['status']}")
    return 0


def _fork(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    fork: dict[str, object] = {"forkFrom": {"runId": client.checked_run_id(args.id), "seq": args.seq}}
    fork.update({k: v for k, v in {"model": args.model, "tokenBudget": args.budget,
                                    "timeoutSeconds": args.timeout}.items() if v is not None})
    created = api.submit(fork)
    show(created, f"{created['id']} {created['status']}")
    return 0


def _pending(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    calls = api.pending(args.id)
    show(calls, client.pending_table(calls))
    return 0


def _decide(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    decision: dict[str, object] = {"decision": args.decision}
    decision.update({k: v for k, v in {"output": args.output, "reason": args.reason}.items() if v is not None})
    if args.is_error:
        decision["isError"] = True
    run = api.decide(args.id, args.tool_use_id, decision)
    show(run, f"{run['id']} {run['status']} pending={run.get('pending', 0)}")
    return 0


def _message(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client
    from agentrun.worker.core.text import unstorable

    if why := unstorable(args.text):
        raise client.ClientError(0, f"text: {why}")
    sent = api.message(args.id, args.text)
    show(sent, f"{sent['runId']} message {sent['n']} accepted: the run gets it at its next turn boundary")
    return 0


def _get(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    run = api.get(args.id)
    if args.json:
        show(run, "")
        return 0
    details = client.run_details(run)  # first: an answer of another shape is said as such (cmd_runs)
    tree = client.tree_text(run, api.tree(run))
    show(run, details + (f"\n{tree}" if tree else ""))
    return 0


def _children(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    children = api.children(args.id)
    show(children, client.children_table(children))
    return 0


def _timeline(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    steps = api.timeline(args.id)
    claimable = "" if args.json else f"claimable from {api.get(args.id).get('runAt') or '-'}\n"
    show(steps, claimable + client.timeline_table(steps))
    return 0


def _cancel(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    run = api.cancel(args.id)
    requested = " (cancel requested)" if run["status"] == "RUNNING" else ""
    show(run, f"{run['id']} {run['status']}{requested}")
    return 0


def _list(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli import client

    filters = {"labelSelector": args.label_selector, "model": args.model, "agent": args.agent,
               "createdBy": args.created_by, "createdAfter": args.created_after,
               "createdBefore": args.created_before, "q": args.query, "replays": "true" if args.replays else None,
               "replayId": client.checked_run_id(args.replay_id, "--replay-id") if args.replay_id else None}
    if args.all:
        page = api.list_all(args.status, args.limit, args.parent, **filters)
    else:
        page = api.list(args.status, args.limit, args.after, args.parent, **filters)
    show(page, client.runs_table(page))
    return 0


def _watch(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    """Steps as they are written, the model's text as it streams (as it comes on its own line, in text);
    exits 0 if the run SUCCEEDED."""
    from agentrun.worker.cli import client

    if not args.json:
        client.emit(sys.stdout, client.step_header())
    streaming = [0]  # the seq whose text is being printed, 0 for none

    def step(row: dict[str, object]) -> None:
        if streaming[0]:
            client.emit(sys.stdout, "")
            streaming[0] = 0
        show(row, client.step_row(row))
        if not args.json and row.get("kind") == "USER" and row.get("seq") is not None:
            said = api.step(args.id, int(str(row["seq"])))  # the timeline row has no body: the message's text
            by = f" from {row['createdBy']}" if row.get("createdBy") else ""
            line = f"  user (seq {row['seq']}){by}: {said.get('response') or ''}"
            client.emit(sys.stdout, client.terminal_safe(line))

    def text(seq: int, fragment: str) -> None:
        if args.json:
            show({"seq": seq, "text": fragment}, fragment)
            return
        if streaming[0] != seq:
            sys.stdout.write(("\n" if streaming[0] else "") + f"  model (seq {seq}): ")
            streaming[0] = seq
        sys.stdout.write(client.terminal_safe(fragment))
        sys.stdout.flush()

    told: set[str] = set()  # the pending calls already printed: a run event comes with every change

    def changed(run: dict[str, object]) -> None:
        if run.get("status") != "WAITING" or not run.get("pending"):
            return
        calls = [c for c in api.pending(args.id) if str(c.get("toolUseId") or c.get("kind")) not in told]
        told.update(str(c.get("toolUseId") or c.get("kind")) for c in calls)
        if calls and not args.json:
            if streaming[0]:
                client.emit(sys.stdout, "")
                streaming[0] = 0
            client.emit(sys.stdout, client.terminal_safe(client.waiting_text(str(run["id"]), calls)))
        elif calls:
            show({"pending": calls}, "")

    run = api.watch(args.id, step, interval=args.interval, on_text=text, on_run=changed)
    if streaming[0]:
        client.emit(sys.stdout, "")
    show(run, client.finished_line(run))
    return 0 if run["status"] == "SUCCEEDED" else 1


COMMANDS: dict[str, Callable[[RunsClient, argparse.Namespace, Show], int]] = {
    "submit": _submit, "fork": _fork, "pending": _pending, "decide": _decide, "get": _get,
    "timeline": _timeline, "cancel": _cancel, "list": _list, "watch": _watch, "message": _message,
    "children": _children,
}
