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
from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.connections import CONNECTIONS, MEMORY
from txnkeeper.contract.settings.process import PROCESS
from txnkeeper.process_settings import ProcessSettings
from txnkeeper.protocol.auth import ClusterSecretError, load_cluster_secret
from txnkeeper.protocol.clientauth import ClientTokenKeyError, load_client_token_key
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
    ConfigError,
    ServeConfig,
    auto_coordinator_placement,
    batch_configs,
    coordinator_ids,
    default_pod_name,
    load_section,
)
from txnkeeper.topic.writers import SingleKeySettings

log = logging.getLogger("txnkeeper.serve")
# --release's default: this runtime's own release (2.0.0 when run from a checkout without a version).
DEFAULT_RELEASE = __version__ if __version__ != "0.0.0" else "2.0.0"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run a coordinator or store pod runtime",
        description="Run one pod: transaction coordinators (role coordinator) or topics, subscriptions and "
        "their pending-ack stores (role store). Flags default to TXNKEEPER_<FLAG> environment variables.",
    )
    schema.add_flags(parser, PROCESS)  # contract/settings/process.py
    schema.add_flags(parser.add_argument_group("connection limits (config connectionLimits)"), CONNECTIONS)
    schema.add_flags(parser.add_argument_group("memory (config memory; store pods)"), MEMORY)
    srk_config.add_arguments(parser)
    txn_config.add_arguments(parser)
    pulsar_config.add_arguments(parser)
    tls_settings.add_arguments(parser)
    process_settings.add_arguments(parser)
    parser.set_defaults(func=run)


def build_config(ns: argparse.Namespace) -> ServeConfig:
    """The pod's configuration: every declared section from flags > env > config file > default, then
    the rules between settings that no single declaration can say."""
    process = load_section(PROCESS, ns, None).values
    if process["role"] is None:
        raise ConfigError("--role (or TXNKEEPER_ROLE) is required: coordinator or store")
    if process["data_dir"] is None:
        raise ConfigError("--data-dir (or TXNKEEPER_DATA_DIR) is required")
    release = process["release"] or DEFAULT_RELEASE
    try:
        format_level(release)
    except UnknownReleaseError as exc:
        raise ConfigError(str(exc)) from exc
    replicas, shards = process["replicas"], process["shards"]
    if process["role"] == "store" and shards is not None and replicas is None:
        # Whether --shards is a multiple of --replicas matters for the first record only, which a pod
        # builds only when it holds none (after scaling, its record's count no longer divides).
        raise ConfigError("--shards (or TXNKEEPER_SHARDS) needs --replicas: the pods the shards start on")
    path = _path(process["config"])
    # The process values typed, for the sections' readers that take serve's namespace.
    ns = argparse.Namespace(**{**vars(ns), "config": path, "coordinators": process["coordinators"]})
    try:
        token = load_admin_token(process["admin_token_file"])
        secret = load_cluster_secret(process["cluster_secret_file"])
        client_key = load_client_token_key(process["client_token_key_file"])
    except (ValueError, ClusterSecretError, ClientTokenKeyError) as exc:
        raise ConfigError(str(exc)) from exc
    try:
        limits = ConnectionLimits(**load_section(CONNECTIONS, ns, path).values)
    except InvalidLimitsError as exc:
        raise ConfigError(f"connection limits: {exc}") from exc
    tail_cache_bytes = load_section(MEMORY, ns, path).values["tail_cache_bytes"]
    txnlog_batch, pending_ack_batch = batch_configs(path)
    try:
        offload = offload_settings.load(path)
    except offload_settings.OffloadSettingsError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        policies = topic_policies.load(path)
    except topic_policies.TopicPolicySettingsError as exc:
        raise ConfigError(str(exc)) from exc
    single_key_loaded = srk_config.load(ns, path)
    single_key = SingleKeySettings(**single_key_loaded.values)
    txn_timeouts = txn_config.txn_timeouts(ns, path)
    _gate_features(
        release, path, offload, single_key_loaded.sources["enabled"] if single_key.enabled else None
    )
    pod_name = process["pod_name"] or default_pod_name()
    count, ids = process["coordinators"], process["coordinator_ids"]
    placed = auto_coordinator_placement(count, ids, replicas=replicas, pod_name=pod_name)
    return ServeConfig(
        role=process["role"],
        data_dir=Path(process["data_dir"]),
        release=release,
        listen=process["listen"],
        admin_listen=process["admin_listen"],
        pod_name=pod_name,
        coordinator_ids=placed[0]
        if placed is not None
        else coordinator_ids(count, ids, replicas=replicas, pod_name=pod_name),
        coordinator_placement=placed[1] if placed is not None else None,
        admin_token=token,
        txnlog_batch=txnlog_batch,
        pending_ack_batch=pending_ack_batch,
        ports_file=_path(process["ports_file"]),
        cluster_secret=secret.key if secret is not None else None,
        client_token_key=client_key,
        connection_limits=limits,
        offload=offload,
        single_key=single_key,
        txn_timeouts=txn_timeouts,
        topic_policies=policies,
        tail_cache_bytes=tail_cache_bytes,
        pulsar=pulsar_config.placement(ns, path),
        replicas=replicas,
        shards=shards,
        tls=tls_settings.settings(ns, path),
        log_level=process["log_level"].upper(),
    )


def _path(text: str | None) -> Path | None:
    return Path(text) if text is not None else None


def _gate_features(
    release: str, path: Path | None, offload: dict[str, Any] | None, srk_enabled: str | None
) -> None:
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
            f"{path}: the {offload_settings.SECTION!r} section (managedLedgerOffloadDriver {driver!r},"
            f" managedLedgerOffloadThresholdInBytes {threshold})"
        )
        wanted.append((Feature.OFFLOAD_SEGMENTS, source))
    for feature, source in wanted:
        try:
            require_feature(release, feature, source)
        except FeatureUnavailableError as exc:
            raise ConfigError(f"{exc} with --release (or TXNKEEPER_RELEASE), or remove the setting") from exc


def run(ns: argparse.Namespace) -> int:
    try:
        config = build_config(ns)
    except ConfigError as exc:
        print(f"txnkeeper serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
