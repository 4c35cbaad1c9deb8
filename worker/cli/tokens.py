"""`agentrun token new`: a bearer token for a named identity, and its line for the AGENTRUN_API_TOKENS file."""

from __future__ import annotations

import argparse


def add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--tenant", default="default", metavar="NAME",
                   help='the tenant whose runs the identity sees and acts on (default: default); "*" for a '
                   "platform operator's identity, which acts for every tenant")
    p.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    import json

    from agentrun.worker.api.identities import IdentityFileError, new_token, parse_scopes

    try:
        made = new_token(args.name, parse_scopes(args.scopes, "--scopes"), args.tenant)
    except IdentityFileError as e:
        raise SystemExit(f"agentrun: {e}") from None
    # The token first and alone on its line, so `| head -n 1` takes it; it is stored nowhere.
    print(made.token)
    print("# Shown only now. Add this line under `identities:` in the AGENTRUN_API_TOKENS file:")
    print(f"  - {json.dumps(made.entry)}")
    return 0
