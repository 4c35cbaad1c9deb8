"""`agentrun agents ...`: agent definitions through the REST API (create or a new version, list, get, delete)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.arguments import positive_int
from agentrun.worker.cli.runs import CLIENT_ENV, Show, calling, client_commands

if TYPE_CHECKING:
    from agentrun.worker.cli.client import RunsClient

FILE_HELP = """The file holds one agent, YAML or JSON, with the fields of POST /api/agents: name (required, a DNS
label), description, system, model, tools, requireApproval, outputSchema, maxSteps, tokenBudget,
costBudgetUsd, timeoutSeconds, subAgents. A field left out is left to each run of the agent."""


def add_agents(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agents = sub.add_parser(
        "agents",
        help="create, list, show and delete agent definitions through the REST API",
        description="Agent definitions, versioned: a name given once and run many times (`agentrun runs submit "
        "--agent NAME[@N]`). Each change of definition is a new version; a run is pinned to the version it "
        "got. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = agents.add_subparsers(dest="agents_command", required=True, metavar="COMMAND")

    command = client_commands(commands, cmd_agents, tenant=True)

    p = command("create", "create an agent, or a new version of it",
                "Create the agent the file defines, or a new version of it; a definition identical to the latest "
                "version makes none (it says so). Prints the name and version. " + FILE_HELP)
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="the definition, YAML or JSON; - for stdin")
    command("list", "list agents", "List the agents, each at its latest version, by name.")
    p = command("get", "show an agent", "Show an agent's latest version, or the version --version names.")
    p.add_argument("name", metavar="NAME", help="the agent's name")
    p.add_argument("--version", type=positive_int, metavar="N", help="this version (default: the latest)")
    p.add_argument("--versions", action="store_true", help="list every version instead")
    p = command("delete", "delete an agent",
                "Delete an agent: new runs naming it are refused; runs in flight finish with the version they "
                "are pinned to. Creating it again undeletes it.")
    p.add_argument("name", metavar="NAME", help="the agent's name")


def cmd_agents(args: argparse.Namespace) -> int:
    return calling(args, COMMANDS[args.agents_command])


def read_definition(
    path: str, stdin: Callable[[], str] = lambda: sys.stdin.read(), what: str = "agent"
) -> dict[str, Any]:
    """The body a definition file holds, or ClientError saying why it holds none."""
    import orjson
    import yaml

    from agentrun.worker.cli.client import ClientError

    where = "stdin" if path == "-" else repr(path)
    try:
        text = stdin() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ClientError(0, f"cannot read the {what} definition {where}: {e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClientError(0, f"the {what} definition {where} is not YAML or JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ClientError(0, f"the {what} definition {where} must be a mapping of its fields (name, system, ...)")
    try:
        # YAML has dates and non-string keys, JSON has neither: say so here rather than send them mangled.
        return orjson.loads(orjson.dumps(doc))  # type: ignore[no-any-return]
    except TypeError as e:
        raise ClientError(0, f"the {what} definition {where} holds a value JSON cannot carry: {e}") from None


def _create(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    created, new = api.create_agent(read_definition(args.file))
    how = "created" if new else "unchanged: identical to the latest version"
    show(created, f"agent {created['name']} version {created['version']} ({how})")
    return 0


def _list(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    listed = api.agents()
    show(listed, agents_table(listed["items"]))
    return 0


def _get(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    if args.versions:
        versions = api.agent_versions(args.name)
        show(versions, agents_table(versions["items"]))
        return 0
    agent = api.agent(args.name, args.version)
    show(agent, agent_details(agent))
    return 0


def _delete(api: RunsClient, args: argparse.Namespace, show: Show) -> int:
    api.delete_agent(args.name)
    show({"name": args.name, "deleted": True}, f"agent {args.name} deleted")
    return 0


COMMANDS: dict[str, Callable[[RunsClient, argparse.Namespace, Show], int]] = {
    "create": _create, "list": _list, "get": _get, "delete": _delete,
}


# -- text --------------------------------------------------------------------------------------------


def _names(values: Any, none: str = "-") -> str:
    return ", ".join(values) if values else ("none" if values == [] else none)


def agents_table(items: list[Mapping[str, Any]]) -> str:
    if not items:
        return "no agents"
    header = ["NAME", "VERSION", "MODEL", "TOOLS", "SUB-AGENTS", "CREATED", "DESCRIPTION"]
    rows = [[a["name"], str(a["version"]), a.get("model") or "-", _names(a.get("tools"), "all"),
             _names(a.get("subAgents")), (a.get("createdAt") or "-")[:19].replace("T", " "),
             (a.get("description") or "").replace("\n", " ")[:60]] for a in items]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def agent_details(agent: Mapping[str, Any]) -> str:
    import json

    cost = agent.get("costBudgetUsd")
    fields = [
        ("name", agent["name"]), ("version", str(agent["version"])), ("model", agent.get("model") or "-"),
        ("tools", _names(agent.get("tools"), "all")), ("approval", _names(agent.get("requireApproval"))),
        ("sub-agents", _names(agent.get("subAgents"))),
        ("max steps", _or_dash(agent.get("maxSteps"))), ("tokens", _or_dash(agent.get("tokenBudget"))),
        ("cost", f"${cost:.4f}" if cost is not None else "-"),
        ("timeout", f"{agent['timeoutSeconds']}s" if agent.get("timeoutSeconds") else "-"),
        ("created", agent.get("createdAt") or "-"), ("created by", agent.get("createdBy") or "-"),
    ]
    if agent.get("description"):
        fields.append(("description", agent["description"]))
    if agent.get("outputSchema") is not None:
        fields.append(("output schema", json.dumps(agent["outputSchema"], ensure_ascii=False)))
    if agent.get("system"):
        fields.append(("system", agent["system"]))
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)


def _or_dash(value: Any) -> str:
    return str(value) if value is not None else "-"
