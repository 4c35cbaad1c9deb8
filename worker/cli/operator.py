"""`agentrun operator`: the operator's settings from its flags and environment, then the operator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from agentrun.worker.cli.arguments import database_url, module_list

log = logging.getLogger("agentrun.cli")


def cmd_operator(args: argparse.Namespace) -> int:
    from agentrun.operator.handlers import run
    from agentrun.operator.settings import OperatorSettings, namespace_tenants
    from agentrun.worker.core.pricing import PriceTable

    tool_names = None
    modules = module_list(args.tools or os.environ.get("AGENTRUN_TOOLS", ""))
    if modules:
        from agentrun.worker.tools import load_tool_modules

        try:
            tool_names = frozenset(t.name for t in load_tool_modules(modules))
        except (ImportError, ValueError) as e:
            raise SystemExit(f"agentrun: cannot load tools from {', '.join(modules)}: {e}") from None
        tool_names = with_mcp_tools(tool_names, os.environ.get("AGENTRUN_MCP_SERVERS") or None)
    try:
        prices = PriceTable.load(os.environ.get("AGENTRUN_PRICES_FILE") or None)
    except (OSError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot read the price table (AGENTRUN_PRICES_FILE): {e}") from None
    try:
        tenants = namespace_tenants(os.environ.get("AGENTRUN_NAMESPACE_TENANTS"))
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None
    settings = OperatorSettings(
        database_url=database_url(args),
        namespaces=tuple(args.namespace or ()),
        standalone=args.peering is None,
        peering_name=args.peering,
        tool_names=tool_names,
        resync_seconds=args.resync_seconds,
        prices=prices,
        port=args.port or None,
        namespace_tenants=tenants,
    )
    asyncio.run(run(settings, migrate_first=not args.no_migrate))
    return 0


def with_mcp_tools(names: frozenset[str], path: str | None) -> frozenset[str] | None:
    """The tool names spec.tools is checked against, with those of the MCP servers (AGENTRUN_MCP_SERVERS).

    The operator calls no MCP server, so it knows a server's tools only from its `tools` allow-list;
    one server without a list makes any name possible, and spec.tools is then not checked (None)."""
    from agentrun.worker.tools.mcp import McpConfigError, load_servers
    from agentrun.worker.tools.mcp.results import exposed_name

    try:
        # Header variables are the workers' secrets: the operator needs none of them to know the names.
        servers = load_servers(path, _AnyVariable())
    except McpConfigError as e:
        raise SystemExit(f"agentrun: AGENTRUN_MCP_SERVERS: {e}") from None
    if any(s.tools is None for s in servers):
        open_ = ", ".join(s.name for s in servers if s.tools is None)
        log.info("spec.tools is not checked: MCP servers without a `tools` list (%s) may offer any tool", open_)
        return None
    return names | {exposed_name(s.name, t) for s in servers for t in s.tools or ()}


class _AnyVariable(dict[str, str]):
    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return ""
