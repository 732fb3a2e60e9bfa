"""One table of values through every reader of a declared settings section (contract/settings/): the
generated CRD (its schema and CEL rules, as test_op_crds evaluates them), the chart's values.schema.json
(the keys it describes), the operator's reading of a CR, the pod's ``--config`` file loader, serve's
flags and env, and a real pod's admin API. They must accept and refuse the same values; the few
deliberate differences are spelled out per row (``ONLY``), with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_op_crds import cel_errors

from txnkeeper.client import Client
from txnkeeper.contract.batching import BatchSettings, InvalidBatchSettingsError
from txnkeeper.contract.coordinator_settings import HARD_MAX_TIMEOUT_MS
from txnkeeper.contract.settings.batched_write import BATCHED_WRITE, MAX_MAX_SIZE_BYTES
from txnkeeper.contract.settings.offload import (
    MAX_MAX_BLOCK_SIZE_BYTES,
    MAX_SEGMENT_ROLLOVER_SECONDS,
    offload_config,
)
from txnkeeper.contract.settings.pulsar import PULSAR
from txnkeeper.contract.settings.schema import property_schema
from txnkeeper.contract.settings.sections import SECTIONS
from txnkeeper.contract.settings.single_key import SINGLE_KEY
from txnkeeper.contract.settings.tls import TLS
from txnkeeper.contract.settings.topic_policies import TOPIC_POLICIES
from txnkeeper.contract.settings.transactions import TRANSACTIONS
from txnkeeper.contract.store_settings import (
    SRK_MAX_BLOCK_BYTES,
    SRK_MAX_WRITER_INACTIVITY_MINUTES,
    topic_policies_config,
    topic_policy_problems,
)
from txnkeeper.server import (
    offload_settings,
    pulsar_config,
    srk_config,
    tls_settings,
    topic_policies,
    txn_config,
)
from txnkeeper.server.config import ConfigError, batch_configs
from txnkeeper_operator import builders
from txnkeeper_operator.engine import Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import TOKEN, ServePod, http

ROOT = Path(__file__).resolve().parents[2]
CHART_EXAMPLES = json.loads((ROOT / "helm/txnkeeper/values.schema.json").read_text())["properties"][
    "examples"
]["properties"]
MIB = 1024 * 1024

# Readers of each section. A row accepted by all of them is True; a row with a deliberate difference
# names the readers that accept it (and why, in a comment).
BATCH_READERS = ("crd", "chart", "operator", "file", "admin")
SRK_READERS = ("crd", "chart", "file", "flags", "env")

# (block, accepted)  accepted: True / False for every reader, or the set of readers that accept it.
BATCH_ROWS: list[tuple[dict[str, Any], bool | set[str]]] = [
    ({}, True),
    ({"enabled": True}, True),
    ({"enabled": False}, True),
    ({"enabled": "true"}, False),
    ({"enabled": 1}, False),
    ({"maxRecords": 1}, True),
    ({"maxRecords": 0}, False),
    ({"maxRecords": 65536}, True),
    ({"maxRecords": 65537}, False),
    ({"maxRecords": 1.5}, False),
    ({"maxRecords": "512"}, False),
    ({"maxRecords": True}, False),
    ({"maxSizeBytes": 6}, True),
    ({"maxSizeBytes": 5}, False),
    ({"maxSizeBytes": MAX_MAX_SIZE_BYTES}, True),
    ({"maxSizeBytes": MAX_MAX_SIZE_BYTES + 1}, False),
    ({"maxSizeBytes": 64 * MIB}, False),
    ({"maxDelayMillis": 0}, True),
    ({"maxDelayMillis": 60_000}, True),
    ({"maxDelayMillis": 60_001}, False),
    ({"maxDelayMillis": -1}, False),
    ({"maxDelayMillis": 10**12}, False),
    ({"maxDelayMillis": "1"}, False),
    # Pods take fractions of a millisecond; a CR whole milliseconds (the operator rounds what it reads).
    ({"maxDelayMillis": 0.5}, {"operator", "file", "admin"}),
    ({"flushMode": "delay"}, True),
    ({"flushMode": "adaptive"}, True),
    ({"flushMode": "eager"}, False),
    ({"flushMode": ""}, False),
    # A pod takes maxRecords 1 as "every record its own entry" even when enabled; a CR refuses it (CEL):
    # asking for batching with batches of one is a mistake worth saying there.
    ({"enabled": True, "maxRecords": 1}, {"operator", "file", "admin"}),
    ({"enabled": True, "maxRecords": 2, "maxSizeBytes": 6, "maxDelayMillis": 0}, True),
    # The API server prunes fields a CRD does not know (kubectl apply --validate=strict reports them);
    # every other reader refuses them by name.
    ({"maxRecrods": 4}, {"crd"}),
]

SRK_ROWS: list[tuple[dict[str, Any], bool | set[str]]] = [
    ({}, True),
    ({"enabled": True}, True),
    ({"enabled": "yes"}, False),
    ({"enabled": 1}, False),
    ({"maxBlockBytes": 1}, True),
    ({"maxBlockBytes": 0}, False),
    ({"maxBlockBytes": SRK_MAX_BLOCK_BYTES}, True),
    ({"maxBlockBytes": SRK_MAX_BLOCK_BYTES + 1}, False),
    ({"maxBlockBytes": 2.5}, False),
    ({"writerInactivityMinutes": SRK_MAX_WRITER_INACTIVITY_MINUTES}, True),
    ({"writerInactivityMinutes": SRK_MAX_WRITER_INACTIVITY_MINUTES + 1}, False),
    ({"maxWritersPerTopic": 1_000_000}, True),
    ({"maxWritersPerTopic": -3}, False),
    ({"maxWritersPerTopic": True}, False),
    ({"enabled": True, "maxBlockBytes": 4096, "writerInactivityMinutes": 1, "maxWritersPerTopic": 1}, True),
    ({"maxBlockSize": 5}, {"crd"}),  # pruned by the API server, as above
]


TXN_READERS = ("crd", "file", "flags", "env")
# (the process maximum, a namespace's maximum): None leaves it out. Flags and env carry only the first.
TXN_ROWS: list[tuple[object, object, bool]] = [
    (None, None, True),
    (1, None, True),
    (0, None, False),
    (HARD_MAX_TIMEOUT_MS, None, True),
    (HARD_MAX_TIMEOUT_MS + 1, None, False),
    ("900000", None, False),
    (True, None, False),
    (1.5, None, False),
    (None, 60_000, True),
    (None, 0, False),
    (None, 900_001, False),  # above the default process maximum: a namespace may only lower it
    (HARD_MAX_TIMEOUT_MS, 900_001, True),
    (60_000, 60_001, False),
    (None, "5", False),
]


def _expected(accepted: bool | set[str], readers: tuple[str, ...]) -> dict[str, bool]:
    if isinstance(accepted, bool):
        return dict.fromkeys(readers, accepted)
    return {reader: reader in accepted for reader in readers}


def _crd_accepts(kind: str, spec: dict[str, Any]) -> bool:
    try:
        return cel_errors(kind, spec) == []
    except jsonschema.ValidationError:
        return False


def _chart_accepts(part: str, block: dict[str, Any]) -> bool | None:
    """None: the chart does not describe every key of ``block`` (it passes only those it describes)."""
    schema = CHART_EXAMPLES[part]
    if not set(block) <= set(schema.get("properties", {})):
        return None
    try:
        jsonschema.validate(block, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServePod]:
    pod = ServePod(tmp_path_factory.mktemp("agree"), "tc-0", "coordinator")
    try:
        yield pod.start()
    finally:
        pod.stop()


def _admin_accepts(pod: ServePod, block: dict[str, Any]) -> bool:
    stat_keys = BATCHED_WRITE.keys()
    stat = {(stat_keys[k].spellings["stat"] if k in stat_keys else k): v for k, v in block.items()}
    status, body = http("POST", f"{pod.admin_url()}/admin/v1/batch-log", {"coordinator": stat}, token=TOKEN)
    assert status in (200, 400), (status, body)
    if status == 400:
        assert "error" in body and len(body["error"]) < 400
    return status == 200


def _file_accepts(tmp_path: Path, doc: dict[str, Any], read: Any) -> bool:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    try:
        read(path)
    except ConfigError as exc:
        assert str(path) in str(exc)
        return False
    return True


def test_batched_write_readers_agree(coordinator: ServePod, tmp_path: Path) -> None:
    disagreements = []
    for block, accepted in BATCH_ROWS:
        got: dict[str, bool | None] = {
            "crd": all(
                _crd_accepts(kind, {"version": "2.0.0", "batchedWrite": block})
                for kind in ("transactioncoordinators.yaml", "pendingackstores.yaml")
            ),
            "chart": _chart_accepts("batchedWrite", block),
            "file": _file_accepts(tmp_path, {"batchedWrite": block}, batch_configs),
            "admin": _admin_accepts(coordinator, block),
        }
        try:
            BatchSettings.from_block(block)
            got["operator"] = True
        except InvalidBatchSettingsError:
            got["operator"] = False
        want = _expected(accepted, BATCH_READERS)
        if any(got[r] is not None and got[r] != want[r] for r in BATCH_READERS):
            disagreements.append((block, got))
    assert disagreements == []


def _flags(block: dict[str, Any]) -> list[str] | None:
    """The block as serve's flags, or None when a value has no text form (a flag is text)."""
    argv = []
    known = SINGLE_KEY.keys()
    for key, value in block.items():
        if key not in known or isinstance(value, str):
            return None
        argv += [SINGLE_KEY.setting(key).flag or "", json.dumps(value)]
    return argv


def _srk_from_flags(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> bool:
    for s in SINGLE_KEY.settings:
        monkeypatch.delenv(s.env_name or "", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    srk_config.add_arguments(parser)
    try:
        srk_config.single_key_settings(parser.parse_args(argv), None)
    except ConfigError as exc:
        text = str(exc)
        assert any(part in text for part in [*argv, *env]), text  # names the flag or the variable
        return False
    finally:
        for name in env:
            monkeypatch.delenv(name)
    return True


def test_single_key_readers_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for s in SINGLE_KEY.settings:
        monkeypatch.delenv(s.env_name or "", raising=False)
    disagreements = []
    for block, accepted in SRK_ROWS:
        got: dict[str, bool | None] = {
            "crd": _crd_accepts(
                "pendingackstores.yaml", {"version": "3.0.0", "singleKeyTransactions": block}
            ),
            "chart": _chart_accepts("singleKeyTransactions", block),
            "file": _file_accepts(
                tmp_path,
                {"singleKeyTransactions": block},
                lambda path: srk_config.single_key_settings(argparse.Namespace(), path),
            ),
            "flags": None,
            "env": None,
        }
        argv = _flags(block)
        if argv is not None:
            got["flags"] = _srk_from_flags(argv, {}, monkeypatch)
            env = {SINGLE_KEY.setting(k).env_name or "": json.dumps(v) for k, v in block.items()}
            got["env"] = _srk_from_flags([], env, monkeypatch)
        want = _expected(accepted, SRK_READERS)
        if any(got[r] is not None and got[r] != want[r] for r in SRK_READERS):
            disagreements.append((block, got))
    assert disagreements == []


def _txn_flag_reader(process: object, monkeypatch: pytest.MonkeyPatch) -> tuple[bool | None, bool | None]:
    if process is None or isinstance(process, str):
        return None, None
    text = json.dumps(process)
    results = []
    for argv, env in ((["--max-txn-timeout-ms", text], {}), ([], {"TXNKEEPER_MAX_TXN_TIMEOUT_MS": text})):
        monkeypatch.delenv("TXNKEEPER_MAX_TXN_TIMEOUT_MS", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        parser = argparse.ArgumentParser()
        txn_config.add_arguments(parser)
        try:
            txn_config.txn_timeouts(parser.parse_args(argv), None)
            results.append(True)
        except ConfigError as exc:
            assert "--max-txn-timeout-ms" in str(exc) or "TXNKEEPER_MAX_TXN_TIMEOUT_MS" in str(exc), exc
            results.append(False)
    monkeypatch.delenv("TXNKEEPER_MAX_TXN_TIMEOUT_MS", raising=False)
    return results[0], results[1]


def test_transaction_timeout_readers_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXNKEEPER_MAX_TXN_TIMEOUT_MS", raising=False)
    disagreements = []
    for process, namespace, accepted in TXN_ROWS:
        spec: dict[str, Any] = {}
        section: dict[str, Any] = {}
        if process is not None:
            spec["maxTimeoutMs"] = section["maxTimeoutMs"] = process
        if namespace is not None:
            spec["namespaces"] = [{"name": "t/ns", "maxTimeoutMs": namespace}]
            section["namespaces"] = {"t/ns": {"maxTimeoutMs": namespace}}
        got: dict[str, bool | None] = {
            "crd": _crd_accepts("transactioncoordinators.yaml", {"version": "2.0.0", "transactions": spec}),
            "file": _file_accepts(
                tmp_path,
                {TRANSACTIONS.name: section},
                lambda path: txn_config.txn_timeouts(argparse.Namespace(), path),
            ),
        }
        got["flags"], got["env"] = _txn_flag_reader(process if namespace is None else None, monkeypatch)
        want = _expected(accepted, TXN_READERS)
        if any(got[r] is not None and got[r] != want[r] for r in TXN_READERS):
            disagreements.append((process, namespace, got))
    assert disagreements == []


URL_ROWS: list[tuple[str, bool]] = [
    ("pulsar://pas-0.pas.ns.svc:6650", True),
    ("pulsar://a:1, pulsar://b:2", True),
    ("", True),  # none: the pod names itself
    ("http://h:1", False),
    ("pulsar://h", False),
    ("pulsar://h:99999", False),
    ("pulsar://u@h:1", False),
    ("pulsar://a:1,", False),
]


def test_pulsar_url_readers_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags and their env take the same URL lists, and what the operator renders is one of them."""
    names = [s.env_name or "" for s in PULSAR.settings]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    parser = argparse.ArgumentParser()
    pulsar_config.add_arguments(parser)
    parser.add_argument("--coordinators", type=int)
    disagreements = []
    for text, accepted in URL_ROWS:
        for setting in PULSAR.settings:
            for argv, env in (([setting.flag or "", text], {}), ([], {setting.env_name or "": text})):
                for name, value in env.items():
                    monkeypatch.setenv(name, value)
                try:
                    pulsar_config.placement(parser.parse_args(argv), None)
                    got = True
                except ConfigError as exc:
                    assert (setting.flag or "") in str(exc) or (setting.env_name or "") in str(exc), exc
                    got = False
                for name in env:
                    monkeypatch.delenv(name)
                if got != accepted:
                    disagreements.append((text, argv, env, got))
    assert disagreements == []
    rendered = builders.pulsar_urls(Resource.from_body(_store_body()))
    assert rendered.count("pulsar://") == 3
    for setting in PULSAR.settings:
        assert setting.check(rendered, setting.flag or "") == rendered


def _store_body() -> dict[str, Any]:
    return {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "PendingAckStore",
        "metadata": {"name": "pas", "namespace": "ns", "uid": "u"},
        "spec": {"version": "2.0.0", "replicas": 3},
    }


# (config-file key, value, accepted): the TLS section's values on their own (the rules between them and
# the files are tls_settings' and tested with real certificates in tests/runtime/test_tls.py).
TLS_ROWS: list[tuple[str, object, bool]] = [
    ("listeners", ["client"], True),
    ("listeners", ["client", "admin", "peers"], True),
    ("listeners", ["client", "gossip"], False),
    ("listeners", [], False),
    ("clientAuth.client", "require", True),
    ("clientAuth.admin", "request", True),
    ("clientAuth.client", "always", False),
    ("reloadIntervalSeconds", 0.05, True),
    ("reloadIntervalSeconds", 3600, True),
    ("reloadIntervalSeconds", 0, False),
    ("reloadIntervalSeconds", 3601, False),
    ("certFile", "/etc/txnkeeper/tls/tls.crt", True),
]


def _tls_reader(
    argv: list[str], env: dict[str, str], path: Path | None, monkeypatch: pytest.MonkeyPatch
) -> bool:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    tls_settings.add_arguments(parser)
    try:
        tls_settings.load(parser.parse_args(argv), path)
        return True
    except ConfigError:
        return False
    finally:
        for name in env:
            monkeypatch.delenv(name)


def test_tls_value_readers_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for s in TLS.settings:
        monkeypatch.delenv(s.env_name or "", raising=False)
    disagreements = []
    for key, value, accepted in TLS_ROWS:
        setting = TLS.setting(key)
        top, _, child = key.partition(".")
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"tls": {top: {child: value} if child else value}}))
        text = ",".join(value) if isinstance(value, list) else str(value)
        got = {
            "file": _tls_reader([], {}, path, monkeypatch),
            "flags": _tls_reader([setting.flag or "", text], {}, None, monkeypatch),
            "env": _tls_reader([], {setting.env_name or "": text}, None, monkeypatch),
        }
        if value == []:  # an empty flag or env variable is "not given"
            got.pop("flags"), got.pop("env")
        if any(v != accepted for v in got.values()):
            disagreements.append((key, value, got))
    assert disagreements == []


def test_the_charts_keys_are_the_declarations() -> None:
    """What the chart's values.schema.json says of a pod setting is what the declaration says."""
    for section in (BATCHED_WRITE, SINGLE_KEY):
        described = CHART_EXAMPLES[section.name].get("properties", {})
        assert described, section.name
        generated = {k: {"type": v["type"]} for k, v in section_schema(section).items() if k in described}
        assert {k: {"type": v["type"]} for k, v in described.items()} == generated


def section_schema(section: Any) -> dict[str, Any]:
    from txnkeeper.contract.settings.schema import json_schema

    properties: dict[str, Any] = json_schema(section)["properties"]
    return properties


OFFLOAD_READERS = ("crd", "file", "admin")
WEEK = MAX_SEGMENT_ROLLOVER_SECONDS
# The CR's numeric spec.offload fields (their CR spelling): the operator renders them under Pulsar's keys
# into the pod's config file, and `offload-policies set` takes the same keys for one topic.
OFFLOAD_ROWS: list[tuple[dict[str, Any], bool | set[str]]] = [
    ({"thresholdBytes": -1}, True),
    ({"thresholdBytes": 0}, True),
    ({"thresholdBytes": -2}, False),
    ({"thresholdBytes": 1.5}, False),
    ({"thresholdBytes": True}, False),
    # Pods take plain decimal strings, as Pulsar's properties files write numbers; a CR takes numbers.
    ({"thresholdBytes": "5"}, {"file", "admin"}),
    ({"thresholdBytes": " 5"}, False),
    ({"deletionLagMs": 0}, True),
    ({"deletionLagMs": -1}, False),
    ({"maxSegmentSizeBytes": 1}, True),
    ({"maxSegmentSizeBytes": 0}, False),
    ({"maxSegmentRolloverSeconds": 1}, True),
    ({"maxSegmentRolloverSeconds": 0}, False),
    ({"maxSegmentRolloverSeconds": WEEK}, True),
    ({"maxSegmentRolloverSeconds": WEEK + 1}, False),
    # Pods take fractions of a second; a CR whole seconds.
    ({"maxSegmentRolloverSeconds": 1.5}, {"file", "admin"}),
    ({"minSegmentRolloverSeconds": 0}, True),
    ({"minSegmentRolloverSeconds": WEEK + 1}, False),
    ({"maxBlockSizeBytes": 140}, True),
    ({"maxBlockSizeBytes": 139}, False),
    ({"maxBlockSizeBytes": MAX_MAX_BLOCK_SIZE_BYTES}, True),
    ({"maxBlockSizeBytes": MAX_MAX_BLOCK_SIZE_BYTES + 1}, False),
    ({"thresholdBytes": 0, "deletionLagMs": 1, "maxSegmentSizeBytes": 4096, "maxBlockSizeBytes": 4096}, True),
]
OFFLOAD_TOPIC = "persistent://public/default/agree"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServePod]:
    work = tmp_path_factory.mktemp("agree-store")
    (work / "tier").mkdir()
    pod_offload = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(work / "tier")}
    pod = ServePod(work, "pas-0", "store", release="3.0.0", config={"offload": pod_offload})
    try:
        pod.start()
        asyncio.run(_hold_topic(pod))
        yield pod
    finally:
        pod.stop()


async def _hold_topic(pod: ServePod) -> None:
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        await (await client.create_producer(OFFLOAD_TOPIC)).send(b"held")


def _offload_admin_accepts(pod: ServePod, section: dict[str, Any]) -> bool:
    """`offload-policies set` of the topic; an accepted override is removed again (rows stay apart)."""
    query = urllib.parse.urlencode({"topic": OFFLOAD_TOPIC})
    url = f"{pod.admin_url()}/admin/v1/topics/offload-policies?{query}"
    status, body = http("POST", url, section, TOKEN)
    assert status in (200, 400), (status, body)
    if status == 400:
        assert "error" in body and len(body["error"]) < 400
        return False
    status, body = http("DELETE", url, None, TOKEN)
    assert status == 200, (status, body)
    return True


def _offload_file_accepts(tmp_path: Path, section: dict[str, Any]) -> bool:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"offload": section}))
    try:
        offload_settings.load(path)
    except offload_settings.OffloadSettingsError as exc:
        assert str(path) in str(exc)
        return False
    return True


def test_offload_readers_agree(store: ServePod, tmp_path: Path) -> None:
    disagreements = []
    for block, accepted in OFFLOAD_ROWS:
        spec = {"driver": "filesystem", "filesystem": {"claimName": "tier"}, **block}
        # The operator's rendering of the CR (it passes the values as the CR holds them).
        section = offload_config(spec)
        numbers = {
            k: v for k, v in section.items() if k not in ("managedLedgerOffloadDriver", "fileSystemURI")
        }
        got = {
            "crd": _crd_accepts("pendingackstores.yaml", {"version": "3.0.0", "offload": spec}),
            "file": _offload_file_accepts(tmp_path, section),
            "admin": _offload_admin_accepts(store, numbers),
        }
        want = _expected(accepted, OFFLOAD_READERS)
        if got != want:
            disagreements.append((block, got))
    assert disagreements == []


TOPIC_POLICY_READERS = ("crd", "operator", "file")
INT_MAX = 2**31 - 1
# spec.topicPolicies (its CR fields: contract/settings/topic_policies.py's "cr" spelling). "file" is the
# pod reading what the operator renders of the fields (Pulsar's keys, one block per admin verb).
TOPIC_POLICY_ROWS: list[tuple[dict[str, Any], bool | set[str]]] = [
    ({}, True),
    ({"retentionMinutes": -1, "retentionSizeMB": -1}, True),
    ({"retentionMinutes": 0, "retentionSizeMB": 0}, True),
    ({"retentionMinutes": -2, "retentionSizeMB": 0}, False),
    ({"retentionMinutes": INT_MAX, "retentionSizeMB": (2**63 - 1) // MIB}, True),
    ({"retentionMinutes": INT_MAX + 1, "retentionSizeMB": 0}, False),
    ({"retentionMinutes": 0, "retentionSizeMB": (2**63 - 1) // MIB + 1}, False),
    # The CRD's CEL wants both retention limits or neither (one left out would be 0, which keeps nothing);
    # a pod takes one, the other at Pulsar's default.
    ({"retentionMinutes": 5}, {"operator", "file"}),
    ({"messageTTLSeconds": 0}, True),
    ({"messageTTLSeconds": -1}, False),
    ({"messageTTLSeconds": INT_MAX}, True),
    ({"messageTTLSeconds": INT_MAX + 1}, False),
    ({"messageTTLSeconds": 1.5}, False),
    ({"messageTTLSeconds": True}, False),
    ({"backlogQuotaLimitBytes": -1}, True),
    ({"backlogQuotaLimitBytes": 2**63 - 1}, True),
    ({"backlogQuotaLimitBytes": -2}, False),
    # Pods take plain decimal strings, as Pulsar's properties files write numbers; a CR takes numbers.
    ({"backlogQuotaLimitBytes": "5"}, {"file"}),
    ({"backlogQuotaLimitSeconds": INT_MAX}, True),
    ({"backlogQuotaPolicy": "consumer_backlog_eviction"}, True),
    ({"backlogQuotaPolicy": "drop"}, False),
    ({"backlogQuotaPolicy": 1}, False),
    ({"checkIntervalSeconds": 1}, True),
    ({"checkIntervalSeconds": 3600}, True),
    ({"checkIntervalSeconds": 0}, False),
    ({"checkIntervalSeconds": 3601}, False),
]


def _read_topic_policies(path: Path) -> None:
    try:
        topic_policies.load(path)
    except topic_policies.TopicPolicySettingsError as exc:  # as serve reports it
        raise ConfigError(str(exc)) from exc


def test_topic_policy_readers_agree(tmp_path: Path) -> None:
    disagreements = []
    for block, accepted in TOPIC_POLICY_ROWS:
        got: dict[str, bool | None] = {
            "crd": _crd_accepts("pendingackstores.yaml", {"version": "2.0.0", "topicPolicies": block}),
            "operator": topic_policy_problems(block) == [],
            "file": _file_accepts(
                tmp_path,
                {TOPIC_POLICIES.name: topic_policies_config(block)},
                _read_topic_policies,
            ),
        }
        want = _expected(accepted, TOPIC_POLICY_READERS)
        if any(got[r] != want[r] for r in TOPIC_POLICY_READERS):
            disagreements.append((block, got))
    assert disagreements == []
    # Every CR field is one declared key, and the CRD's fragment of it is the declaration's.
    crd = yaml.safe_load((ROOT / "crds/pendingackstores.yaml").read_text())
    fields = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "topicPolicies"
    ]["properties"]
    assert fields == {cr: property_schema(s) for cr, s in TOPIC_POLICIES.keys("cr").items()}


def test_every_variable_the_operator_sets_on_runtime_pods_is_declared() -> None:
    """The operator configures pods through TXNKEEPER_* env: each must be a declared setting's, or the pod
    would silently ignore it."""
    declared = {s.env_name for section in SECTIONS for s in section.settings if s.env_name}
    spec: dict[str, Any] = {
        "version": "3.0.0",
        "replicas": 2,
        "tls": {"enabled": True},
        "connectionLimits": {"maxConnections": 10, "idleTimeoutSeconds": 5.5},
        "memory": {"tailCacheBytes": 0},
    }
    seen: set[str] = set()
    for kind in ("TransactionCoordinator", "PendingAckStore"):
        body = {"kind": kind, "metadata": {"name": "x", "namespace": "n", "uid": "u"}, "spec": spec}
        sts = builders.statefulset(
            Resource.from_body(body), Template("3.0.0", BatchSettings()), OperatorSettings()
        )
        for container in sts["spec"]["template"]["spec"]["containers"]:
            seen |= {e["name"] for e in container.get("env", []) if e["name"].startswith("TXNKEEPER_")}
    assert {"TXNKEEPER_MAX_CONNECTIONS", "TXNKEEPER_TAIL_CACHE_BYTES", "TXNKEEPER_TLS_CERT_FILE"} <= seen
    assert seen - declared == set()
