"""Settings of one runtime process: command line, ``TXNKEEPER_*`` environment and ``--config`` file.

Why one module: the operator sets env, the local fleet passes flags and a config file carries the CR's
batchedWrite block; all three meet here and produce one ``ServeConfig``. What a declared section
accepts, and how a refusal reads, is its declaration's (``contract/settings/``, read through
``schema.load``); this module reads the file once and hands each section its part.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnkeeper.bufferedwriter.config import BatchedWriteConfig, InvalidBatchedWriteConfigError
from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.batched_write import BATCHED_WRITE
from txnkeeper.contract.store_settings import DEFAULT_CHECK_INTERVAL_SECONDS
from txnkeeper.contract.tls import TlsServerSettings
from txnkeeper.coordinator.timeouts import TxnTimeoutPolicy
from txnkeeper.protocol.clientauth import ClientTokenKey
from txnkeeper.protocol.limits import ConnectionLimits
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.topic.tailcache import DEFAULT_MAX_BYTES as DEFAULT_TAIL_CACHE_BYTES
from txnkeeper.topic.writers import SingleKeySettings

# Top-level sections of the --config file that other modules read (through ``section``); the batch
# settings parser skips them, and refuses any other key next to its own.
OTHER_SECTIONS = (
    "offload",
    "singleKeyTransactions",
    "transactions",
    "topicPolicies",
    "pulsar",
    "tls",
    "connectionLimits",
    "memory",
)
_BATCH_SECTIONS = ("batchedWrite", "coordinator", "pendingAck")


class ConfigError(ValueError):
    """A setting of the runtime process is missing or wrong (the message names it)."""


@dataclass(frozen=True)
class PodTopicPolicies:
    """The config file's ``topicPolicies`` section, checked (server/topic_policies.py): the store's
    defaults of every topic's policies, per block (``retention``, ``messageTTL``, ``backlogQuota``),
    and how often they are applied."""

    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    check_interval_seconds: int = DEFAULT_CHECK_INTERVAL_SECONDS


@dataclass(frozen=True)
class ServeConfig:
    role: str
    data_dir: Path
    release: str
    listen: str
    admin_listen: str
    pod_name: str
    coordinator_ids: tuple[int, ...] = (0,)
    # With --coordinator-ids auto: (coordinators, replicas) of the resource's first placement record;
    # the pod then serves the ids its record (docs/contracts.md §12) gives it, and coordinator_ids are
    # only what that first record gives it. None: the listed ids, fixed.
    coordinator_placement: tuple[int, int] | None = None
    admin_token: str | None = None
    txnlog_batch: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    pending_ack_batch: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    ports_file: Path | None = None
    cluster_secret: bytes | None = None  # from --cluster-secret-file (txnkeeper.protocol.auth)
    # from --client-token-key-file (txnkeeper.protocol.clientauth); store pods only
    client_token_key: ClientTokenKey | None = None
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    offload: dict[str, Any] | None = None  # the config file's "offload" section (server/offload_settings.py)
    single_key: SingleKeySettings = field(default_factory=SingleKeySettings)
    txn_timeouts: TxnTimeoutPolicy = field(default_factory=TxnTimeoutPolicy)  # server/txn_config.py
    # the config file's "topicPolicies" section (parsed by server/topic_policies.py)
    topic_policies: PodTopicPolicies | None = None
    # All topics' tail caches together (topic/tailcache.py); store pods only.
    tail_cache_bytes: int = DEFAULT_TAIL_CACHE_BYTES
    # Where Pulsar's clients are sent (server/pulsar_config.py); no URLs: this pod itself
    pulsar: PulsarPlacement = field(default_factory=PulsarPlacement)
    # Store pods: the placement record's first epoch (docs/contracts.md §12) when the pod holds none;
    # without replicas (and no record given) the pod serves every topic, as before placement.
    replicas: int | None = None
    shards: int | None = None
    tls: TlsServerSettings | None = None  # server/tls_settings.py; None: plaintext
    log_level: str = "INFO"


def default_pod_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


def coordinator_ids(
    count: int | None, ids: str | None, *, replicas: int | None = None, pod_name: str = ""
) -> tuple[int, ...]:
    """The coordinator ids this pod serves.

    ``ids`` is a list (``0,1``) or ``auto``: every c in [0, count) with c mod replicas == the ordinal
    that ends the pod name (``tc-2`` -> 2), so one StatefulSet template spreads coordinators.
    Without ``ids``: 0..count-1 (count defaults to 1).
    """
    n = 1 if count is None else count
    if n < 1:
        raise ConfigError(f"--coordinators must be >= 1, got {n}")
    if ids is not None and ids.strip() == "auto":
        if replicas is None or replicas < 1:
            raise ConfigError("--coordinator-ids auto needs --replicas R (R >= 1)")
        ordinal_text = pod_name.rpartition("-")[2]
        if not _is_ascii_decimal(ordinal_text):
            raise ConfigError(
                f"--coordinator-ids auto needs a pod name ending in -<ordinal>, got {pod_name!r}"
            )
        ordinal = int(ordinal_text)
        if ordinal >= replicas:
            raise ConfigError(f"pod ordinal {ordinal} is not below --replicas {replicas}")
        served = tuple(c for c in range(n) if c % replicas == ordinal)
        if not served:
            raise ConfigError(
                f"pod {pod_name} serves no coordinator: {n} coordinators over {replicas} replicas"
            )
        return served
    if ids:
        parts = [x.strip() for x in ids.split(",") if x.strip()]
        if not all(_is_ascii_decimal(x) for x in parts):
            raise ConfigError(f"--coordinator-ids must be comma-separated integers 0-9 or auto, got {ids!r}")
        parsed = tuple(int(x) for x in parts)
        if not parsed or any(i < 0 for i in parsed) or len(set(parsed)) != len(parsed):
            raise ConfigError(f"--coordinator-ids must be distinct integers >= 0, got {ids!r}")
        return parsed
    return tuple(range(n))


def auto_coordinator_placement(
    count: int | None, ids: str | None, *, replicas: int | None, pod_name: str
) -> tuple[tuple[int, ...], tuple[int, int]] | None:
    """With ``--coordinator-ids auto``: the ids the first placement record gives this pod (``c mod
    replicas == ordinal``; none for a pod added by a scale-out) and (coordinators, replicas) of that
    record. None for an explicit list (today's fixed ids)."""
    if ids is None or ids.strip() != "auto":
        return None
    n = 1 if count is None else count
    if n < 1:
        raise ConfigError(f"--coordinators must be >= 1, got {n}")
    if replicas is None or replicas < 1:
        raise ConfigError("--coordinator-ids auto needs --replicas R (R >= 1)")
    ordinal_text = pod_name.rpartition("-")[2]
    if not _is_ascii_decimal(ordinal_text):
        raise ConfigError(f"--coordinator-ids auto needs a pod name ending in -<ordinal>, got {pod_name!r}")
    ordinal = int(ordinal_text)
    return tuple(c for c in range(n) if c % replicas == ordinal), (n, replicas)


def load_document(path: Path) -> dict[str, Any]:
    """The --config file as one JSON (or YAML) object; ConfigError names the file and the problem."""
    return _load(path)


def section(doc: dict[str, Any], name: str, source: object = "config file") -> dict[str, Any] | None:
    """Top-level section ``name`` of a loaded config document, or None when the file has none.

    How a module with settings of its own (``OTHER_SECTIONS``) reads them: the file is loaded once
    (``load_document``) and each module takes its section, so no key is silently ignored.
    """
    if name not in OTHER_SECTIONS and name not in _BATCH_SECTIONS:
        raise ValueError(f"{name!r} is not a known config-file section; add it to OTHER_SECTIONS")
    if name not in doc:
        return None
    return _object(doc[name], f"{source}: section {name}")


def file_section(path: Path | None, name: str) -> dict[str, Any] | None:
    """Section ``name`` of the --config file at ``path``: None when there is no file or no such
    section; ConfigError names the file and what is wrong with it."""
    if path is None:
        return None
    return section(load_document(path), name, path)


def load_section(section: schema.Section, ns: argparse.Namespace, path: Path | None) -> schema.Loaded:
    """A declared section from serve's flags > ``TXNKEEPER_*`` env > the config file's section (when the
    section has file keys) > default; ConfigError carries the declaration's message, which names the
    flag, variable or file key, the value and what is allowed."""
    has_file_keys = any(s.in_file for s in section.settings)
    try:
        return schema.load(
            section,
            flags=vars(ns),
            environ=os.environ,
            file=file_section(path, section.name) if has_file_keys else None,
            file_where=f"{path}: {section.name}",
        )
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc


def batch_configs(path: Path | None) -> tuple[BatchedWriteConfig, BatchedWriteConfig]:
    """(transaction log, pending ack) settings from a config file.

    Accepted shapes: the CR's batchedWrite block (``{"enabled": true, "maxRecords": 512, ...}``, for
    both logs), ``{"batchedWrite": {...}}``, or per log ``{"coordinator": {...}, "pendingAck": {...}}``
    where each may use CR keys or Pulsar's TxnBufferedWriterStat keys. The ``OTHER_SECTIONS`` may sit
    next to any of them; any other top-level key is refused.
    """
    if path is None:
        return BatchedWriteConfig(), BatchedWriteConfig()
    data = {k: v for k, v in load_document(path).items() if k not in OTHER_SECTIONS}
    if "batchedWrite" in data:
        unknown = sorted(set(data) - {"batchedWrite"})
        if unknown:
            raise ConfigError(
                f"{path}: unknown top-level key(s) {unknown}; a config file holds batchedWrite (or"
                f" coordinator/pendingAck) and the sections {list(OTHER_SECTIONS)}"
            )
        data = _object(data["batchedWrite"], f"{path}: batchedWrite")
    try:
        if "coordinator" in data or "pendingAck" in data:
            unknown = sorted(set(data) - {"coordinator", "pendingAck"})
            if unknown:
                raise ConfigError(
                    f"{path}: unknown key(s) {unknown} next to coordinator/pendingAck; known top-level"
                    f" keys: {sorted({*_BATCH_SECTIONS, *OTHER_SECTIONS})}"
                )
            return (
                _one(_object(data.get("coordinator", {}), f"{path}: coordinator"), path),
                _one(_object(data.get("pendingAck", {}), f"{path}: pendingAck"), path),
            )
        both = _one(data, path)
        return both, both
    except InvalidBatchedWriteConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _is_ascii_decimal(text: str) -> bool:
    # str.isdigit() and int() also accept non-ASCII digits ("\u0661", "\u00b2"): ids and ordinals are 0-9.
    return text.isascii() and text.isdecimal() and len(text) <= 9


def _one(block: dict[str, Any], path: Path) -> BatchedWriteConfig:
    # One spelling per block, each checked by the declaration: the CR's keys (through the loader, as
    # every section is read) or Pulsar's TxnBufferedWriterStat keys.
    where = f"{path}: {BATCHED_WRITE.name}"
    try:
        if set(block) <= set(BATCHED_WRITE.keys()):
            loaded = schema.load(BATCHED_WRITE, flags={}, environ={}, file=block, file_where=where)
            return BatchedWriteConfig(**loaded.values)
        if set(block) <= set(BATCHED_WRITE.keys("stat")):
            fields = schema.parse(BATCHED_WRITE, block, where, spelling="stat")
            return BatchedWriteConfig(**(BATCHED_WRITE.defaults() | fields))
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc
    block_keys, stat_keys = set(BATCHED_WRITE.keys()), set(BATCHED_WRITE.keys("stat"))
    unknown = sorted(set(block) - block_keys - stat_keys)
    raise ConfigError(
        f"{path}: unknown batchedWrite key(s) {unknown or sorted(block)}; use the CR's keys"
        f" {sorted(block_keys)} or Pulsar's TxnBufferedWriterStat keys {sorted(stat_keys)}, not a mix"
    )


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object")
    return value


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number: JSON has no NaN or Infinity; write a finite number")


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.start}); write it as UTF-8 JSON or YAML"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data: object = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise ConfigError(f"config file {path} nests too deeply to be a batchedWrite block") from exc
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError as exc:
            raise ConfigError(f"config file {path} is not JSON (and PyYAML is not installed)") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is neither JSON nor YAML: {exc}") from exc
        except RecursionError as exc:
            raise ConfigError(f"config file {path} nests too deeply to be a batchedWrite block") from exc
    except ValueError as exc:  # an integer longer than Python's int-from-text limit, NaN, Infinity
        raise ConfigError(f"config file {path}: {exc}") from exc
    if data is None:
        return {}
    return _object(data, f"config file {path}")
