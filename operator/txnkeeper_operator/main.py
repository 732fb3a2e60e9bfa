"""`txnkeeper-operator`: run the Kopf operator with this package's handlers.

Equivalent to `kopf run -m txnkeeper_operator.handlers`, with the watched namespaces taken from
TXNKEEPER_NAMESPACES (comma list; empty: the whole cluster) so the chart needs no kopf flags.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import kopf

from txnkeeper_operator import metrics
from txnkeeper_operator.settings import OperatorSettings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txnkeeper-operator", description=__doc__)
    parser.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    parser.add_argument(
        "--metrics-port", type=int, default=8082, help="serve Prometheus /metrics on this port (0: off)"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import txnkeeper_operator.handlers  # noqa: F401  (registers the handlers)

    if not args.verbose:
        # Kopf logs every timer tick at INFO; the operator's own Events and status say what happened.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    if args.metrics_port:
        metrics.serve(args.metrics_port)
    namespaces = list(args.namespace) or list(OperatorSettings.from_env().namespaces)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness or None,
            standalone=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
