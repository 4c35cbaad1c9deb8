"""The `agentrun` command's argparse tree: one function per command; `runs`, `token` and `agents` add their own."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

from agentrun.worker.cli.agents import add_agents
from agentrun.worker.cli.arguments import (
    add_database,
    duration,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from agentrun.worker.cli.events import add_events
from agentrun.worker.cli.local import cmd_demo, cmd_dev
from agentrun.worker.cli.migrate import cmd_migrate
from agentrun.worker.cli.operator import cmd_operator
from agentrun.worker.cli.prune import cmd_prune
from agentrun.worker.cli.replay import add_replay
from agentrun.worker.cli.runs import add_runs
from agentrun.worker.cli.schedules import add_schedules
from agentrun.worker.cli.tenants import add_tenants
from agentrun.worker.cli.tokens import add_token
from agentrun.worker.cli.worker import cmd_worker

if TYPE_CHECKING:
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun",
        description="agentrun: a durable runtime for LLM agents on PostgreSQL and Kubernetes.",
        epilog="Environment: AGENTRUN_DATABASE_URL, AGENTRUN_LOG_FORMAT (console|json), AGENTRUN_LOG_LEVEL; "
        "`runs`, `agents`, `schedules`, `tenants` and `replay` read AGENTRUN_URL and AGENTRUN_API_TOKEN. Each "
        "secret variable "
        "(database URL, API token, model API keys, MCP header variables) may instead name a file in <NAME>_FILE, "
        "e.g. AGENTRUN_DATABASE_URL_FILE.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_migrate(sub)
    _add_worker(sub)
    _add_prune(sub)
    _add_operator(sub)
    _add_demo(sub)
    _add_dev(sub)
    add_runs(sub)
    add_token(sub)
    add_agents(sub)
    add_events(sub)
    add_schedules(sub)
    add_tenants(sub)
    add_replay(sub)
    return parser


def _add_migrate(sub: Subcommands) -> None:
    p = sub.add_parser(
        "migrate",
        help="apply the database migrations",
        description="Apply the missing schema migrations, in order, under an advisory lock (safe to run "
        "from many processes at once). Reads AGENTRUN_DATABASE_URL.",
    )
    add_database(p)
    p.set_defaults(func=cmd_migrate)


WORKER_ENV = (
    "Environment: AGENTRUN_DATABASE_URL; AGENTRUN_TOOLS (comma-separated modules whose @tool "
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
    "AGENTRUN_LIVENESS_LOCK; AGENTRUN_MAX_CRASH_CLAIMS; AGENTRUN_MAX_AGENT_DEPTH; AGENTRUN_MAX_CHILDREN_PER_TURN; "
    "AGENTRUN_TOOL_THREADS (plain-def tools running at once, default 32; a timed-out one keeps its slot "
    "until it returns); AGENTRUN_LOG_FORMAT; OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER (traces over "
    "OTLP/HTTP, off unless set; the other standard OTEL_* variables apply) and "
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (record prompts and outputs in spans, default false); "
    "AGENTRUN_RETENTION_DAYS, AGENTRUN_RETENTION_INTERVAL_SECONDS (pruning, default every 600 s); "
    "AGENTRUN_MODEL_LIMITS (YAML or JSON file of fleet-wide model limits); "
    "AGENTRUN_EVENT_RETENTION (how long an event of POST /api/events is kept for waits that begin after it: "
    "seconds or a duration like 24h, the default); "
    "AGENTRUN_WEBHOOK_SECRETS (YAML/JSON file of webhook signing secrets, whsec_<base64>, re-read on change); "
    "AGENTRUN_WEBHOOK_ALLOW (hosts/CIDRs webhooks may reach though private, loopback or metadata); "
    "AGENTRUN_WEBHOOK_TIMEOUT_SECONDS (default 10); AGENTRUN_WEBHOOK_BACKOFF (first retry waits, default 5,10,30); "
    "AGENTRUN_WEBHOOK_BACKOFF_MAX_SECONDS (default 3600); AGENTRUN_WEBHOOK_GIVE_UP_SECONDS (default 86400); "
    "AGENTRUN_WEBHOOK_POLL_SECONDS (default 5); "
    "AGENTRUN_REPLAY_SCORERS (comma-separated module:function custom scorers replays may name); "
    "AGENTRUN_DATABASE_RETRY_MAX_SECONDS (longest wait between attempts to reach the database, default 5)."
)
"""The environment of `agentrun worker`, as its --help lists it."""


def _add_worker(sub: Subcommands) -> None:
    p = sub.add_parser(
        "worker",
        help="claim and drive runs, and serve the HTTP API",
        description="Claim runs with leases, drive each from its last checkpoint, and serve /healthz, "
        "/readyz, the REST API and /metrics on --port. The HTTP server starts first: while the database is "
        "unreachable or not migrated, /healthz answers 200 and /readyz 503 with the reason, and the worker "
        "retries (backoff up to 5 s) and starts claiming once it is usable, without a restart.",
        epilog=WORKER_ENV,
    )
    add_database(p)
    identity = p.add_mutually_exclusive_group()
    identity.add_argument("--id", metavar="NAME",
                          help="worker name in leases, steps and logs, exactly; unique per live worker "
                          "(default: host-pid-XXXXXX, XXXXXX new with every process)")
    identity.add_argument("--id-prefix", metavar="PREFIX",
                          help="worker name PREFIX-XXXXXX, XXXXXX new with every process: a restart under the "
                          "same PREFIX (a pod's name) is a new worker, so the dead process's runs move within "
                          "about a second, not after the lease (the chart passes $(POD_NAME))")
    p.add_argument("--concurrency", type=non_negative_int, default=4, metavar="N",
                   help="runs in flight at once; 0 serves the API only (default: 4)")
    p.add_argument("--lease-seconds", type=positive_float, default=30.0, metavar="S",
                   help="lease length; renewed every S/3 while a step runs (default: 30)")
    p.add_argument("--poll-interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds between claim attempts while idle (default: 1)")
    p.add_argument("--shutdown-grace", type=non_negative_float, default=25.0, metavar="S",
                   help="on SIGTERM, how long in-flight steps may take to finish (default: 25)")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default: 8080)")
    p.add_argument("--host", default="0.0.0.0", help="HTTP bind address (default: 0.0.0.0)")
    p.add_argument("--max-tokens", type=positive_int, default=4096, metavar="N",
                   help="max_tokens of each model request, capped at the model's max_output_tokens in the price "
                   "table (default: 4096)")
    p.add_argument("--pool-size", type=positive_int, default=None, metavar="N",
                   help="database connections (default: concurrency + 2, at most 20)")
    p.add_argument("--max-body-bytes", type=positive_int, metavar="N", default=None,
                   help="largest request body the API accepts (default: $AGENTRUN_MAX_BODY_BYTES or 1 MiB)")
    p.add_argument("--max-crash-claims", type=positive_int, metavar="N", default=None,
                   help="a run taken over this many times from a worker that died mid-step ends FAILED "
                   "instead (default: $AGENTRUN_MAX_CRASH_CLAIMS or 10)")
    p.add_argument("--retention-days", type=positive_float, default=None, metavar="D",
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


def _add_prune(sub: Subcommands) -> None:
    p = sub.add_parser(
        "prune",
        help="delete finished runs older than a cutoff",
        description="Delete runs that finished (SUCCEEDED, FAILED, CANCELLED, TIMED_OUT) before the cutoff, "
        "with their steps, lease history and decisions, a batch of runs per short transaction, so workers "
        "are never blocked for long. Queued, running and waiting runs are never deleted, nor a run another "
        "kept run was continued or forked from. Prints what it deleted. Reads AGENTRUN_DATABASE_URL.",
    )
    add_database(p)
    p.add_argument("--older-than", type=duration, required=True, metavar="AGE",
                   help="finished at least this long ago: seconds, or with a unit (30d, 12h, 90m)")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    p.add_argument("--batch-size", type=positive_int, default=100, metavar="N",
                   help="runs deleted per statement (default: 100)")
    p.set_defaults(func=cmd_prune)


def _add_operator(sub: Subcommands) -> None:
    p = sub.add_parser(
        "operator",
        help="reconcile AgentRun resources into runs and Agent resources into agent definitions (kopf)",
        description="Watch AgentRun resources (crds/agentrun.yaml): make a run for each new one, cancel it on "
        "spec.cancel or deletion, and keep each resource's status within about a second of its run through "
        "PostgreSQL LISTEN/NOTIFY, with a periodic resync as a safety net. Watch Agent resources "
        "(crds/agent.yaml): store each change of spec as a new version of the agent, delete it on deletion. "
        "Serves /healthz and /readyz at once; "
        "reaches and migrates the database in the background, retrying while it is down (/readyz answers 503 "
        "until then). A costBudgetUsd on a model the price table does not price is a Failed AgentRun.",
        epilog="Environment: AGENTRUN_DATABASE_URL; AGENTRUN_TOOLS (comma-separated tool modules, as the workers "
        "load them: an AgentRun naming another tool is failed at once; without it tool names are not checked); "
        "AGENTRUN_MCP_SERVERS (the workers' MCP servers file: their `tools` lists name the MCP tools accepted); "
        "AGENTRUN_PRICES_FILE (the workers' price table, TOML); "
        "KUBECONFIG (outside a cluster; in a pod the service account is used); AGENTRUN_LOG_FORMAT, "
        "AGENTRUN_LOG_LEVEL.",
    )
    add_database(p)
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
    p.add_argument("--resync-seconds", type=positive_float, default=60.0, metavar="S",
                   help="period of the resync over unfinished runs, under the notifications (default: 60)")
    p.add_argument("--max-crash-claims", type=positive_int, metavar="N", default=None,
                   help="a run taken over this many times from a worker that died mid-step ends FAILED "
                   "instead (default: $AGENTRUN_MAX_CRASH_CLAIMS or 10)")
    p.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    p.add_argument("--port", type=int, default=8081, metavar="PORT",
                   help="port of /healthz and /readyz (default: 8081; 0: none); with --no-migrate /readyz "
                   "says 503 until the database is migrated")
    p.set_defaults(func=cmd_operator)


def _add_demo(sub: Subcommands) -> None:
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
    p.add_argument("--lease-seconds", type=positive_float, default=5.0, metavar="S",
                   help="the workers' lease (default: 5, so the demo takes seconds)")
    p.add_argument("--verbose", action="store_true", help="also print the workers' other log lines")
    p.set_defaults(func=cmd_demo)


def _add_dev(sub: Subcommands) -> None:
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
    p.add_argument("--port", type=port, default=8080, help="the API and UI port on 127.0.0.1 (default: 8080)")
    p.set_defaults(func=cmd_dev)
