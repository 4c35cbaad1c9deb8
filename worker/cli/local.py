"""`agentrun demo` and `agentrun dev`: the local stacks of worker/demo/."""

from __future__ import annotations

import argparse


def cmd_demo(args: argparse.Namespace) -> int:
    from agentrun.worker.demo import story

    options = story.Options(keep=args.keep, live=args.live, lease_seconds=args.lease_seconds, verbose=args.verbose)
    return story.run(options)


def cmd_dev(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentrun.worker.demo import dev

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else dev.default_data_dir()
    return dev.run(dev.DevOptions(data_dir=data_dir, port=args.port))
