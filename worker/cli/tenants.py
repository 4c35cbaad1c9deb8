"""`agentrun tenants ...`: tenants' quotas through the REST API (set, get, list), for a platform operator's
token (an `admin` identity of tenant `*`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.runs import CLIENT_ENV, Show, calling, client_commands
from agentrun.worker.core.tenants import MAX_WEIGHT, MIN_WEIGHT

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient

NO_LIMIT = "none"
"""What a limit flag takes to clear the limit."""

# (flag, API field, whole number?, what it limits)
LIMITS = (
    ("--max-running", "maxRunning", True, "runs of the tenant RUNNING at once, across every worker"),
    ("--max-queued", "maxQueued", True, "runs of the tenant QUEUED (delayed, scheduled and handed back too); "
     "a submit past it is refused (HTTP 429)"),
    ("--tokens-per-day", "tokensPerDay", True, "tokens its model steps may use over the last 1,440 minutes"),
    ("--cost-per-day-usd", "costPerDayUsd", False, "US dollars its model steps may cost over the last 1,440 "
     "minutes"),
)


def _limit(whole: bool) -> Callable[[str], int | float | None]:
    """A limit's value: a number of zero or more (`5e7` too), or `none` for no limit."""

    def limit(text: str) -> int | float | None:
        if text.strip().lower() == NO_LIMIT:
            return None
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (or {NO_LIMIT!r} for no limit)") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more (or {NO_LIMIT!r} for no limit)")
        if whole:
            if not value.is_integer():
                raise argparse.ArgumentTypeError(f"{text!r} must be a whole number (or {NO_LIMIT!r} for no limit)")
            return int(value)
        return value

    return limit


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (MIN_WEIGHT <= value <= MAX_WEIGHT):
        raise argparse.ArgumentTypeError(f"{text!r} must be at least {MIN_WEIGHT:g} and at most {MAX_WEIGHT:g}")
    return value


def add_tenants(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = sub.add_parser(
        "tenants",
        help="set and show tenants' quotas through the REST API",
        description="Tenants' quotas: runs running and queued, tokens and cost per rolling day, and a share "
        "weight. Needs the token of an admin identity of tenant '*'. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = tenants.add_subparsers(dest="tenants_command", required=True, metavar="COMMAND")
    command = client_commands(commands, cmd_tenants)

    p = command("set", "set a tenant's quotas", "Set a tenant's quotas, making the tenant if need be. A flag "
                f"not given keeps its current value; {NO_LIMIT!r} clears a limit. Every worker applies the "
                "change within a second.")
    p.add_argument("name", metavar="NAME", help="the tenant's name, a DNS label")
    for flag, _, whole, what in LIMITS:
        p.add_argument(flag, type=_limit(whole), metavar="N", default=argparse.SUPPRESS,
                       help=f"{what} ({NO_LIMIT!r}: no limit)")
    p.add_argument("--weight", type=_weight, metavar="W", default=argparse.SUPPRESS,
                   help="its share of the workers against other tenants with work waiting (more than 0, at most "
                   "1000; default 1)")
    p = command("get", "show a tenant", "Show a tenant's quotas and what it uses of them now.")
    p.add_argument("name", metavar="NAME", help="the tenant's name")
    command("list", "list tenants", "List the tenants: their quotas, runs queued and running, usage today.")


def cmd_tenants(args: argparse.Namespace) -> int:
    return calling(args, COMMANDS[args.tenants_command])


FIELDS = ("maxRunning", "maxQueued", "tokensPerDay", "costPerDayUsd", "weight")


def _set(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    from agentrun.worker.cli.client import ClientError

    try:
        current = api.tenant(args.name)
    except ClientError as e:
        if e.status != 404:
            raise
        current = {}  # a tenant without runs, never set: no limits
    body = {f: current[f] for f in FIELDS if current.get(f) is not None}
    given = vars(args)
    for flag, field, _, _ in LIMITS:
        if (attr := flag.removeprefix("--").replace("-", "_")) in given:
            body[field] = given[attr]
    if "weight" in given:
        body["weight"] = given["weight"]
    changed = api.put_tenant(args.name, body)
    show(changed, tenant_details(changed))
    return 0


def _get(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    found = api.tenant(args.name)
    show(found, tenant_details(found))
    return 0


def _list(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    listed = api.tenants()
    show(listed, tenants_table(listed["items"]))
    return 0


COMMANDS: dict[str, Callable[[RunsClient, argparse.Namespace, Show], int]] = {
    "set": _set, "get": _get, "list": _list,
}


def _shown(value: Any) -> str:
    if value is None:
        return NO_LIMIT
    return f"{value:g}" if isinstance(value, float) else str(value)


def tenant_details(t: Mapping[str, Any]) -> str:
    throttled = t.get("throttled")
    fields = [
        ("name", t["name"]), ("max running", _shown(t.get("maxRunning"))),
        ("max queued", _shown(t.get("maxQueued"))), ("tokens per day", _shown(t.get("tokensPerDay"))),
        ("cost per day", _shown(t.get("costPerDayUsd"))), ("weight", _shown(t.get("weight"))),
        ("queued", str(t.get("queued", 0))), ("running", str(t.get("running", 0))),
        ("tokens today", str(t.get("tokensToday", 0))), ("cost today", f"${t.get('costTodayUsd', 0):.4f}"),
        ("throttled", f"{throttled['quota']}: {throttled['reason']}" if throttled else "no"),
    ]
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)


def tenants_table(items: list[Mapping[str, Any]]) -> str:
    if not items:
        return "no tenants"
    header = ["NAME", "MAX-RUNNING", "MAX-QUEUED", "TOKENS/DAY", "COST/DAY", "WEIGHT", "QUEUED", "RUNNING",
              "TOKENS-TODAY", "THROTTLED"]
    rows = [[t["name"], _shown(t.get("maxRunning")), _shown(t.get("maxQueued")), _shown(t.get("tokensPerDay")),
             _shown(t.get("costPerDayUsd")), _shown(t.get("weight")), str(t.get("queued", 0)),
             str(t.get("running", 0)), str(t.get("tokensToday", 0)),
             (t.get("throttled") or {}).get("quota") or "-"] for t in items]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])
