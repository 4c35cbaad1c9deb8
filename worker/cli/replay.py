"""`agentrun replay ...`: replay recorded runs against a change through the REST API, wait for the report, and
exit non-zero below a pass rate (docs/guides/replays.md: the CI recipe)."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.arguments import positive_float, positive_int
from agentrun.worker.cli.runs import CLIENT_ENV, Show, calling, timestamp

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient

EXIT_BELOW = 3
"""The pass rate is below --fail-under (or no pair could be judged)."""
EXIT_TIMEOUT = 4
"""--wait-timeout elapsed before every replay run had finished."""

FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")
SCORERS = "exact, schema_valid, same_tool_calls (the default), or a module:function of the server's " \
          "AGENTRUN_REPLAY_SCORERS"


def rate(text: str) -> float:
    """--fail-under: a pass rate from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a pass rate from 0 to 1 (0.9: nine in ten)")
    return value


def add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay", help="replay recorded runs against a new model, prompt, agent or tools, and report the difference",
        description="Replay recorded runs (by id, or those --selector, --status, --since and --of-agent find) against "
        "a change (--model, --system, --agent, --tools): one replay run each, whose tool calls are answered from "
        "the recording, so nothing touches the world. Waits until every replay run has finished, prints each "
        "recorded run with its replay's status, verdict, tool-call distance and tokens, then the pass rate and "
        "totals. Exit status: 0, or 3 when the pass rate is below --fail-under, 4 when --wait-timeout elapses "
        "first, 1 when the server refuses or cannot be reached. `agentrun replay show ID` prints a replay's report "
        f"again, `agentrun replay list` the replays. {CLIENT_ENV}",
        epilog="In CI: agentrun replay --selector team=billing --since 2026-12-01 --model claude-sonnet-4-6 "
        "--fail-under 0.9")
    p.add_argument("ids", nargs="*", metavar="RUN_ID",
                   help="recorded runs to replay; or `show ID` (a replay's report), or `list` (the replays)")
    p.add_argument("--url", help="server URL (default: $AGENTRUN_URL or http://localhost:8080)")
    p.add_argument("--json", action="store_true", help="print the server's JSON (the replay's report) instead of text")
    found = p.add_argument_group("which runs (instead of RUN_IDs): the tenant's finished runs, newest first")
    found.add_argument("--selector", "-l", metavar="SELECTOR",
                       help="runs whose labels match, Kubernetes syntax: team=billing,env!=prod")
    found.add_argument("--status", metavar="STATUS[,STATUS]", type=_finished,
                       help="runs that ended so: SUCCEEDED, FAILED, CANCELLED, TIMED_OUT (default: any of them)")
    found.add_argument("--since", type=timestamp, metavar="TIME",
                       help="runs created after TIME (ISO 8601: 2026-12-01T00:00:00Z; a date or a time without an "
                       "offset is in this machine's time zone)")
    found.add_argument("--limit", type=positive_int, metavar="N", help="the newest N matching runs (default: 100, "
                       "at most 1000)")
    found.add_argument("--of-agent", metavar="NAME[@N]", help="runs made from this agent")
    change = p.add_argument_group("the change")
    change.add_argument("--model", help="the model the replay runs ask")
    change.add_argument("--system", metavar="TEXT", help="the system prompt")
    change.add_argument("--agent", metavar="NAME@VERSION", help="an agent version whose fields replace the recorded "
                        "runs'")
    change.add_argument("--tools", metavar="A,B", type=_names, help="the tools offered, comma-separated")
    how = p.add_argument_group("how")
    how.add_argument("--from-seq", type=positive_int, metavar="N",
                     help="keep each recorded run's steps before seq N and diverge from there")
    how.add_argument("--tool-policy", choices=("recorded", "recorded_then_live_readonly"),
                     help="recorded (the default): every call answered from the recording, an unmatched one gets an "
                     "error result; recorded_then_live_readonly: an unmatched call runs if its tool only reads")
    how.add_argument("--scorer", metavar="NAME", help=f"what passes: {SCORERS}")
    how.add_argument("--fail-under", type=rate, metavar="RATE",
                     help="exit 3 when the pass rate is below RATE (0 to 1)")
    how.add_argument("--wait-timeout", type=positive_float, metavar="SECONDS",
                     help="give up waiting after this long and exit 4 (default: wait until done)")
    how.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                     help="seconds between looks at the replay (default: 1)")
    how.add_argument("--idempotency-key", metavar="KEY",
                     help="retrying with the same key returns the same replay instead of making another")
    p.set_defaults(func=cmd_replay, client=True)


def _finished(text: str) -> list[str]:
    names = [t.strip().upper() for t in text.split(",") if t.strip()]
    if not names or any(n not in FINISHED for n in names):
        raise argparse.ArgumentTypeError(f"{text!r}: use one or more of {', '.join(FINISHED)}, comma-separated")
    return list(dict.fromkeys(names))


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def cmd_replay(args: argparse.Namespace) -> int:
    ids = list(args.ids)
    if ids[:1] == ["show"]:
        if len(ids) != 2:
            raise SystemExit("agentrun replay show: give one replay id")
        return calling(args, _show)
    if ids[:1] == ["list"]:
        if len(ids) != 1:
            raise SystemExit("agentrun replay list: takes no argument")
        return calling(args, _list)
    selecting = any(v is not None for v in (args.selector, args.status, args.since, args.limit, args.of_agent))
    if bool(ids) == selecting:
        raise SystemExit("agentrun replay: give RUN_IDs, or find the runs with --selector/--status/--since/--limit/"
                         "--of-agent, one of them")
    return calling(args, _replay)


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /api/replays body the flags ask for."""
    from agentrun.worker.cli import client

    body: dict[str, Any] = {}
    if args.ids:
        body["runs"] = [client.checked_run_id(i) for i in args.ids]
    else:
        selector = {"labels": args.selector, "status": args.status, "since": _with_offset(args.since),
                    "limit": args.limit, "agent": args.of_agent}
        body["selector"] = {k: v for k, v in selector.items() if v is not None}
    change = {"model": args.model, "system": args.system, "agent": args.agent, "tools": args.tools}
    body["change"] = {k: v for k, v in change.items() if v is not None}
    optional = {"fromSeq": args.from_seq, "toolPolicy": args.tool_policy, "scorer": args.scorer}
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _with_offset(text: str | None) -> str | None:
    """An ISO time as the API wants it, with its offset (`timestamp` gave one already; a value set otherwise
    without one is taken as UTC)."""
    if text is None:
        return None
    import datetime

    at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (at if at.tzinfo is not None else at.replace(tzinfo=datetime.UTC)).isoformat()


def _replay(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    created = api.create_replay(request_body(args), args.idempotency_key)
    replay_id = str(created["id"])
    deadline = time.monotonic() + args.wait_timeout if args.wait_timeout is not None else None
    if not args.json:
        print(f"replay {replay_id}: {created['runs']} runs", flush=True)
    while True:
        report = api.replay(replay_id)
        if report["status"] == "COMPLETED":
            break
        if deadline is not None and time.monotonic() >= deadline:
            show(report, report_text(report) + f"\ngave up waiting after {args.wait_timeout:g}s: "
                 f"{report['finished']} of {report['runs']} replay runs finished "
                 f"(agentrun replay show {replay_id})")
            return EXIT_TIMEOUT
        time.sleep(args.interval if deadline is None else max(0.0, min(args.interval, deadline - time.monotonic())))
    show(report, report_text(report))
    return verdict(report, args.fail_under)


def verdict(report: Mapping[str, Any], fail_under: float | None) -> int:
    """The exit status of a completed replay: EXIT_BELOW under --fail-under (no judged pair counts as under)."""
    if fail_under is None:
        return 0
    rate = report.get("passRate")
    return EXIT_BELOW if rate is None or rate < fail_under else 0


def _show(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    report = api.replay(args.ids[1])
    show(report, report_text(report))
    return verdict(report, args.fail_under) if report["status"] == "COMPLETED" else 0


def _list(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    page = api.replays()
    header = ["ID", "STATUS", "CREATED", "RUNS", "FINISHED", "PASS RATE", "SCORER", "CHANGE"]
    rows = [[r["id"], r["status"], r["createdAt"][:19].replace("T", " "), str(r["runs"]), str(r["finished"]),
             _rate(r.get("passRate")), r["scorer"], _change(r.get("change") or {})] for r in page["items"]]
    show(page, _table(header, rows))
    return 0


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _change(change: Mapping[str, Any]) -> str:
    parts = [f"{k}={v if not isinstance(v, list) else ','.join(v)}" for k, v in change.items() if k != "system"]
    if "system" in change:
        parts.append("system=…")
    return " ".join(parts) or "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def _pass(value: Any) -> str:
    return "-" if value is None else "pass" if value else "FAIL"


def report_text(report: Mapping[str, Any]) -> str:
    """A replay's report for people: a line per recorded run, then the pass rate and the totals."""
    from agentrun.worker.cli.client import usd

    header = ["RECORDED RUN", "REPLAY RUN", "STATUS", "PASS", "TOOL CALLS", "DISTANCE", "TOKENS"]
    rows = []
    for r in report["results"]:
        diff = r.get("diff") or {}
        calls = diff.get("toolCalls") or {}
        count = calls.get("count") or {}
        tokens = diff.get("tokens") or {}
        rows.append([
            r["recordedRunId"], r["replayRunId"], r["status"], _pass(r.get("pass")),
            f"{count['recorded']}→{count['replayed']}" if count else "-",
            str(calls["distance"]) if "distance" in calls else "-",
            f"{tokens.get('recorded')}→{tokens.get('replayed')}" if tokens.get("recorded") is not None else "-",
        ])
        if diff.get("error") and isinstance(diff["error"], str):  # a pruned recording
            rows[-1][3] += " (" + diff["error"] + ")"
        elif diff.get("scorerError"):
            rows[-1][3] += f" (scorer: {diff['scorerError']})"
    judged = [r for r in report["results"] if r.get("pass") is not None]
    passed = sum(1 for r in judged if r["pass"])
    tokens, cost = report["tokens"], report["costUsd"]
    lines = [
        _table(header, rows),
        "",
        f"replay {report['id']} {report['status']}: {report['finished']} of {report['runs']} runs finished, "
        f"scorer {report['scorer']}, tool policy {report['toolPolicy']}",
        f"pass rate: {_rate(report.get('passRate'))} ({passed} of {len(judged)} judged)",
        f"tokens: recorded {tokens['recorded']}, replayed {tokens['replayed']}{_delta(tokens)}",
        f"cost: recorded {usd(cost['recorded'])}, replayed {usd(cost['replayed'])}{_delta(cost)}",
    ]
    return "\n".join(lines)


def _delta(pair: Mapping[str, Any]) -> str:
    recorded, replayed = pair.get("recorded") or 0, pair.get("replayed") or 0
    if not recorded:
        return ""
    return f" ({(replayed - recorded) / recorded:+.0%})"

