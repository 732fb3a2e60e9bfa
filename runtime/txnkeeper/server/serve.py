"""``txnkeeper serve``: run one pod's runtime until SIGTERM (contracts §6).

Every flag has a ``TXNKEEPER_*`` environment equivalent (the operator's StatefulSet sets env); the
flag wins when both are given. SIGTERM/SIGINT close gracefully: writers flush, ledgers close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from txnkeeper import __version__, gcpolicy, process_settings
from txnkeeper.admin.auth import load_admin_token
from txnkeeper.contract.formats import Feature, FeatureUnavailableError, require_feature
from txnkeeper.contract.placement import MAX_MEMBERS, MAX_SHARDS
from txnkeeper.process_settings import ProcessSettings
from txnkeeper.protocol.auth import SECRET_ENV, ClusterSecretError, load_cluster_secret
from txnkeeper.protocol.clientauth import KEY_ENV, KEY_FLAG, ClientTokenKeyError, load_client_token_key
from txnkeeper.protocol.limits import ConnectionLimits, InvalidLimitsError
from txnkeeper.release import UnknownReleaseError, format_level
from txnkeeper.server import (
    offload_settings,
    pulsar_config,
    srk_config,
    tls_settings,
    topic_policies,
    txn_config,
)
from txnkeeper.server.config import (
    ROLES,
    ConfigError,
    ServeConfig,
    auto_coordinator_placement,
    batch_configs,
    coordinator_ids,
    default_pod_name,
    env,
)
from txnkeeper.topic.tailcache import DEFAULT_MAX_BYTES as DEFAULT_TAIL_CACHE_BYTES
from txnkeeper.topic.writers import SingleKeySettings

log = logging.getLogger("txnkeeper.serve")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run a coordinator or store pod runtime",
        description="Run one pod: transaction coordinators (role coordinator) or topics, subscriptions and "
        "their pending-ack stores (role store). Flags default to TXNKEEPER_<FLAG> environment variables.",
    )
    parser.add_argument("--role", choices=ROLES, default=env("ROLE"))
    parser.add_argument("--data-dir", type=Path, default=env("DATA_DIR"))
    parser.add_argument(
        "--release", default=env("RELEASE", __version__ if __version__ != "0.0.0" else "2.0.0")
    )
    parser.add_argument("--listen", default=env("LISTEN", "0.0.0.0:6650"), help="client protocol host:port")
    parser.add_argument(
        "--admin-listen", default=env("ADMIN_LISTEN", "0.0.0.0:8080"), help="admin API host:port"
    )
    parser.add_argument("--pod-name", default=env("POD_NAME"))
    parser.add_argument("--coordinators", type=int, default=env("COORDINATORS"))
    parser.add_argument("--coordinator-ids", default=env("COORDINATOR_IDS"), help="0,1,... or auto")
    parser.add_argument(
        "--replicas",
        type=int,
        default=env("REPLICAS"),
        help="pods of the resource: sharing the coordinators, or (store pods) the first placement record's"
        " pods (docs/contracts.md §12; without it and without a record given, a store serves every topic)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=env("SHARDS"),
        help="store pods: the resource's shard count (a multiple of --replicas; default 16 x --replicas)",
    )
    parser.add_argument("--admin-token-file", default=env("ADMIN_TOKEN_FILE"))
    parser.add_argument(
        "--cluster-secret-file",
        default=env("CLUSTER_SECRET_FILE"),
        help=f"secret shared by coordinator and store pods (env {SECRET_ENV}); without it transactions"
        " are refused",
    )
    parser.add_argument(
        KEY_FLAG,
        dest="client_token_key_file",
        default=env("CLIENT_TOKEN_KEY_FILE"),
        help=f"store pods: HS256 key of client tokens (env {KEY_ENV}); with it, single-key writer ids and"
        " producer names belong to the principal of the connection's token (ClientAuth), which"
        " SetupAppend then requires",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=env("CONFIG"),
        help='JSON/YAML: batchedWrite and the sections "offload", "singleKeyTransactions", "topicPolicies"',
    )
    parser.add_argument(
        "--ports-file",
        type=Path,
        default=env("PORTS_FILE"),
        help="write {listen, admin} bound addresses here once ready (useful with port 0)",
    )
    defaults = ConnectionLimits()
    parser.add_argument(
        "--max-connections",
        type=int,
        default=env("MAX_CONNECTIONS", str(defaults.max_connections)),
        help="client protocol connections open at once; more are refused with an error frame",
    )
    parser.add_argument(
        "--max-pending-bytes",
        type=int,
        default=env("MAX_PENDING_BYTES", str(defaults.max_pending_bytes)),
        help="bytes of incomplete frames buffered across all connections; the connection that would"
        " exceed it is closed",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=env("IDLE_TIMEOUT", str(defaults.idle_timeout_s)),
        help="seconds a connection without consumers may send nothing before it is closed",
    )
    parser.add_argument(
        "--frame-timeout",
        type=float,
        default=env("FRAME_TIMEOUT", str(defaults.frame_timeout_s)),
        help="seconds a started frame has to arrive completely",
    )
    parser.add_argument(
        "--max-unsent-bytes",
        type=int,
        default=env("MAX_UNSENT_BYTES", str(defaults.max_unsent_bytes)),
        help="bytes of answers and pushed messages one connection may leave unread; more aborts it"
        " (its requests are not read once it leaves 1 MiB unread)",
    )
    parser.add_argument(
        "--write-timeout",
        type=float,
        default=env("WRITE_TIMEOUT", str(defaults.write_timeout_s)),
        help="seconds a connection may leave its answers unread before it is aborted",
    )
    parser.add_argument(
        "--max-total-unsent-bytes",
        type=int,
        default=env("MAX_TOTAL_UNSENT_BYTES", str(defaults.max_total_unsent_bytes)),
        help="answers and pushed messages all connections together may leave unread; past it, messages"
        " are pushed only to connections holding under 64 KiB unread (each connection gets none past 1 MiB)",
    )
    parser.add_argument(
        "--handshake-timeout",
        type=float,
        default=env("HANDSHAKE_TIMEOUT", str(defaults.handshake_timeout_s)),
        help="seconds a new connection has to complete its first request before it is closed",
    )
    parser.add_argument(
        "--max-handshaking-connections",
        type=int,
        default=env("MAX_HANDSHAKING_CONNECTIONS", str(defaults.max_handshaking_connections)),
        help="connections that have not completed a request yet; the oldest is closed to admit a new one",
    )
    parser.add_argument(
        "--max-connections-per-address",
        type=int,
        default=env("MAX_CONNECTIONS_PER_ADDRESS", str(defaults.max_connections_per_address)),
        help="connections one peer address may hold open; more are refused with an error frame",
    )
    parser.add_argument(
        "--max-requests-in-flight",
        type=int,
        default=env("MAX_REQUESTS_IN_FLIGHT", str(defaults.max_requests_in_flight)),
        help="requests one connection may have unanswered (Pulsar sends until their receipts); past it"
        " the connection is not read until half of them are answered",
    )
    parser.add_argument(
        "--max-total-request-bytes",
        type=int,
        default=env("MAX_TOTAL_REQUEST_BYTES", str(defaults.max_total_request_bytes)),
        help="bytes the unanswered requests of all connections together may hold; past it a connection"
        " adding one is not read until they hold half of it",
    )
    parser.add_argument(
        "--tail-cache-bytes",
        type=int,
        default=env("TAIL_CACHE_BYTES", str(DEFAULT_TAIL_CACHE_BYTES)),
        help="bytes of recently written entries all topics together keep in memory for consumers that"
        " keep up (each entry counts its payload plus 240); the oldest go first; 0: read from disk",
    )
    parser.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    srk_config.add_arguments(parser)
    txn_config.add_arguments(parser)
    pulsar_config.add_arguments(parser)
    tls_settings.add_arguments(parser)
    process_settings.add_arguments(parser)
    parser.set_defaults(func=run)


def build_config(ns: argparse.Namespace) -> ServeConfig:
    if ns.role is None:
        raise ConfigError("--role (or TXNKEEPER_ROLE) is required: coordinator or store")
    if ns.data_dir is None:
        raise ConfigError("--data-dir (or TXNKEEPER_DATA_DIR) is required")
    try:
        format_level(ns.release)
    except UnknownReleaseError as exc:
        raise ConfigError(str(exc)) from exc
    if ns.role == "store" and (ns.replicas is not None or ns.shards is not None):
        if ns.replicas is None:
            raise ConfigError("--shards (or TXNKEEPER_SHARDS) needs --replicas: the pods the shards start on")
        # Ranges only: whether --shards is a multiple of --replicas matters for the first record, which a
        # pod builds only when it holds none (after scaling, its record's count no longer divides).
        if not 1 <= ns.replicas <= MAX_MEMBERS or not 1 <= (ns.shards or 1) <= MAX_SHARDS:
            raise ConfigError(
                f"--replicas must be 1..{MAX_MEMBERS} and --shards 1..{MAX_SHARDS}, not {ns.replicas}"
                f" and {ns.shards}"
            )
    try:
        token = load_admin_token(ns.admin_token_file)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        secret = load_cluster_secret(ns.cluster_secret_file)
    except ClusterSecretError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        client_key = load_client_token_key(ns.client_token_key_file)
    except ClientTokenKeyError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        limits = ConnectionLimits(
            max_connections=ns.max_connections,
            max_pending_bytes=ns.max_pending_bytes,
            idle_timeout_s=ns.idle_timeout,
            frame_timeout_s=ns.frame_timeout,
            max_unsent_bytes=ns.max_unsent_bytes,
            write_timeout_s=ns.write_timeout,
            max_total_unsent_bytes=ns.max_total_unsent_bytes,
            handshake_timeout_s=ns.handshake_timeout,
            max_handshaking_connections=ns.max_handshaking_connections,
            max_connections_per_address=ns.max_connections_per_address,
            max_requests_in_flight=ns.max_requests_in_flight,
            max_total_request_bytes=ns.max_total_request_bytes,
        )
    except InvalidLimitsError as exc:
        raise ConfigError(f"connection limits: {exc}") from exc
    txnlog_batch, pending_ack_batch = batch_configs(ns.config)
    try:
        offload = offload_settings.load(ns.config)
    except offload_settings.OffloadSettingsError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        policies = topic_policies.load(ns.config)
    except topic_policies.TopicPolicySettingsError as exc:
        raise ConfigError(str(exc)) from exc
    single_key_loaded = srk_config.load(ns, ns.config)
    single_key = SingleKeySettings(**single_key_loaded.values)
    txn_timeouts = txn_config.txn_timeouts(ns, ns.config)
    _gate_features(ns, offload, single_key_loaded.sources["enabled"] if single_key.enabled else None)
    if ns.tail_cache_bytes < 0:
        raise ConfigError(
            f"--tail-cache-bytes (or TXNKEEPER_TAIL_CACHE_BYTES) is {ns.tail_cache_bytes}: give 0 (no"
            f" tail cache: consumers read from disk) or more bytes (default {DEFAULT_TAIL_CACHE_BYTES})"
        )
    pod_name = ns.pod_name or default_pod_name()
    placed = auto_coordinator_placement(
        ns.coordinators, ns.coordinator_ids, replicas=ns.replicas, pod_name=pod_name
    )
    return ServeConfig(
        role=ns.role,
        data_dir=ns.data_dir,
        release=ns.release,
        listen=ns.listen,
        admin_listen=ns.admin_listen,
        pod_name=pod_name,
        coordinator_ids=placed[0]
        if placed is not None
        else coordinator_ids(ns.coordinators, ns.coordinator_ids, replicas=ns.replicas, pod_name=pod_name),
        coordinator_placement=placed[1] if placed is not None else None,
        admin_token=token,
        txnlog_batch=txnlog_batch,
        pending_ack_batch=pending_ack_batch,
        ports_file=ns.ports_file,
        cluster_secret=secret.key if secret is not None else None,
        client_token_key=client_key,
        connection_limits=limits,
        offload=offload,
        single_key=single_key,
        txn_timeouts=txn_timeouts,
        topic_policies=policies,
        tail_cache_bytes=ns.tail_cache_bytes,
        pulsar=pulsar_config.placement(ns, ns.config),
        replicas=ns.replicas,
        shards=ns.shards,
        tls=tls_settings.settings(ns, ns.config),
    )


def _gate_features(ns: argparse.Namespace, offload: dict[str, Any] | None, srk_enabled: str | None) -> None:
    """Refuse settings that switch on a feature the pod's ``--release`` lacks (contracts §4, §6).

    The operator never renders them for such a release (CEL and its own gate), but a hand-written
    config or flag must not let a 2.x pod write metadata version 2 or writer state that the same
    release could not read back after a restart. Checked after the sections' own validation, so a
    malformed section is reported as such first.
    """
    wanted: list[tuple[Feature, str]] = []
    if srk_enabled is not None:  # how it was switched on: the flag, its env variable or the file's key
        wanted.append((Feature.SINGLE_KEY_TRANSACTIONS, srk_enabled))
    if offload:
        # Every accepted section has a driver (filesystem when the key is left out), so even with the
        # threshold at -1 the admin verbs could offload by hand: any section needs the feature.
        driver = offload.get("managedLedgerOffloadDriver", "filesystem")
        threshold = offload.get("managedLedgerOffloadThresholdInBytes", -1)
        source = (
            f"{ns.config}: the {offload_settings.SECTION!r} section (managedLedgerOffloadDriver {driver!r},"
            f" managedLedgerOffloadThresholdInBytes {threshold})"
        )
        wanted.append((Feature.OFFLOAD_SEGMENTS, source))
    for feature, source in wanted:
        try:
            require_feature(ns.release, feature, source)
        except FeatureUnavailableError as exc:
            raise ConfigError(f"{exc} with --release (or TXNKEEPER_RELEASE), or remove the setting") from exc


def run(ns: argparse.Namespace) -> int:
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(ns)
    except ConfigError as exc:
        print(f"txnkeeper serve: {exc}", file=sys.stderr)
        return 2
    try:
        settings = ProcessSettings.from_args(ns)
    except ValueError as exc:
        print(f"txnkeeper serve: {exc}", file=sys.stderr)
        return 2
    return settings.run(_serve(config))


async def _serve(config: ServeConfig) -> int:
    from txnkeeper.server.pod import PodRuntime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pod = PodRuntime(config)
    try:
        await pod.start()
    except Exception as exc:
        log.error("pod %s failed to start: %s", config.pod_name, exc)
        await pod.close()
        return 1
    gcpolicy.freeze_startup_state()
    log.info(
        "pod %s (%s, release %s, format level %d) ready: client %s, admin %s",
        config.pod_name,
        config.role,
        config.release,
        pod.format_level,
        pod.client_address,
        pod.admin_address,
    )
    await stop.wait()
    log.info("pod %s closing", config.pod_name)
    await pod.close()
    return 0
