"""The `agentrun` command: its parser and subcommands (`python -m agentrun.worker.cli` runs it too)."""

from agentrun.worker.cli.main import main as main
from agentrun.worker.cli.parser import build_parser as build_parser
from agentrun.worker.cli.worker import worker_id as worker_id
