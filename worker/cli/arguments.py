"""What the commands' arguments share: value types for argparse, the database option, module lists."""

from __future__ import annotations

import argparse
import math
import os

DATABASE_HELP = "PostgreSQL URL (default: $AGENTRUN_DATABASE_URL)"


def add_database(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", metavar="URL", help=DATABASE_HELP)


def database_url(args: argparse.Namespace) -> str:
    url = args.database_url or os.environ.get("AGENTRUN_DATABASE_URL")
    if not url:
        raise SystemExit("agentrun: no database: pass --database-url or set AGENTRUN_DATABASE_URL")
    return str(url)


def module_list(text: str) -> tuple[str, ...]:
    """Modules named in a comma-separated list (AGENTRUN_TOOLS, --tools); blanks and spaces ignored."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


# The value types below keep their names: argparse prints a type's name when it raises ValueError
# ("invalid _positive_int value: 'x'"), so a rename would change the CLI's error messages.

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m`, `2h` or `30d` (--delay, --older-than)."""
    t = text.strip().lower()
    scale = DURATION_UNITS.get(t[-1:], None)
    number = t[:-1] if scale is not None else t
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (like 90, 90s, 15m, 2h or 30d)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration of zero or more")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


port = _port
positive_int = _positive_int
non_negative_int = _non_negative_int
positive_float = _positive_float
non_negative_float = _non_negative_float


def context_management(text: str) -> dict[str, object]:
    """--context-management: a strategy's name (`summarize`) or the JSON object the API takes
    (`{"strategy": "summarize", "keepRecentTurns": 3}`), checked as the API checks it (core/context.parse)."""
    import orjson

    from agentrun.worker.core.context import parse

    value: object = {"strategy": text.strip()}
    if text.lstrip().startswith("{"):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"is not a JSON object: {e}") from None
    try:
        return parse(value, "--context-management").to_json()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
