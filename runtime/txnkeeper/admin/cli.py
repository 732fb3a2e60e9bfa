"""``txnkeeper admin ...``: the pod admin API from a shell, verbs mirroring ``pulsar-admin transactions``.

Prints the JSON the pod returns; exits non-zero with the pod's error message when a call fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from txnkeeper.admin import move
from txnkeeper.admin.auth import TOKEN_ENV, load_admin_token
from txnkeeper.contract import tls
from txnkeeper.contract.admin import COORDINATOR_ROUTE
from txnkeeper.contract.batching import FLUSH_MODES
from txnkeeper.contract.placement import DEFAULT_PRECOPY_MIB_PER_S
from txnkeeper.contract.tls import TlsClientSettings

DEFAULT_URL = "http://127.0.0.1:8080"
# A transaction id as TxnID prints it, "(most,least)", or "most:least"; digits 0-9 only ([0-9], not
# \d: that takes any script's digits, which int() then reads as a different number than was meant).
_TXN_ID = re.compile(r"\(([0-9]{1,20}),([0-9]{1,20})\)|([0-9]{1,20}):([0-9]{1,20})")
_TXN_ID_FORMS = "(MOST,LEAST) or MOST:LEAST, e.g. (0,42) or 0:42"
# Pulsar's topic policy verbs and their keys (contracts §6 "Topic policies").
TOPIC_POLICY_VERBS = {
    "retention": "retentionTimeInMinutes, retentionSizeInMB",
    "message-ttl": "messageTTLInSeconds",
    "backlog-quota": "limitSize, limitTime, policy",
}
SET_EXAMPLES = {
    "offload-policies": "offloadMode=ledger",
    "retention": "retentionTimeInMinutes=60",
    "message-ttl": "messageTTLInSeconds=3600",
    "backlog-quota": "policy=producer_exception",
}


class AdminCallError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def call(
    url: str,
    method: str,
    path: str,
    token: str | None = None,
    body: object = None,
    *,
    timeout: float = 30.0,
    tls_settings: TlsClientSettings | None = None,
) -> Any:
    """One admin API call; returns the decoded JSON (or text for /metrics). ``tls_settings``: an
    https:// URL is verified against its CA file (contract/tls.py)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with tls.url_opener(tls_settings).open(request, timeout=timeout) as response:
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
        reason = tls.describe_url_error(exc.reason, url, tls_settings) or exc.reason
        raise AdminCallError(0, f"cannot reach {url}: {reason}") from exc


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
    parser.add_argument(
        "--tls-ca-file",
        default=os.environ.get(tls.CA_FILE_ENV),
        help="CA bundle verifying https:// pod URLs (--url, a move's --from/--to/--pods; env"
        f" {tls.CA_FILE_ENV})",
    )
    parser.add_argument(
        "--tls-cert-file",
        default=os.environ.get(tls.CERT_FILE_ENV),
        help=f"client certificate for pods that require one (env {tls.CERT_FILE_ENV})",
    )
    parser.add_argument(
        "--tls-key-file",
        default=os.environ.get(tls.KEY_FILE_ENV),
        help=f"its private key (env {tls.KEY_FILE_ENV})",
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
    setter.add_argument(
        "--flush-mode",
        choices=FLUSH_MODES,
        help="adaptive (never holds a batch while the ledger is idle) or delay (Pulsar's pure delay)",
    )
    topics = verbs.add_parser(
        "topics", help="a store pod's topics: PIP-76 offload, retention, message TTL, backlog quota, writers"
    )
    topic_verbs = topics.add_subparsers(dest="action", metavar="VERB")
    topic_verbs.required = True
    for name, help_text in (
        ("offload", "offload now (streaming: closes the current segment); prints the segments closed"),
        ("offload-status", "offload status: status, lastError, firstUnoffloadedMessage, lag, segments"),
        ("offload-segments", "the topic's segments (uuid, status, begin, end)"),
        ("internal-stats", "the topic's managed-ledger internal stats (with `offloaded` per ledger)"),
        ("writers", "single-routing-key writers and idempotent producers of the topic (last event numbers)"),
    ):
        topic_verbs.add_parser(name, help=help_text).add_argument("topic")
    transactions = verbs.add_parser("transactions", help="a coordinator pod's transactions")
    txn_verbs = transactions.add_subparsers(dest="action", metavar="VERB")
    txn_verbs.required = True
    txn_verbs.add_parser(
        "abort",
        help="abort an open transaction (on the coordinator pod hosting it), e.g. one holding a topic",
        description="Abort an open transaction without its owner: its messages are never delivered"
        " and every later message of its topics is released. Prints {txnId, status, alreadyEnded};"
        " status ABORTING (HTTP 202) means the abort is decided and still being delivered to stores.",
    ).add_argument("txn_id", metavar="TXNID", help=_TXN_ID_FORMS)
    policies = topic_verbs.add_parser("offload-policies", help="get|set|remove a topic's offload settings")
    policy_actions = policies.add_subparsers(dest="policy_action", metavar="get|set|remove")
    policy_actions.required = True
    policy_actions.add_parser("get").add_argument("topic")
    policy_actions.add_parser("remove").add_argument("topic")
    setter = policy_actions.add_parser(
        "set", help="set KEY=VALUE pairs (Pulsar's key names) over the pod's offload settings"
    )
    setter.add_argument("topic")
    setter.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    for name, keys in TOPIC_POLICY_VERBS.items():
        policy = topic_verbs.add_parser(name, help=f"get|set|remove a topic's {name} ({keys})")
        actions = policy.add_subparsers(dest="policy_action", metavar="get|set|remove")
        actions.required = True
        actions.add_parser("get").add_argument("topic")
        actions.add_parser("remove").add_argument("topic")
        setter = actions.add_parser("set", help=f"set KEY=VALUE pairs ({keys}) over the pod's defaults")
        setter.add_argument("topic")
        setter.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    _register_shards(verbs)
    _register_coordinators(verbs)
    parser.set_defaults(func=run)


def _add_move_parser(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], id_flag: str, what: str
) -> argparse.ArgumentParser:
    """The ``move`` verb both kinds share: which id (``--shard`` / ``--coordinator``), the pods it
    moves between, and how an interrupted move resumes."""
    mover = actions.add_parser(
        "move",
        help=f"move {what}: fence on --from, receive on --to, the new placement record (to, from, --pods),"
        " release on --from (docs/contracts.md §12); not for operator-managed resources",
    )
    mover.add_argument(id_flag, type=int, required=True)
    mover.add_argument("--from", dest="source", required=True, metavar="ADMIN_URL")
    mover.add_argument("--to", dest="target", required=True, metavar="ADMIN_URL")
    mover.add_argument("--pods", default="", metavar="ADMIN_URL,...", help="every other pod of the resource")
    mover.add_argument("--move-id", help="resume an interrupted move with its id")
    mover.add_argument("--no-rollback", action="store_true", help="leave a failed move as it is")
    return mover


def _register_shards(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    shards = verbs.add_parser("shards", help="store shards: list them, move one between pods, unload one")
    actions = shards.add_subparsers(dest="shards_action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="GET /admin/v1/shards of each pod (default: --url)")
    listing.add_argument("pods", nargs="*", metavar="ADMIN_URL")
    mover = _add_move_parser(actions, "--shard", "a shard (its closed files pre-copied to --to first)")
    mover.add_argument(
        "--no-precopy",
        action="store_true",
        help="copy everything after the fence (the shard pauses for the whole copy)",
    )
    mover.add_argument(
        "--precopy-mib-per-s",
        type=float,
        default=float(DEFAULT_PRECOPY_MIB_PER_S),
        help="bound the pre-copy's bandwidth (it shares CPU, disks and network with the shard's clients);"
        " 0: unbounded (default: %(default)s, as the operator's spec.scaling.precopyMiBPerSecond)",
    )
    unload = actions.add_parser("unload", help="fence and unfence a topic's shard: its clients reconnect")
    unload.add_argument("topic")


def _register_coordinators(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    coordinators = verbs.add_parser(
        "coordinators",
        help="coordinator ids of pods placed by a record (--coordinator-ids auto): list them, move one",
    )
    actions = coordinators.add_subparsers(dest="coordinators_action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="GET /admin/v1/coordinators of each pod (default: --url)")
    listing.add_argument("pods", nargs="*", metavar="ADMIN_URL")
    _add_move_parser(actions, "--coordinator", "a coordinator id with its open transactions")


def _answer(kind: str, action: str, move_id: str, call: Callable[[], Any]) -> int:
    """Run one verb of ``shards``/``coordinators``: its JSON on stdout, or the error (with how to resume
    an interrupted move) on stderr."""
    try:
        result = call()
    except (move.MoveError, ValueError) as exc:
        hint = f" (move id {move_id}: repeat with --move-id {move_id})" if action == "move" else ""
        print(f"txnkeeper admin {kind} {action}: {exc}{hint}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _move_id(ns: argparse.Namespace, kind: str, number: int) -> str:
    return getattr(ns, "move_id", None) or f"{kind}-{number}-{uuid.uuid4().hex[:12]}"


def _run_coordinators(ns: argparse.Namespace) -> int:
    action = ns.coordinators_action
    move_id = _move_id(ns, "coordinator", getattr(ns, "coordinator", 0))

    def call() -> Any:
        tls_settings = _tls_settings(ns)
        if action == "list":
            route = COORDINATOR_ROUTE
            return asyncio.run(move.list_shards(ns.pods or [ns.url], tls=tls_settings, route=route))
        report = asyncio.run(
            move.move_coordinator(
                ns.coordinator,
                ns.source,
                ns.target,
                token=load_admin_token(ns.token_file),
                others=[p for p in ns.pods.split(",") if p],
                move=move_id,
                roll_back=not ns.no_rollback,
                tls=tls_settings,
            )
        )
        return report.to_json()

    return _answer("coordinators", action, move_id, call)


def _run_shards(ns: argparse.Namespace) -> int:
    action = ns.shards_action
    move_id = _move_id(ns, "shard", getattr(ns, "shard", 0))

    def call() -> Any:
        tls_settings = _tls_settings(ns)
        if action == "list":
            return asyncio.run(move.list_shards(ns.pods or [ns.url], tls=tls_settings))
        if action == "unload":
            token = load_admin_token(ns.token_file)
            return asyncio.run(move.unload(ns.url, ns.topic, token=token, tls=tls_settings))
        report = asyncio.run(
            move.move_shard(
                ns.shard,
                ns.source,
                ns.target,
                token=load_admin_token(ns.token_file),
                others=[p for p in ns.pods.split(",") if p],
                move=move_id,
                roll_back=not ns.no_rollback,
                precopy=not ns.no_precopy,
                precopy_bytes_per_second=(
                    int(ns.precopy_mib_per_s * 1024 * 1024) if ns.precopy_mib_per_s else None
                ),
                tls=tls_settings,
            )
        )
        return report.to_json()

    return _answer("shards", action, move_id, call)


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
    if verb == "topics":
        return _topic_request(ns)
    if verb == "transactions":
        most, least = parse_txn_id(ns.txn_id)
        return "POST", f"/admin/v3/transactions/abortTransaction/{most}/{least}", None
    if verb == "coordinator-internal-stats":
        return "GET", f"/admin/v3/transactions/coordinatorInternalStats/{ns.coordinator_id}", None
    if verb == "pending-ack-internal-stats":
        query = urllib.parse.urlencode({"topic": ns.topic, "subscription": ns.subscription})
        return "GET", f"/admin/v3/transactions/pendingAckInternalStats?{query}", None
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
    if ns.flush_mode is not None:
        partial["batchedWriteFlushMode"] = ns.flush_mode
    targets = ("coordinator", "pendingAck") if ns.target == "both" else (ns.target,)
    return "POST", "/admin/v1/batch-log", {t: partial for t in targets}


def parse_txn_id(text: str) -> tuple[int, int]:
    """(most, least) of a transaction id written ``(most,least)`` or ``most:least``; ValueError says
    what is wrong."""
    match = _TXN_ID.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text[:60]!r} is not a transaction id; write it {_TXN_ID_FORMS}")
    most, least = (int(part) for part in match.groups() if part is not None)
    if most >= 2**63 or least >= 2**64:
        raise ValueError(f"transaction id {text[:60]!r} is out of range; write it {_TXN_ID_FORMS}")
    return most, least


def _topic_request(ns: argparse.Namespace) -> tuple[str, str, object]:
    query = "?" + urllib.parse.urlencode({"topic": ns.topic})
    if ns.action == "offload":
        return "POST", "/admin/v1/topics/offload" + query, {}
    if ns.action != "offload-policies" and ns.action not in TOPIC_POLICY_VERBS:
        return "GET", f"/admin/v1/topics/{ns.action}" + query, None
    path = f"/admin/v1/topics/{ns.action}" + query
    if ns.policy_action == "get":
        return "GET", path, None
    if ns.policy_action == "remove":
        return "DELETE", path, None
    body: dict[str, str] = {}
    for pair in ns.settings:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"setting {pair!r} is not KEY=VALUE (e.g. {SET_EXAMPLES[ns.action]})")
        body[key] = value  # the pod converts and checks values (numbers may be given as text)
    return "POST", path, body


def _tls_settings(ns: argparse.Namespace) -> TlsClientSettings | None:
    if ns.tls_ca_file is None:
        if ns.tls_cert_file or ns.tls_key_file:
            raise ValueError("--tls-cert-file/--tls-key-file need --tls-ca-file (the CA verifying the pod)")
        return None
    return TlsClientSettings(ns.tls_ca_file, ns.tls_cert_file, ns.tls_key_file)


def run(ns: argparse.Namespace) -> int:
    if ns.verb == "shards":
        return _run_shards(ns)
    if ns.verb == "coordinators":
        return _run_coordinators(ns)
    try:
        method, path, body = _request(ns)
    except ValueError as exc:
        print(f"txnkeeper admin {ns.verb}: {exc}", file=sys.stderr)
        return 2
    try:
        token = load_admin_token(ns.token_file) if method != "GET" else None
        result = call(ns.url, method, path, token, body, tls_settings=_tls_settings(ns))
    except (AdminCallError, ValueError) as exc:
        print(f"txnkeeper admin {ns.verb}: {exc}", file=sys.stderr)
        return 1
    print(result if isinstance(result, str) else json.dumps(result, indent=2, sort_keys=True))
    return 0
