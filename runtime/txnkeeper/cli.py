"""The ``txnkeeper`` command line: one entry point whose subcommands live beside what they drive.

Each edge module exposes ``register(subparsers)``; this module only wires them together, so adding a
subcommand never means editing a central switch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Modules that contribute subcommands; each has `register(subparsers) -> None` and sets `func` on its parser.
_COMMAND_MODULES: tuple[str, ...] = (
    "txnkeeper.verifier.cli",
    "txnkeeper.verifier.offload_audit",
    "txnkeeper.server.serve",
    "txnkeeper.server.client_tokens",
    "txnkeeper.admin.cli",
    "txnkeeper.inspect_cmd",
    "txnkeeper.ledger.offload.inspect",
    "txnkeeper.fleet.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txnkeeper",
        description="Transactional streaming storage with PIP-160 batched logs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in _COMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = ns.func
    return func(ns)


if __name__ == "__main__":
    sys.exit(main())
