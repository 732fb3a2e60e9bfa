"""``txnkeeper client-token create``: issue a client token for a store's client token key.

Why in the runtime's CLI: whoever runs the stores also hands out the credentials their clients
present (``Client(auth_token=...)``); the token is a JWT signed HS256 with the key file the store pods
are given (``serve --client-token-key-file``), naming the client's principal in its ``sub`` claim, the
shape Pulsar's ``pulsar tokens create --secret-key`` issues. Prints the token on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time

from txnkeeper.errors import BadRequestError
from txnkeeper.protocol.clientauth import ClientTokenKeyError, load_client_token_key

MAX_EXPIRY_SECONDS = 100 * 365 * 24 * 3600


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "client-token",
        help="issue client tokens (principals of single-key writers and named producers)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    create = verbs.add_parser("create", help="print a token naming PRINCIPAL")
    create.add_argument("--key-file", required=True, help="the stores' client token key file (private)")
    create.add_argument("--principal", required=True, help="who the token's bearer is (its sub claim)")
    create.add_argument(
        "--expires-in", type=int, help="seconds the token is valid from now (default: no expiry)"
    )
    create.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    expires_at = None
    if ns.expires_in is not None:
        if not 0 < ns.expires_in <= MAX_EXPIRY_SECONDS:
            print(
                f"txnkeeper client-token: --expires-in must be 1..{MAX_EXPIRY_SECONDS} seconds, got"
                f" {ns.expires_in}",
                file=sys.stderr,
            )
            return 2
        expires_at = int(time.time()) + ns.expires_in
    try:
        key = load_client_token_key(ns.key_file)
        if key is None:
            raise ClientTokenKeyError("--key-file names no file")
        token = key.create_token(ns.principal, expires_at=expires_at)
    except (ClientTokenKeyError, BadRequestError) as exc:
        print(f"txnkeeper client-token: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0
