"""The `agentrun` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from collections.abc import Sequence

from agentrun.worker.core.records import Decision, RunStatus
from agentrun.worker.obs import logs

log = logging.getLogger("agentrun.cli")

DATABASE_HELP = "PostgreSQL URL (default: $AGENTRUN_DATABASE_URL)"


def _database_url(args: argparse.Namespace) -> str:
    url = args.database_url or os.environ.get("AGENTRUN_DATABASE_URL")
    if not url:
        raise SystemExit("agentrun: no database: pass --database-url or set AGENTRUN_DATABASE_URL")
    return str(url)


def _add_database(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", metavar="URL", help=DATABASE_HELP)


# -- migrate ---------------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    import psycopg

    from agentrun.worker.store import migrate

    try:
        applied = asyncio.run(migrate.migrate(_database_url(args)))
    except psycopg.errors.InsufficientPrivilege as e:
        # The runtime role of docs/database-role.sql, as meant: nothing was changed (one transaction).
        raise SystemExit(f"agentrun: this database role may not change the schema ({e.diag.message_primary}); "
                         "run `agentrun migrate` as the owner role (the chart's database.migrationSecret)") from None
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print(f"schema is up to date (version {migrate.latest_version()})")
    return 0


# -- worker ----------------------------------------------------------------------------------------


def worker_id(args: argparse.Namespace) -> str:
    """`--id` exactly, or `--id-prefix` (else host-pid) with a suffix new with every process."""
    from agentrun.worker.settings import default_worker_id, process_worker_id

    return str(args.id) if args.id else process_worker_id(args.id_prefix) if args.id_prefix else default_worker_id()


def cmd_worker(args: argparse.Namespace) -> int:
    from agentrun.worker.settings import WorkerSettings

    settings = WorkerSettings(
        database_url=_database_url(args),
        worker_id=worker_id(args),
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        port=args.port,
        host=args.host,
        tool_modules=_module_list(os.environ.get("AGENTRUN_TOOLS", "")),
        mcp_servers_file=os.environ.get("AGENTRUN_MCP_SERVERS") or None,
        max_tokens=args.max_tokens,
        default_model=os.environ.get("AGENTRUN_DEFAULT_MODEL", WorkerSettings.default_model),
        prices_file=os.environ.get("AGENTRUN_PRICES_FILE") or None,
        providers_file=os.environ.get("AGENTRUN_PROVIDERS") or None,
        pool_size=args.pool_size or min(max(args.concurrency, 1) + 2, 20),
        api_token=os.environ.get("AGENTRUN_API_TOKEN") or None,
        api_tokens_file=os.environ.get("AGENTRUN_API_TOKENS") or None,
        max_body_bytes=args.max_body_bytes
        or _env_positive_int("AGENTRUN_MAX_BODY_BYTES", WorkerSettings.max_body_bytes),
        liveness_lock=not args.no_liveness_lock and _env_flag("AGENTRUN_LIVENESS_LOCK", True),
        max_crash_claims=args.max_crash_claims
        or _env_positive_int("AGENTRUN_MAX_CRASH_CLAIMS", WorkerSettings.max_crash_claims),
        tool_threads=_env_positive_int("AGENTRUN_TOOL_THREADS", WorkerSettings.tool_threads),
        retention_days=args.retention_days if args.retention_days is not None
        else _env_positive_float("AGENTRUN_RETENTION_DAYS"),
        retention_interval=_env_positive_float("AGENTRUN_RETENTION_INTERVAL_SECONDS")
        or WorkerSettings.retention_interval,
        model_limits_file=os.environ.get("AGENTRUN_MODEL_LIMITS") or None,
        database_retry_max=_env_positive_float("AGENTRUN_DATABASE_RETRY_MAX_SECONDS")
        or WorkerSettings.database_retry_max,
    )
    from agentrun.worker.runtime.presence import DuplicateWorker
    from agentrun.worker.serve import serve_worker

    try:
        return asyncio.run(serve_worker(settings, migrate_first=not args.no_migrate))
    except DuplicateWorker as e:
        raise SystemExit(f"agentrun: {e}") from None


def _env_positive_float(name: str) -> float | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SystemExit(f"agentrun: {name} must be a positive number, got {text!r}")
    return value


def _module_list(text: str) -> tuple[str, ...]:
    """Modules named in a comma-separated list (AGENTRUN_TOOLS, --tools); blanks and spaces ignored."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"agentrun: {name} must be true or false, got {value!r}")


# -- prune -----------------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    import datetime

    import psycopg

    from agentrun.worker.store.retention import prune

    async def go() -> str:
        async with await psycopg.AsyncConnection.connect(_database_url(args), autocommit=True) as conn:
            pruned = await prune(conn, datetime.timedelta(seconds=args.older_than), batch_size=args.batch_size,
                                 dry_run=args.dry_run)
        return pruned.describe(dry_run=args.dry_run)

    try:
        print(asyncio.run(go()))
    except psycopg.Error as e:
        raise SystemExit(f"agentrun: prune failed: {str(e).strip() or type(e).__name__}") from None
    return 0


# -- operator --------------------------------------------------------------------------------------


def _with_mcp_tools(names: frozenset[str], path: str | None) -> frozenset[str] | None:
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


def cmd_operator(args: argparse.Namespace) -> int:
    from agentrun.operator.handlers import run
    from agentrun.operator.settings import OperatorSettings
    from agentrun.worker.core.pricing import PriceTable

    tool_names = None
    modules = _module_list(args.tools or os.environ.get("AGENTRUN_TOOLS", ""))
    if modules:
        from agentrun.worker.tools import load_tool_modules

        try:
            tool_names = frozenset(t.name for t in load_tool_modules(modules))
        except (ImportError, ValueError) as e:
            raise SystemExit(f"agentrun: cannot load tools from {', '.join(modules)}: {e}") from None
        tool_names = _with_mcp_tools(tool_names, os.environ.get("AGENTRUN_MCP_SERVERS") or None)
    try:
        prices = PriceTable.load(os.environ.get("AGENTRUN_PRICES_FILE") or None)
    except (OSError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot read the price table (AGENTRUN_PRICES_FILE): {e}") from None
    settings = OperatorSettings(
        database_url=_database_url(args),
        namespaces=tuple(args.namespace or ()),
        standalone=args.peering is None,
        peering_name=args.peering,
        tool_names=tool_names,
        resync_seconds=args.resync_seconds,
        prices=prices,
        port=args.port or None,
    )
    asyncio.run(run(settings, migrate_first=not args.no_migrate))
    return 0



# -- token -----------------------------------------------------------------------------------------


def cmd_token(args: argparse.Namespace) -> int:
    import json

    from agentrun.worker.api.identities import IdentityFileError, new_token, parse_scopes

    try:
        made = new_token(args.name, parse_scopes(args.scopes, "--scopes"))
    except IdentityFileError as e:
        raise SystemExit(f"agentrun: {e}") from None
    # The token first and alone on its line, so `| head -n 1` takes it; it is stored nowhere.
    print(made.token)
    print("# Shown only now. Add this line under `identities:` in the AGENTRUN_API_TOKENS file:")
    print(f"  - {json.dumps(made.entry)}")
    return 0


def _add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from agentrun.worker.api.identities import Scope

    token = sub.add_parser(
        "token",
        help="make API tokens for named identities",
        description="Make bearer tokens for the identities of the AGENTRUN_API_TOKENS file.",
    )
    commands = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    p = commands.add_parser(
        "new",
        help="print a new random token and its line for the tokens file",
        description="Print a new random token, once, and the line that admits it to add to the "
        "AGENTRUN_API_TOKENS file: the file holds only the token's SHA-256. Workers re-read the "
        "file within seconds of a change; no restart is needed.",
    )
    p.add_argument("name", help="the identity's name, recorded as createdBy and cancelledBy of what it does")
    p.add_argument("--scopes", required=True, metavar="LIST",
                   help=f"comma-separated scopes: {', '.join(s.value for s in Scope)} (admin: all of them)")
    p.set_defaults(func=cmd_token)


# -- runs (the REST client) -------------------------------------------------------------------------

CLIENT_ENV = (
    "Environment: AGENTRUN_URL (server, default http://localhost:8080), AGENTRUN_API_TOKEN (bearer token, "
    "when the server requires one)."
)


def cmd_runs(args: argparse.Namespace) -> int:
    import orjson

    from agentrun.worker.cli import client
    from agentrun.worker.core.text import unstorable

    def show(value: object, text: str) -> None:
        client.emit(sys.stdout, orjson.dumps(value).decode() if args.json else client.terminal_safe(text))

    url = args.url or os.environ.get("AGENTRUN_URL") or client.DEFAULT_URL
    try:
        with client.RunsClient(url, os.environ.get("AGENTRUN_API_TOKEN") or None) as api:
            if args.runs_command == "submit":
                body: dict[str, object] = {"input": args.input, "tokenBudget": args.budget,
                                           "timeoutSeconds": args.timeout}
                optional = {"model": args.model, "maxSteps": args.max_steps, "tools": args.tool,
                            "system": args.system, "costBudgetUsd": args.cost_budget,
                            "continueFrom": client._run_id(args.continue_from, "--continue-from")
                            if args.continue_from else None,
                            "requireApproval": args.require_approval, "priority": args.priority,
                            "delaySeconds": args.delay}
                body.update({k: v for k, v in optional.items() if v is not None})
                texts = [("input", args.input), ("model", args.model), ("system", args.system),
                         *((f"tools[{i}]", t) for i, t in enumerate(args.tool or ()))]
                for field, text in texts:
                    # Bytes that were not UTF-8 arrive as lone surrogates, which no JSON body can carry.
                    if why := unstorable(text):
                        raise client.ApiError(0, f"{field}: {why}")
                created = api.submit(body, args.idempotency_key)
                show(created, f"{created['id']} {created['status']}")
            elif args.runs_command == "fork":
                fork: dict[str, object] = {"forkFrom": {"runId": client._run_id(args.id), "seq": args.seq}}
                fork.update({k: v for k, v in {"model": args.model, "tokenBudget": args.budget,
                                                "timeoutSeconds": args.timeout}.items() if v is not None})
                created = api.submit(fork)
                show(created, f"{created['id']} {created['status']}")
            elif args.runs_command == "pending":
                calls = api.pending(args.id)
                show(calls, client.pending_table(calls))
            elif args.runs_command == "decide":
                decision: dict[str, object] = {"decision": args.decision}
                decision.update({k: v for k, v in {"output": args.output, "reason": args.reason}.items()
                                 if v is not None})
                if args.is_error:
                    decision["isError"] = True
                run = api.decide(args.id, args.tool_use_id, decision)
                show(run, f"{run['id']} {run['status']} pending={run.get('pending', 0)}")
            elif args.runs_command == "get":
                run = api.get(args.id)
                show(run, client.run_details(run))
            elif args.runs_command == "timeline":
                steps = api.timeline(args.id)
                claimable = "" if args.json else f"claimable from {api.get(args.id).get('runAt') or '-'}\n"
                show(steps, claimable + client.timeline_table(steps))
            elif args.runs_command == "cancel":
                run = api.cancel(args.id)
                requested = " (cancel requested)" if run["status"] == "RUNNING" else ""
                show(run, f"{run['id']} {run['status']}{requested}")
            elif args.runs_command == "list":
                page = api.list(args.status, args.limit, args.after)
                show(page, client.runs_table(page))
            elif args.runs_command == "watch":
                if not args.json:
                    client.emit(sys.stdout, client.step_header())
                streaming = [0]  # the seq whose text is being printed, 0 for none

                def step(row: dict[str, object]) -> None:
                    if streaming[0]:
                        client.emit(sys.stdout, "")
                        streaming[0] = 0
                    show(row, client.step_row(row))

                def text(seq: int, fragment: str) -> None:
                    if args.json:
                        show({"seq": seq, "text": fragment}, fragment)
                        return
                    if streaming[0] != seq:
                        sys.stdout.write(("\n" if streaming[0] else "") + f"  model (seq {seq}): ")
                        streaming[0] = seq
                    sys.stdout.write(client.terminal_safe(fragment))
                    sys.stdout.flush()

                run = api.watch(args.id, step, interval=args.interval, on_text=text)
                if streaming[0]:
                    client.emit(sys.stdout, "")
                show(run, client.finished_line(run))
                return 0 if run["status"] == "SUCCEEDED" else 1
    except client.ApiError as e:
        print(f"agentrun: {client.terminal_safe(str(e))}", file=sys.stderr)
        return 1
    except (KeyError, TypeError) as e:  # JSON, but not the API's shapes: --url names some other server
        print(f"agentrun: {url} answered without the expected fields ({type(e).__name__}: {e}); "
              "is it an agentrun worker?", file=sys.stderr)
        return 1
    return 0


def _add_runs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser(
        "runs",
        help="submit, inspect, follow and cancel runs through the REST API",
        description="A client of the REST API of a running `agentrun worker`. " + CLIENT_ENV,
        epilog=CLIENT_ENV,
    )
    commands = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=f"{description} {CLIENT_ENV}")
        p.add_argument("--url", help="server URL (default: $AGENTRUN_URL or http://localhost:8080)")
        p.add_argument("--json", action="store_true", help="print the server's JSON instead of text")
        p.set_defaults(func=cmd_runs)
        return p

    p = command("submit", "queue a run", "Queue a run and print its id and status.")
    p.add_argument("input", help="the request for the agent (the first user message)")
    p.add_argument("--budget", type=_positive_int, default=50_000, metavar="N",
                   help="token budget, all kinds of tokens (default: 50000)")
    p.add_argument("--timeout", type=_positive_int, default=300, metavar="S",
                   help="wall-clock limit in seconds (default: 300)")
    p.add_argument("--tool", action="append", metavar="NAME",
                   help="a tool the model may call (repeatable; default: every tool of the worker)")
    p.add_argument("--model", help="model name; a prefix picks the provider: bedrock/ID, vertex/MODEL, "
                   "NAME/MODEL for an endpoint of the server's AGENTRUN_PROVIDERS (default: the server's "
                   "AGENTRUN_DEFAULT_MODEL)")
    p.add_argument("--max-steps", type=_positive_int, metavar="N", help="most steps the run may take (default: 100)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--cost-budget", type=_positive_float, metavar="USD", help="spending limit in USD")
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

    p = command("fork", "start a run from the first steps of another",
                "Start a new run from the first --seq steps of run ID, whatever its status, and go on from "
                "there; budgets and tools are the source's unless given.")
    p.add_argument("id", help="the run to fork")
    p.add_argument("--seq", type=_positive_int, required=True, metavar="N", help="how many of its steps to keep")
    p.add_argument("--model", help="another model for the fork (default: the source's)")
    p.add_argument("--budget", type=_positive_int, metavar="N", help="token budget (default: the source's)")
    p.add_argument("--timeout", type=_positive_int, metavar="S", help="wall-clock limit (default: the source's)")

    p = command("pending", "list the tool calls waiting for a decision",
                "List the tool calls of a WAITING run that wait for a person: approvals, and calls in doubt "
                "after a crash.")
    p.add_argument("id", help="run id")

    p = command("decide", "decide a pending tool call",
                "Decide a pending call: approve or deny an approval; retry, record (with --output) or fail a "
                "call in doubt. When the last open call is decided, the run goes on.")
    p.add_argument("id", help="run id")
    p.add_argument("tool_use_id", metavar="TOOL_USE_ID", help="the pending call (from `runs pending`)")
    p.add_argument("decision", choices=[d.value for d in Decision], metavar="DECISION",
                   help="approve | deny | retry | record | fail")
    p.add_argument("--output", metavar="TEXT", help="with record: what the call returned")
    p.add_argument("--is-error", action="store_true", help="with record: the call failed")
    p.add_argument("--reason", metavar="TEXT", help="why (the model sees it when a call is denied)")

    p = command("get", "show a run", "Show a run: status, budgets, tokens, cost, error and times.")
    p.add_argument("id", help="run id")

    p = command("timeline", "show a run's steps as a table",
                "Show a run's steps: seq, kind, tool, status, stop reason, tokens in/out, cache writes/reads, "
                "latency and the worker that wrote each.")
    p.add_argument("id", help="run id")

    p = command("cancel", "cancel a run",
                "Cancel a run: a queued run ends CANCELLED at once, a running one at its next step. "
                "Fails if the run has already finished.")
    p.add_argument("id", help="run id")

    p = command("watch", "follow a run's steps until it ends",
                "Print each step of a run as it happens, and the model's text as it streams, until the run "
                "ends (it follows GET /api/runs/{id}/events). Exits 0 if it SUCCEEDED, else 1.")
    p.add_argument("id", help="run id")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                   help="seconds before resuming a dropped event stream (default: 1)")

    p = command("list", "list runs, newest first", "List runs, newest first, a page at a time.")
    p.add_argument("--status", choices=[s.value for s in RunStatus],
                   help="only runs in this status")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="runs per page (default: 50, at most 200)")
    p.add_argument("--after", metavar="ID", help="the cursor a previous page printed, for the next page")


# -- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun",
        description="agentrun: a durable runtime for LLM agents on PostgreSQL and Kubernetes.",
        epilog="Environment: AGENTRUN_DATABASE_URL, AGENTRUN_LOG_FORMAT (console|json), AGENTRUN_LOG_LEVEL; "
        "`runs` reads AGENTRUN_URL and AGENTRUN_API_TOKEN.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "migrate",
        help="apply the database migrations",
        description="Apply the missing schema migrations, in order, under an advisory lock (safe to run "
        "from many processes at once). Reads AGENTRUN_DATABASE_URL.",
    )
    _add_database(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "worker",
        help="claim and drive runs, and serve the HTTP API",
        description="Claim runs with leases, drive each from its last checkpoint, and serve /healthz, "
        "/readyz, the REST API and /metrics on --port. The HTTP server starts first: while the database is "
        "unreachable or not migrated, /healthz answers 200 and /readyz 503 with the reason, and the worker "
        "retries (backoff up to 5 s) and starts claiming once it is usable, without a restart.",
        epilog="Environment: AGENTRUN_DATABASE_URL; AGENTRUN_TOOLS (comma-separated modules whose @tool "
        "functions the worker offers); AGENTRUN_MCP_SERVERS (YAML or JSON file `servers: [...]` of MCP servers "
        "whose tools the worker offers as <server>__<tool>; ${VAR} in headers from the environment); "
        "ANTHROPIC_API_KEY and/or ANTHROPIC_BASE_URL (the Anthropic API, one is "
        "required for its models); AGENTRUN_LLM_MAX_ATTEMPTS (calls per model step, default 5); "
        "AGENTRUN_LLM_TIMEOUT_SECONDS "
        "(limit of one call, default 120); AGENTRUN_LLM_BACKOFF_BASE_SECONDS and AGENTRUN_LLM_BACKOFF_CAP_SECONDS "
        "(full-jitter backoff, defaults 1 and 30; a retry-after header is honoured); AGENTRUN_LLM_HTTP_CLIENT "
        "(the Anthropic SDK's transport: aiohttp, the default, or httpx); AGENTRUN_DEFAULT_MODEL "
        "(a prefix picks the provider: bedrock/ with AWS_REGION and the AWS credential chain, vertex/ with "
        "CLOUD_ML_REGION and ANTHROPIC_VERTEX_PROJECT_ID, <name>/ for an endpoint of AGENTRUN_PROVIDERS, a "
        "YAML or JSON file of OpenAI-compatible endpoints); "
        "AGENTRUN_PRICES_FILE (price table, TOML); AGENTRUN_API_TOKEN (bearer token the /api routes require, "
        "the identity `default` with every scope; unset with AGENTRUN_API_TOKENS: open); AGENTRUN_API_TOKENS "
        "(YAML/JSON file of named identities with scopes, re-read on change); AGENTRUN_MAX_BODY_BYTES; "
        "AGENTRUN_LIVENESS_LOCK; AGENTRUN_MAX_CRASH_CLAIMS; "
        "AGENTRUN_TOOL_THREADS (plain-def tools running at once, default 32; a timed-out one keeps its slot "
        "until it returns); AGENTRUN_LOG_FORMAT; OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER (traces over "
        "OTLP/HTTP, off unless set; the other standard OTEL_* variables apply) and "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (record prompts and outputs in spans, default false); "
        "AGENTRUN_RETENTION_DAYS, AGENTRUN_RETENTION_INTERVAL_SECONDS (pruning, default every 600 s); "
        "AGENTRUN_MODEL_LIMITS (YAML or JSON file of fleet-wide model limits); "
        "AGENTRUN_DATABASE_RETRY_MAX_SECONDS (longest wait between attempts to reach the database, default 5).",
    )
    _add_database(p)
    identity = p.add_mutually_exclusive_group()
    identity.add_argument("--id", metavar="NAME",
                          help="worker name in leases, steps and logs, exactly; unique per live worker "
                          "(default: host-pid-XXXXXX, XXXXXX new with every process)")
    identity.add_argument("--id-prefix", metavar="PREFIX",
                          help="worker name PREFIX-XXXXXX, XXXXXX new with every process: a restart under the "
                          "same PREFIX (a pod's name) is a new worker, so the dead process's runs move within "
                          "about a second, not after the lease (the chart passes $(POD_NAME))")
    p.add_argument("--concurrency", type=_non_negative_int, default=4, metavar="N",
                   help="runs in flight at once; 0 serves the API only (default: 4)")
    p.add_argument("--lease-seconds", type=_positive_float, default=30.0, metavar="S",
                   help="lease length; renewed every S/3 while a step runs (default: 30)")
    p.add_argument("--poll-interval", type=_positive_float, default=1.0, metavar="S",
                   help="seconds between claim attempts while idle (default: 1)")
    p.add_argument("--shutdown-grace", type=_non_negative_float, default=25.0, metavar="S",
                   help="on SIGTERM, how long in-flight steps may take to finish (default: 25)")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default: 8080)")
    p.add_argument("--host", default="0.0.0.0", help="HTTP bind address (default: 0.0.0.0)")
    p.add_argument("--max-tokens", type=_positive_int, default=4096, metavar="N",
                   help="max_tokens of each model request (default: 4096)")
    p.add_argument("--pool-size", type=_positive_int, default=None, metavar="N",
                   help="database connections (default: concurrency + 2, at most 20)")
    p.add_argument("--max-body-bytes", type=_positive_int, metavar="N", default=None,
                   help="largest request body the API accepts (default: $AGENTRUN_MAX_BODY_BYTES or 1 MiB)")
    p.add_argument("--max-crash-claims", type=_positive_int, metavar="N", default=None,
                   help="a run taken over this many times from a worker that died mid-step ends FAILED "
                   "instead (default: $AGENTRUN_MAX_CRASH_CLAIMS or 10)")
    p.add_argument("--retention-days", type=_positive_float, default=None, metavar="D",
                   help="prune runs finished more than D days ago, one worker of the fleet at a time "
                   "(default: $AGENTRUN_RETENTION_DAYS; unset: keep everything)")
    p.add_argument("--no-migrate", action="store_true",
                   help="do not apply migrations at start; wait, not ready, until they are applied")
    p.add_argument("--no-liveness-lock", action="store_true",
                   help="do not hold the session advisory lock that lets other workers take over this "
                   "worker's runs as soon as it dies; needed behind a connection pooler in transaction "
                   "mode, where a dead worker's runs then wait out their lease. Use the same setting on "
                   "every worker, and a unique --id per live worker (env: AGENTRUN_LIVENESS_LOCK=false)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser(
        "prune",
        help="delete finished runs older than a cutoff",
        description="Delete runs that finished (SUCCEEDED, FAILED, CANCELLED, TIMED_OUT) before the cutoff, "
        "with their steps, lease history and decisions, a batch of runs per short transaction, so workers "
        "are never blocked for long. Queued, running and waiting runs are never deleted, nor a run another "
        "kept run was continued or forked from. Prints what it deleted. Reads AGENTRUN_DATABASE_URL.",
    )
    _add_database(p)
    p.add_argument("--older-than", type=duration, required=True, metavar="AGE",
                   help="finished at least this long ago: seconds, or with a unit (30d, 12h, 90m)")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    p.add_argument("--batch-size", type=_positive_int, default=100, metavar="N",
                   help="runs deleted per statement (default: 100)")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser(
        "operator",
        help="reconcile AgentRun resources into runs (kopf)",
        description="Watch AgentRun resources (crds/agentrun.yaml): make a run for each new one, cancel it on "
        "spec.cancel or deletion, and keep each resource's status within about a second of its run through "
        "PostgreSQL LISTEN/NOTIFY, with a periodic resync as a safety net. Serves /healthz and /readyz at once; "
        "reaches and migrates the database in the background, retrying while it is down (/readyz answers 503 "
        "until then). A costBudgetUsd on a model the price table does not price is a Failed AgentRun.",
        epilog="Environment: AGENTRUN_DATABASE_URL; AGENTRUN_TOOLS (comma-separated tool modules, as the workers "
        "load them: an AgentRun naming another tool is failed at once; without it tool names are not checked); "
        "AGENTRUN_MCP_SERVERS (the workers' MCP servers file: their `tools` lists name the MCP tools accepted); "
        "AGENTRUN_PRICES_FILE (the workers' price table, TOML); "
        "KUBECONFIG (outside a cluster; in a pod the service account is used); AGENTRUN_LOG_FORMAT, "
        "AGENTRUN_LOG_LEVEL.",
    )
    _add_database(p)
    p.add_argument("--namespace", action="append", metavar="NS",
                   help="watch this namespace (repeatable, kopf globs allowed; default: all namespaces)")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true",
                         help="no kopf peering (the default): run exactly one operator replica")
    peering.add_argument("--peering", metavar="NAME",
                         help="coordinate replicas through this KopfPeering object (its CRD must be installed)")
    p.add_argument("--tools", metavar="MODULES",
                   help="tool modules to validate spec.tools against (default: $AGENTRUN_TOOLS; none: no check); "
                   "with AGENTRUN_MCP_SERVERS, the names its servers' `tools` lists allow too (a server "
                   "without such a list turns the check off)")
    p.add_argument("--resync-seconds", type=_positive_float, default=60.0, metavar="S",
                   help="period of the resync over unfinished runs, under the notifications (default: 60)")
    p.add_argument("--max-crash-claims", type=_positive_int, metavar="N", default=None,
                   help="a run taken over this many times from a worker that died mid-step ends FAILED "
                   "instead (default: $AGENTRUN_MAX_CRASH_CLAIMS or 10)")
    p.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    p.add_argument("--port", type=int, default=8081, metavar="PORT",
                   help="port of /healthz and /readyz (default: 8081; 0: none); with --no-migrate /readyz "
                   "says 503 until the database is migrated")
    p.set_defaults(func=cmd_operator)

    p = sub.add_parser(
        "demo",
        help="show a run surviving kill -9 of its worker",
        description="Start an embedded PostgreSQL, a local model and two workers; submit a run, kill -9 the "
        "worker in the middle of a tool call, and watch the other worker finish the run from its last "
        "checkpoint. Needs no database, Docker or API key. Exit status 0 only if the run succeeded with "
        "the first model call made exactly once.",
        epilog="Environment: ANTHROPIC_API_KEY (with --live). Everything started is stopped at the end, "
        "also on Ctrl-C.",
    )
    p.add_argument("--keep", action="store_true", help="keep the servers running afterwards (until Ctrl-C)")
    p.add_argument("--live", action="store_true", help="use the real Anthropic API (needs ANTHROPIC_API_KEY)")
    p.add_argument("--lease-seconds", type=_positive_float, default=5.0, metavar="S",
                   help="the workers' lease (default: 5, so the demo takes seconds)")
    p.add_argument("--verbose", action="store_true", help="also print the workers' other log lines")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "dev",
        help="a persistent local stack: database, worker, API and web UI",
        description="Start an embedded PostgreSQL keeping its data in --data-dir, apply the migrations, and "
        "run one worker with the API and the web UI on http://127.0.0.1:PORT, the demo tools "
        "(list_tickets) and the local Messages API server, or the real API when ANTHROPIC_API_KEY is set. "
        "Prints the UI's URL. Ctrl-C stops everything; the next start finds the runs of the last.",
        epilog="Environment: ANTHROPIC_API_KEY (the real API instead of the local server), "
        "AGENTRUN_API_TOKEN (ask for a token), AGENTRUN_DEFAULT_MODEL.",
    )
    p.add_argument("--data-dir", metavar="DIR",
                   help="where the database keeps its data (default: ~/.local/share/agentrun/dev)")
    p.add_argument("--port", type=_port, default=8080, help="the API and UI port on 127.0.0.1 (default: 8080)")
    p.set_defaults(func=cmd_dev)
    _add_runs(sub)
    _add_token(sub)
    return parser


def cmd_dev(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentrun.worker.demo import dev

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else dev.default_data_dir()
    return dev.run(dev.DevOptions(data_dir=data_dir, port=args.port))


def cmd_demo(args: argparse.Namespace) -> int:
    from agentrun.worker.demo import story

    options = story.Options(keep=args.keep, live=args.live, lease_seconds=args.lease_seconds, verbose=args.verbose)
    return story.run(options)


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


def _env_positive_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return _positive_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit(f"agentrun: {name} must be a positive integer, got {text!r}") from None


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


def main(argv: Sequence[str] | None = None) -> int:
    from agentrun.worker.llm.providers import key_variables
    from agentrun.worker.tools.mcp.config import secret_variables

    args = build_parser().parse_args(argv)
    logs.setup(
        os.environ.get("AGENTRUN_LOG_FORMAT", "console"),
        os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
        secrets=logs.secrets_from_env(os.environ, urls=[getattr(args, "database_url", None)],
                                      names=[*key_variables(os.environ.get("AGENTRUN_PROVIDERS")),
                                             *secret_variables(os.environ.get("AGENTRUN_MCP_SERVERS"))]),
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
