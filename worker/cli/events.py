"""`agentrun events send KEY --payload JSON`: post an event for the runs that wait on its key (POST /api/events)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.runs import CLIENT_ENV, Show, calling, client_commands

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient


def json_value(text: str) -> Any:
    """A JSON value from the command line; argparse says why not (exit 2)."""
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}); quote a string as JSON: '\"text\"'") from None


def add_events(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = sub.add_parser(
        "events",
        help="send events to the runs that wait for them",
        description="Events from outside (a reply, a callback, a CI result) for runs waiting in wait_for_event or "
        "a Python tool's WaitForEvent. An event is kept for AGENTRUN_EVENT_RETENTION (default 24 h): a wait on "
        "its key that begins within it still gets it. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = events.add_subparsers(dest="events_command", required=True, metavar="COMMAND")
    p = client_commands(commands, cmd_events, tenant=True)(
        "send", "post an event (POST /api/events)",
        "Post the event KEY with a JSON payload: every run waiting on KEY gets the payload as its wait's result "
        "and goes on; prints the runs it woke. With --idempotency-key, sending it again answers the first answer "
        "and wakes nobody twice. Needs the scope signal (or submit).",
    )
    p.add_argument("key", metavar="KEY", help="the event's key, as the runs wait for it")
    p.add_argument("--payload", type=json_value, default=None, metavar="JSON",
                   help="the payload, any JSON value (default: null)")
    p.add_argument("--idempotency-key", metavar="KEY", help="a retry with the same key delivers nothing twice")


def cmd_events(args: argparse.Namespace) -> int:
    return calling(args, _send)


def _send(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    answer, replayed = api.send_event(args.key, args.payload, args.idempotency_key)
    woke = answer["woke"]
    again = " (a retry: the first answer, nothing delivered again)" if replayed else ""
    text = f"event {args.key} woke {len(woke)} run{'s' if len(woke) != 1 else ''}{again}"
    show(answer, "\n".join([text, *woke]))
    return 0
