"""`python -m txnkeeper_operator.selfcheck`: the chart's `helm test` (is the installation usable?).

Checks what a user needs before creating a resource: the operator process answers its liveness
endpoint, and both CRDs are served (a namespaced list succeeds). Exit status 0 only if both hold.
"""

from __future__ import annotations

import argparse
import sys
import urllib.request
from collections.abc import Sequence
from typing import Any

from txnkeeper_operator.naming import API_VERSION, GROUP, KINDS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txnkeeper_operator.selfcheck", description=__doc__)
    parser.add_argument("--operator-url", required=True, help="the operator's liveness URL")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    failures = []
    try:
        with urllib.request.urlopen(args.operator_url, timeout=args.timeout) as resp:
            print(f"operator liveness: HTTP {resp.status}")
    except OSError as err:
        failures.append(f"operator liveness {args.operator_url}: {err}")
    from kubernetes import client
    from kubernetes import config as kube_config

    loader: Any = kube_config
    try:
        loader.load_incluster_config()
    except loader.ConfigException:
        loader.load_kube_config()
    custom = client.CustomObjectsApi()
    for kind in KINDS:
        try:
            items: Any = custom.list_namespaced_custom_object(GROUP, API_VERSION, args.namespace, kind.plural)
            print(f"{kind.kind}: {len(items.get('items', []))} in {args.namespace}")
        except client.ApiException as err:
            failures.append(f"list {kind.plural}.{GROUP}: HTTP {err.status} {err.reason}")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
