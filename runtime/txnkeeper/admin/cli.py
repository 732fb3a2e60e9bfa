"""``txnkeeper admin ...``: the pod admin API from a shell, verbs mirroring ``pulsar-admin transactions``.

Prints the JSON the pod returns; exits non-zero with the pod's error message when a call fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from txnkeeper.admin.auth import TOKEN_ENV, load_admin_token

DEFAULT_URL = "http://127.0.0.1:8080"


class AdminCallError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def call(
    url: str, method: str, path: str, token: str | None = None, body: object = None, *, timeout: float = 30.0
) -> Any:
    """One admin API call; returns the decoded JSON (or text for /metrics)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            if response.headers.get_content_type() == "application/json":
                return json.loads(raw)
            return raw.decode()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = json.loads(raw).get("error") or json.loads(raw).get("reason") or raw.decode()
        except (json.JSONDecodeError, AttributeError):
            message = raw.decode(errors="replace")
        raise AdminCallError(exc.code, str(message)) from exc
    except urllib.error.URLError as exc:
        raise AdminCallError(0, f"cannot reach {url}: {exc.reason}") from exc


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("admin", help="call a pod's admin API (pulsar-admin transactions verbs)")
    parser.add_argument(
        "--url", default=os.environ.get("TXNKEEPER_ADMIN_URL", DEFAULT_URL), help="pod admin URL"
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get("TXNKEEPER_ADMIN_TOKEN_FILE"),
        help=f"bearer token file for mutating calls (or env {TOKEN_ENV})",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    for name, help_text in (
        ("info", "pod, role, release and format level"),
        ("ready", "readiness"),
        ("coordinator-stats", "coordinatorArray: each coordinator's state and batch-log setting"),
        ("pending-ack-stats", "subscriptionArray: each pending-ack store's batch-log setting"),
        ("stores", "the stores hosted on the pod"),
        ("stores-ledgers", "ledgers and live entry formats of every store (the verifier's input)"),
        ("rollover", "roll every store's ledger over; prints lastBatchedLedger per store"),
        ("metrics", "Prometheus metrics"),
    ):
        verbs.add_parser(name, help=help_text)
    internal = verbs.add_parser(
        "coordinator-internal-stats", help="a coordinator's transaction log internals"
    )
    internal.add_argument("--coordinator-id", type=int, required=True)
    pending = verbs.add_parser(
        "pending-ack-internal-stats", help="a subscription's pending-ack log internals"
    )
    pending.add_argument("--topic", required=True)
    pending.add_argument("--subscription", required=True)
    topics = verbs.add_parser("topics", help="a topic's state on the pod")
    topic_actions = topics.add_subparsers(dest="action", metavar="writers")
    topic_actions.required = True
    writers = topic_actions.add_parser(
        "writers", help="single-routing-key writers and idempotent producers of TOPIC (last event numbers)"
    )
    writers.add_argument("topic", metavar="TOPIC")
    batch = verbs.add_parser("batch-log", help="get or set the batch log (PIP-160) of the pod's stores")
    actions = batch.add_subparsers(dest="action", metavar="get|set")
    actions.required = True
    actions.add_parser("get")
    setter = actions.add_parser("set")
    setter.add_argument("--target", choices=("coordinator", "pendingAck", "both"), default="both")
    setter.add_argument("--enabled", choices=("true", "false"))
    setter.add_argument("--max-records", type=int)
    setter.add_argument("--max-size", type=int)
    setter.add_argument("--max-delay-millis", type=float)
    parser.set_defaults(func=run)


def _request(ns: argparse.Namespace) -> tuple[str, str, object]:
    verb = ns.verb
    simple = {
        "info": "/admin/v1/info",
        "ready": "/ready",
        "coordinator-stats": "/admin/v3/transactions/coordinatorStats",
        "pending-ack-stats": "/admin/v3/transactions/pendingAckStats",
        "stores": "/admin/v1/stores",
        "stores-ledgers": "/admin/v1/stores/ledgers",
        "metrics": "/metrics",
    }
    if verb in simple:
        return "GET", simple[verb], None
    if verb == "rollover":
        return "POST", "/admin/v1/stores/rollover", {}
    if verb == "coordinator-internal-stats":
        return "GET", f"/admin/v3/transactions/coordinatorInternalStats/{ns.coordinator_id}", None
    if verb == "pending-ack-internal-stats":
        query = urllib.parse.urlencode({"topic": ns.topic, "subscription": ns.subscription})
        return "GET", f"/admin/v3/transactions/pendingAckInternalStats?{query}", None
    if verb == "topics":
        return "GET", f"/admin/v1/topics/writers?{urllib.parse.urlencode({'topic': ns.topic})}", None
    if ns.action == "get":
        return "GET", "/admin/v1/batch-log", None
    partial: dict[str, Any] = {}
    if ns.enabled is not None:
        partial["batchEnabled"] = ns.enabled == "true"
    if ns.max_records is not None:
        partial["batchedWriteMaxRecords"] = ns.max_records
    if ns.max_size is not None:
        partial["batchedWriteMaxSize"] = ns.max_size
    if ns.max_delay_millis is not None:
        partial["batchedWriteMaxDelayInMillis"] = ns.max_delay_millis
    targets = ("coordinator", "pendingAck") if ns.target == "both" else (ns.target,)
    return "POST", "/admin/v1/batch-log", {t: partial for t in targets}


def run(ns: argparse.Namespace) -> int:
    method, path, body = _request(ns)
    try:
        token = load_admin_token(ns.token_file) if method != "GET" else None
        result = call(ns.url, method, path, token, body)
    except (AdminCallError, ValueError) as exc:
        print(f"txnkeeper admin {ns.verb}: {exc}", file=sys.stderr)
        return 1
    print(result if isinstance(result, str) else json.dumps(result, indent=2, sort_keys=True))
    return 0
