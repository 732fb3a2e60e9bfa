"""`python -m txnkeeper_operator.selfcheck`: the chart's `helm test` (is the installation usable?).

Checks what a user needs before creating a resource: the operator pod is running and answers its
liveness endpoint at its pod IP (found through the API, so no cluster DNS is needed), and both CRDs are
served (a namespaced list succeeds). Exit status 0 only if all hold.
"""

from __future__ import annotations

import argparse
import sys
import urllib.request
from collections.abc import Sequence
from typing import Any

from txnkeeper_operator.naming import API_VERSION, GROUP, KINDS

LIVENESS_PORT = 8081


def _load_config() -> None:
    from kubernetes import config as kube_config

    loader: Any = kube_config  # the loaders are untyped
    try:
        loader.load_incluster_config()
    except loader.ConfigException:
        loader.load_kube_config()


def check_operator(
    core: Any, namespace: str, selector: str, timeout: float, port: int = LIVENESS_PORT
) -> list[str]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    running = [p for p in pods if p.status is not None and p.status.phase == "Running" and p.status.pod_ip]
    if not running:
        return [f"no running operator pod matches {selector!r} in {namespace}"]
    failures = []
    for pod in running:
        ip = pod.status.pod_ip
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                print(f"operator {pod.metadata.name} liveness: HTTP {resp.status}")
        except OSError as err:
            failures.append(f"operator {pod.metadata.name} liveness {url}: {err}")
    return failures


def check_crds(custom: Any, api_exception: type[Exception], namespace: str) -> list[str]:
    failures = []
    for kind in KINDS:
        try:
            items: Any = custom.list_namespaced_custom_object(GROUP, API_VERSION, namespace, kind.plural)
            print(f"{kind.kind}: {len(items.get('items', []))} in {namespace}")
        except api_exception as err:
            failures.append(f"list {kind.plural}.{GROUP}: {err}")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txnkeeper_operator.selfcheck", description=__doc__)
    parser.add_argument("--operator-selector", required=True, help="label selector of the operator pod")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    from kubernetes import client

    _load_config()
    failures = check_operator(client.CoreV1Api(), args.namespace, args.operator_selector, args.timeout)
    failures += check_crds(client.CustomObjectsApi(), client.ApiException, args.namespace)
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
