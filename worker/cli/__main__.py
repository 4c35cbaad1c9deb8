"""`python -m agentrun.worker.cli`: the same as the `agentrun` command."""

from agentrun.worker.cli.main import main

raise SystemExit(main())
