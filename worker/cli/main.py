"""The `agentrun` command line: parse, set up the logs, hand over to the command (worker/cli/parser.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from agentrun.worker.cli.parser import build_parser
from agentrun.worker.obs import logs


def main(argv: Sequence[str] | None = None) -> int:
    from agentrun.worker.llm.providers import key_variables
    from agentrun.worker.settings import load_secret_files
    from agentrun.worker.tools.mcp.config import secret_variables

    args = build_parser().parse_args(argv)
    # Before anything reads them, logs' redaction included: `<NAME>_FILE` becomes NAME.
    try:
        load_secret_files(os.environ, [*key_variables(os.environ.get("AGENTRUN_PROVIDERS")),
                                       *secret_variables(os.environ.get("AGENTRUN_MCP_SERVERS"))])
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None
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
