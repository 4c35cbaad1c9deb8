"""`agentrun schedules ...`: schedules through the REST API (create, list, get, suspend, resume, delete)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.arguments import positive_int
from agentrun.worker.cli.runs import CLIENT_ENV, Show, calling, client_commands

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient

CREATE_HELP = """The flags are the fields of POST /api/schedules. The run each tick starts is --run, a JSON
object with the fields of POST /api/runs (input, tokenBudget, timeoutSeconds, agent, tools, ...). -f FILE
gives the whole body instead (YAML or JSON); flags given beside it override its fields."""


def add_schedules(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schedules = sub.add_parser(
        "schedules",
        help="create, list, show, suspend, resume and delete schedules through the REST API",
        description="Schedules: a run started by the clock, by a 5-field cron expression in a time zone or every "
        "--interval-seconds; exactly one run per tick across every worker. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = schedules.add_subparsers(dest="schedules_command", required=True, metavar="COMMAND")

    command = client_commands(commands, cmd_schedules, tenant=True)

    p = command("create", "create a schedule", "Create a schedule; its first tick is the first after now. "
                + CREATE_HELP)
    p.add_argument("name", metavar="NAME", nargs="?", help="the schedule's name, a DNS label (or the file's `name`)")
    p.add_argument("-f", "--file", metavar="FILE", help="the whole body, YAML or JSON; - for stdin")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--cron", metavar="EXPR", help='a 5-field cron expression, such as "0 9 * * 1-5"')
    timing.add_argument("--interval-seconds", type=positive_int, metavar="N", help="a tick every N seconds")
    p.add_argument("--timezone", metavar="TZ", help="the IANA time zone --cron is read in (default UTC)")
    p.add_argument("--run", metavar="JSON", help="the run each tick starts, a JSON object as POST /api/runs takes")
    p.add_argument("--concurrency-policy", choices=["Allow", "Forbid", "Replace"],
                   help="Allow (default), Forbid (skip a tick while a run is active), Replace (cancel it)")
    p.add_argument("--starting-deadline-seconds", type=int, metavar="N",
                   help="how late a tick may still start (default 60); later ones are missed and counted")
    p.add_argument("--suspend", action="store_true", help="create it suspended")
    command("list", "list schedules", "List the schedules: name, schedule, suspend, last and next tick.")
    p = command("get", "show a schedule", "Show a schedule, or with --runs the runs it created (newest first).")
    p.add_argument("name", metavar="NAME", help="the schedule's name")
    p.add_argument("--runs", action="store_true", help="list the runs it created instead")
    for name, what in (("suspend", "no ticks until resumed"), ("resume", "ticks again, from the first after now")):
        p = command(name, f"{name} a schedule", f"{name.capitalize()} a schedule: {what}.")
        p.add_argument("name", metavar="NAME", help="the schedule's name")
    p = command("delete", "delete a schedule", "Delete a schedule: no more ticks; the runs it created stay.")
    p.add_argument("name", metavar="NAME", help="the schedule's name")


def cmd_schedules(args: argparse.Namespace) -> int:
    return calling(args, COMMANDS[args.schedules_command])


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /api/schedules body the arguments make, or ClientError saying why they make none."""
    import orjson

    from agentrun.worker.cli.agents import read_definition
    from agentrun.worker.cli.client import ClientError

    body: dict[str, Any] = read_definition(args.file, what="schedule") if args.file else {}
    if args.name is not None:
        body["name"] = args.name
    if args.cron is not None:
        body["cron"] = args.cron
        body.pop("intervalSeconds", None)
    if args.interval_seconds is not None:
        body["intervalSeconds"] = args.interval_seconds
        body.pop("cron", None)
    for attr, field in (("timezone", "timezone"), ("concurrency_policy", "concurrencyPolicy"),
                        ("starting_deadline_seconds", "startingDeadlineSeconds")):
        if getattr(args, attr) is not None:
            body[field] = getattr(args, attr)
    if args.suspend:
        body["suspend"] = True
    if args.run is not None:
        try:
            body["run"] = orjson.loads(args.run)
        except orjson.JSONDecodeError as e:
            raise ClientError(0, f"--run is not JSON: {e}") from None
    if "name" not in body:
        raise ClientError(0, "a schedule needs a NAME (or a file with `name`)")
    if not isinstance(body.get("run"), dict):
        raise ClientError(0, "a schedule needs --run, a JSON object: the run each tick starts")
    return body


def _create(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    created = api.create_schedule(create_body(args))
    show(created, f"schedule {created['name']} created; next tick {created.get('nextScheduleTime') or '-'}")
    return 0


def _list(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    listed = api.schedules()
    show(listed, schedules_table(listed["items"]))
    return 0


def _get(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    if args.runs:
        runs = api.schedule_runs(args.name)
        show(runs, "\n".join(f"{r['id']}  {r['status']:<10} {r.get('scheduledTime') or '-'}" for r in runs)
             or "no runs yet")
        return 0
    found = api.schedule(args.name)
    show(found, schedule_details(found))
    return 0


def _suspend(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    changed = api.patch_schedule(args.name, {"suspend": True})
    show(changed, f"schedule {args.name} suspended")
    return 0


def _resume(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    changed = api.patch_schedule(args.name, {"suspend": False})
    show(changed, f"schedule {args.name} resumed; next tick {changed.get('nextScheduleTime') or '-'}")
    return 0


def _delete(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    api.delete_schedule(args.name)
    show({"name": args.name, "deleted": True}, f"schedule {args.name} deleted")
    return 0


COMMANDS: dict[str, Callable[[RunsClient, argparse.Namespace, Show], int]] = {
    "create": _create, "list": _list, "get": _get, "suspend": _suspend, "resume": _resume, "delete": _delete,
}


def timing(s: Mapping[str, Any]) -> str:
    if s.get("cron"):
        return f"{s['cron']} ({s.get('timezone') or 'UTC'})"
    return f"every {s.get('intervalSeconds')}s"


def _when(value: Any) -> str:
    return str(value)[:19].replace("T", " ") if value else "-"


def schedules_table(items: list[Mapping[str, Any]]) -> str:
    if not items:
        return "no schedules"
    header = ["NAME", "SCHEDULE", "SUSPEND", "LAST", "NEXT", "ACTIVE"]
    rows = [[s["name"], timing(s), str(bool(s.get("suspend"))).lower(), _when(s.get("lastScheduleTime")),
             _when(s.get("nextScheduleTime")), str(s.get("active", 0))] for s in items]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def schedule_details(s: Mapping[str, Any]) -> str:
    import json

    fields = [
        ("name", s["name"]), ("schedule", timing(s)), ("suspend", str(bool(s.get("suspend"))).lower()),
        ("concurrency", s.get("concurrencyPolicy") or "Allow"),
        ("deadline", f"{s.get('startingDeadlineSeconds')}s"), ("last", _when(s.get("lastScheduleTime"))),
        ("next", _when(s.get("nextScheduleTime"))), ("active", str(s.get("active", 0))),
        ("missed", str(s.get("missed", 0))), ("run", json.dumps(s.get("run"), ensure_ascii=False)),
    ]
    if s.get("lastError"):
        fields.append(("last error", s["lastError"]))
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)
