"""The `agentrun` command line: parse, set up the logs, hand over to the command (worker/cli/parser.py).

Nothing heavy is imported before a command runs: `agentrun --help` and `agentrun runs submit` must answer at
once, so each command imports what it needs itself (tests/test_cli_imports.py checks which modules they load).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from agentrun.worker.cli.parser import build_parser
from agentrun.worker.obs import logs


def _secrets(args: object) -> list[str]:
    """Set each secret variable whose `<NAME>_FILE` is set from its file (before anything reads them, the
    logs' redaction included), and return the values the logs must never show. A REST client command
    (`client` set by cli/runs.client_commands) knows only the environment's keys and token; the others also
    the providers' and MCP servers' key variables and the database password, whose parsing imports psycopg
    and the YAML loader."""
    from agentrun.worker.settings import load_secret_files

    if getattr(args, "client", False):
        load_secret_files(os.environ)
        return [v for k in logs.SECRET_VARIABLES if (v := os.environ.get(k))]
    from agentrun.worker.llm.providers import key_variables
    from agentrun.worker.tools.mcp.config import secret_variables

    names = [*key_variables(os.environ.get("AGENTRUN_PROVIDERS")),
             *secret_variables(os.environ.get("AGENTRUN_MCP_SERVERS"))]
    load_secret_files(os.environ, names)
    return logs.secrets_from_env(os.environ, urls=[getattr(args, "database_url", None)], names=names)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        secrets = _secrets(args)
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None
    logs.setup(os.environ.get("AGENTRUN_LOG_FORMAT", "console"), os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
               secrets=secrets)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
