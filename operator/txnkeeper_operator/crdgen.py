"""Generate the two CustomResourceDefinitions (crds/ and the chart's copy) from one description.

Both kinds share most of their schema (version, batchedWrite, storage, status arrays); writing them
by hand twice invites drift, so the YAML under crds/ is produced here and a test fails when the committed
files differ from what this module generates. Every field carries a description for `kubectl explain`;
CEL rules reject what the operator could never make safe, with a message that says what to fix.

    python -m txnkeeper_operator.crdgen crds helm/txnkeeper/crds
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from txnkeeper.contract import batching as limits
from txnkeeper.contract import connections, memory
from txnkeeper.contract import coordinator_settings as txn
from txnkeeper.contract.formats import Feature, known_majors, majors_with
from txnkeeper.contract.names import GROUP, MAX_TOPIC_NAME, PENDING_ACK_SUFFIX
from txnkeeper.contract.placement import DEFAULT_PRECOPY_MIB_PER_S
from txnkeeper.contract.settings import offload as offload_settings
from txnkeeper.contract.settings import schema as settings
from txnkeeper.contract.settings.single_key import SINGLE_KEY
from txnkeeper.contract.settings.topic_policies import TOPIC_POLICIES
from txnkeeper.contract.settings.transactions import ENTRY_MAX_TIMEOUT, MAX_TIMEOUT
from txnkeeper_operator import crd_tls
from txnkeeper_operator.engine import windows

VERSION = "v1"

Schema = dict[str, Any]


def _p(type_: str, description: str, **extra: Any) -> Schema:
    return {"type": type_, "description": description, **extra}


def _obj(description: str, properties: dict[str, Schema], **extra: Any) -> Schema:
    return {"type": "object", "description": description, "properties": properties, **extra}


def _arr(description: str, items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "description": description, "items": items, **extra}


def _rule(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


_SEMVER = r"^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$"
# The pattern controller-gen emits for resource.Quantity.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_QUANTITY = rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"


# Kubernetes cron syntax (robfig/cron's standard parser): five fields or a predefined @schedule. Time
# zones go in a CronJob's own timeZone field, never in the schedule ("TZ=..." is refused there too).
_CRON_FIELD = r"[0-9A-Za-z*?/,-]+"
_CRON = rf"^(|@(yearly|annually|monthly|weekly|daily|midnight|hourly)|({_CRON_FIELD} +){{4}}{_CRON_FIELD})$"
# Spark master URLs the verifier job can use: Spark inside its own pod, a standalone cluster (one or
# more host:port), or Kubernetes itself.
_SPARK_MASTER = (
    r"^(local(\[([1-9][0-9]*|\*)(, *[0-9]+)?\])?"
    r"|spark://[A-Za-z0-9.-]+:[0-9]{1,5}(,[A-Za-z0-9.-]+:[0-9]{1,5})*"
    r"|k8s://(https?://)?[A-Za-z0-9.-]+(:[0-9]{1,5})?)$"
)
# A DNS-1123 subdomain (what a StorageClass name must be); empty means the cluster's default class.
_DNS1123_SUBDOMAIN = r"^(|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$"
# A quantity value in CEL: an int-or-string field is an int or a string, and quantity() takes a string.
_Q = "quantity(string({}))"


def _quantity(description: str) -> Schema:
    return {
        "description": description,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "pattern": _QUANTITY,
    }


def _batched_write(what: str) -> Schema:
    # Fields, types, bounds and defaults are the declaration's (contract/settings/batched_write.py).
    section = settings.json_schema(
        limits.BATCHED_WRITE,
        description=f"PIP-160 batched writes for the {what}. Turning it on or off, or changing a limit, "
        "is applied to running pods one at a time through their admin API, without restarts.",
    )
    return section | {
        # A complete default: the API server checks a default against the CEL rules as it is written,
        # without filling in the nested defaults first.
        "default": settings.cr_default(limits.BATCHED_WRITE),
        "x-kubernetes-validations": [
            _rule(
                f"!self.enabled || self.maxRecords >= {limits.MIN_MAX_RECORDS_WHEN_ENABLED}",
                "batchedWrite.maxRecords must be at least 2 when batchedWrite.enabled is true "
                "(a batch of one record is an unbatched write)",
            )
        ],
    }


def _release_rule(section: str, feature: Feature, used: str | None = None) -> dict[str, Any]:
    """spec.<section> (when ``used``, a CEL condition on it) only on release lines with ``feature``."""
    lines = majors_with(feature)
    when = f" || !({used})" if used else ""
    return _rule(
        f"!has(self.{section}){when} || self.version.matches('^("
        + "|".join(str(m) for m in lines)
        + r")\\.')",
        f"spec.{section} needs the {feature.value!r} feature, which only release lines "
        + ", ".join(f"{m}.x" for m in lines)
        + f" have; set spec.version to one of them or remove spec.{section}",
    )


def _offload() -> Schema:
    return _obj(
        "PIP-76 offload of topic ledgers to tiered storage (release 3.x). Closed ledgers (and segments of "
        "the open one) are uploaded in Pulsar's block format; local files are deleted after deletionLagMs "
        "while thresholdBytes of newer data stay local. Rendered into the pods' config file with Pulsar's "
        "key names (managedLedgerOffload*). Before a downgrade to 2.x, set enabled: false and keep the "
        "rest: the operator then has every store pod restore its tier-only ledgers locally (and rewrite "
        "its metadata as version 1) before any pod runs 2.x.",
        {
            "enabled": _p(
                "boolean",
                "Offload automatically. false keeps the location (offloaded data stays readable and can "
                "be restored) but uploads nothing new; a downgrade to 2.x needs false.",
                default=True,
            ),
            "driver": _p(
                "string",
                "filesystem (an RWX volume shared by the store pods, see filesystem), aws-s3 or S3 (any "
                "S3-compatible endpoint).",
                enum=list(offload_settings.OFFLOAD_DRIVERS),
            ),
            "bucket": _p("string", "S3 bucket (required for aws-s3/S3).", minLength=3, maxLength=63),
            "region": _p("string", "S3 region, e.g. eu-west-1.", maxLength=64),
            "endpoint": _p(
                "string",
                "S3 service endpoint URL (MinIO, Ceph RGW, ...); empty: AWS's for the region.",
                maxLength=512,
                pattern=r"^(|https?://\S+)$",
            ),
            "credentialsSecret": _obj(
                "Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, passed to the store pods as "
                "environment variables; without it the pods use the default AWS credential chain.",
                {"name": _p("string", "Secret name (same namespace).", minLength=1, maxLength=253)},
                required=["name"],
            ),
            "filesystem": _obj(
                "The filesystem driver's volume, mounted at "
                + offload_settings.OFFLOAD_MOUNT_DIR
                + " in every store pod; it must be ReadWriteMany so every pod (and the verify-offload "
                "job) sees the same objects.",
                {
                    "claimName": _p(
                        "string",
                        "An existing ReadWriteMany PersistentVolumeClaim.",
                        minLength=1,
                        maxLength=253,
                    ),
                },
            ),
            # The numeric fields are the pod's offload settings (contract/settings/offload.py).
            **offload_settings.cr_properties(),
            "verifySchedule": _p(
                "string",
                "Cron schedule (five fields, e.g. '0 3 * * *', or @daily/...) of the verify-offload "
                "CronJob ({name}-verify-offload), a Spark job that audits the tier against the pods' "
                "metadata (objects present, index lengths, sampled block CRCs, orphans); the result is "
                "status.offloadAudit and the OffloadAudit condition. Empty: the CronJob is suspended "
                "(run it with kubectl create job --from=cronjob/{name}-verify-offload).",
                maxLength=100,
                pattern=_CRON,
            ),
        },
        required=["driver"],
        **{
            "x-kubernetes-validations": [
                _rule(
                    "!(self.driver in ["
                    + ", ".join(f"'{d}'" for d in offload_settings.S3_DRIVERS)
                    + "]) || has(self.bucket)",
                    "offload.bucket is required for the aws-s3 and S3 drivers",
                ),
                _rule(
                    "self.driver != 'filesystem' || (has(self.filesystem) && has(self.filesystem.claimName))",
                    "offload.filesystem.claimName (a ReadWriteMany PersistentVolumeClaim) is required "
                    "for the filesystem driver",
                ),
                _rule(
                    "self.minSegmentRolloverSeconds <= self.maxSegmentRolloverSeconds",
                    "offload.minSegmentRolloverSeconds must not exceed offload.maxSegmentRolloverSeconds",
                ),
            ]
        },
    )


def _single_key_transactions() -> Schema:
    return settings.json_schema(SINGLE_KEY)  # contract/settings/single_key.py


def _topic_policies() -> Schema:
    # contract/settings/topic_policies.py: each CR field is one declared key (its "cr" spelling).
    props = {cr: settings.property_schema(s) for cr, s in TOPIC_POLICIES.keys("cr").items()}
    return _obj(
        "Pulsar's retention, message TTL and backlog quota as the defaults of every topic of these pods (a "
        "topic's own settings, `txnkeeper admin topics retention|message-ttl|backlog-quota set`, override "
        "them key by key; a key neither sets has Pulsar's default). Rendered into the pods' config file "
        "(section topicPolicies, Pulsar's key names); pods read it at start, so a change reaches a pod "
        "when it restarts. Without retentionMinutes and retentionSizeMB a topic keeps its data while any "
        "subscription may still read it, and a topic without subscriptions keeps everything; with them "
        "(0 and 0 is Pulsar's default) topics are trimmed by Pulsar's retention rule, unsubscribed ones "
        "too: a consumed ledger goes once it is past either limit. Any release.",
        props,
        **{
            "x-kubernetes-validations": [
                _rule(
                    "has(self.retentionMinutes) == has(self.retentionSizeMB)",
                    "set both topicPolicies.retentionMinutes and topicPolicies.retentionSizeMB (-1: no "
                    "limit): a consumed ledger goes once it is past either, and a limit left out would be "
                    "0, which keeps nothing",
                )
            ]
        },
    )


def _transactions() -> Schema:
    list_map = {
        "maxItems": txn.MAX_LIMITED_NAMES,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }

    def entry(what: str, name: Schema) -> Schema:
        return _obj(
            f"One {what}'s maximum.",
            {
                "name": name,
                "maxTimeoutMs": settings.property_schema(
                    ENTRY_MAX_TIMEOUT,
                    f"Longest timeout of a transaction that registers a topic of this {what} (ms); at most "
                    "maxTimeoutMs.",
                ),
            },
            required=["name", "maxTimeoutMs"],
        )

    def at_most_process(kind: str) -> dict[str, Any]:
        return _rule(
            f"!has(self.{kind}) || self.{kind}.all(e, e.maxTimeoutMs <= (has(self.maxTimeoutMs) ? "
            f"self.maxTimeoutMs : {txn.DEFAULT_MAX_TIMEOUT_MS}))",
            f"transactions.{kind}[].maxTimeoutMs must not exceed transactions.maxTimeoutMs (default "
            f"{txn.DEFAULT_MAX_TIMEOUT_MS}): a {kind[:-1]} may only lower the coordinator's maximum",
        )

    return _obj(
        "The longest transaction timeout the coordinators grant (a transaction holds back every later "
        "message of its topics until it ends, at the latest at its timeout): a begin asking for more, or "
        "a registration of a topic whose namespace or topic maximum is lower than the transaction's "
        "timeout, is refused with BAD_REQUEST naming the limit. Rendered into the pods' config file "
        "(section transactions); pods read it at start, so a change reaches a pod when it restarts. Any "
        "release.",
        {
            "maxTimeoutMs": settings.property_schema(MAX_TIMEOUT),  # contract/settings/transactions.py
            "namespaces": _arr(
                "Lower maximums for the topics of a namespace (a topic's own entry wins).",
                entry(
                    "namespace",
                    _p(
                        "string",
                        "TENANT/NAMESPACE, e.g. public/default.",
                        pattern=txn.NAMESPACE_PATTERN,
                        maxLength=txn.MAX_NAMESPACE_NAME,
                    ),
                ),
                **list_map,
            ),
            "topics": _arr(
                "Lower maximums for single topics.",
                entry(
                    "topic",
                    _p(
                        "string",
                        "Topic name as clients use it, e.g. persistent://public/default/orders.",
                        minLength=1,
                        maxLength=MAX_TOPIC_NAME,
                        pattern=r"^[^\x00-\x1f]+$",
                    ),
                ),
                **list_map,
                **{
                    "x-kubernetes-validations": [
                        _rule(
                            f"self.all(t, !t.name.endsWith('{PENDING_ACK_SUFFIX}'))",
                            f"transactions.topics[].name may not end with {PENDING_ACK_SUFFIX} (the "
                            "stores' pending-ack logs are named so)",
                        )
                    ]
                },
            ),
        },
        **{"x-kubernetes-validations": [at_most_process("namespaces"), at_most_process("topics")]},
    )


def _numbers(table: dict[str, connections.ConnectionLimit]) -> dict[str, Schema]:
    """A section of numbers rendered as the pods' environment: types, floors, ceilings, defaults said."""
    props: dict[str, Schema] = {}
    for field, limit in table.items():
        bounds: dict[str, Any] = {"minimum": limit.minimum}
        if limit.maximum is not None:
            bounds["maximum"] = limit.maximum
        props[field] = _p(
            "integer" if limit.kind is int else "number",
            f"{limit.description} Default {limit.default_text}.",
            **bounds,
        )
    return props


def _memory() -> Schema:
    return _obj(
        "Memory a store pod spends on its own choice (issue 25: bounded memory whatever clients do), "
        "passed as the pods' TXNKEEPER_* environment (txnkeeper serve's --tail-cache-bytes); a field "
        "left out keeps the runtime's default. Pods read them at start, so a change reaches a pod when "
        "it restarts.",
        _numbers(memory.MEMORY_SETTINGS),
    )


def _connection_limits() -> Schema:
    props = _numbers(connections.CONNECTION_LIMITS)
    return _obj(
        "Limits of the client protocol server of each pod (issue 25: bounded memory under any client), "
        "passed as the pods' TXNKEEPER_* environment (txnkeeper serve's --max-connections and so on); a "
        "field left out keeps the runtime's default. Pods read them at start, so a change reaches a pod "
        "when it restarts.",
        props,
    )


def _client_authentication() -> Schema:
    return _obj(
        "Client authentication of the store pods (Pulsar's token authentication shape): with it, every "
        "store pod checks the HS256 JWTs clients present (ClientAuth; txnkeeper.client's auth_token) "
        "against the key in this Secret, and single-key writer ids and producer names belong to the "
        "token's principal, so no other credential can take them over; SetupAppend then needs a token. "
        "Create a key with `head -c 32 /dev/urandom | base64 > key && kubectl create secret generic NAME "
        "--from-file=key=key` and tokens with `txnkeeper client-token create --key-file key --principal "
        "P`. The key must hold at least 32 bytes (a pod refuses a shorter one at start and says so in "
        "its log). Pods read it at start: a change reaches a pod when it restarts.",
        {
            "tokenKeySecret": _obj(
                "The Secret holding the key (same namespace).",
                {
                    "name": _p("string", "Secret name.", minLength=1, maxLength=253),
                    "key": _p(
                        "string",
                        "The Secret's key holding the token key.",
                        default="key",
                        minLength=1,
                        maxLength=253,
                        pattern=r"^[-._a-zA-Z0-9]+$",
                    ),
                },
                required=["name"],
            )
        },
        required=["tokenKeySecret"],
    )


def _storage() -> Schema:
    return _obj(
        "The persistent volume each pod keeps its ledgers on. Immutable: a StatefulSet cannot change its "
        "volume claim templates. PVCs are retained when the resource is deleted (delete them yourself to "
        "drop the data); a scale-in deletes the removed pods' PVCs, only once their data moved to the "
        "pods that stay.",
        {
            "size": _quantity("Requested size of each pod's volume, e.g. 10Gi.")
            | {
                "default": "1Gi",
                "x-kubernetes-validations": [
                    _rule(
                        _Q.format("self") + ".isGreaterThan(quantity('0'))",
                        "storage.size must be greater than zero, e.g. 10Gi",
                    )
                ],
            },
            "storageClassName": _p(
                "string",
                "Storage class of the volumes (a DNS-1123 subdomain, e.g. fast-ssd); empty uses the cluster "
                "default.",
                maxLength=253,
                pattern=_DNS1123_SUBDOMAIN,
            ),
        },
        default={"size": "1Gi"},
        **{
            "x-kubernetes-validations": [
                _rule(
                    "self == oldSelf",
                    "storage is immutable; create a new resource to change size or class",
                )
            ]
        },
    )


def _resources() -> Schema:
    # maxProperties bounds the API server's cost estimate of the rules that iterate the maps.
    quantities = {
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": _quantity("A resource quantity.") | {"maxLength": 64},
    }

    def non_negative(which: str) -> list[dict[str, Any]]:
        return [
            _rule(
                "self.all(k, !" + _Q.format("self[k]") + ".isLessThan(quantity('0')))",
                f"resources.{which} must not be negative (e.g. cpu: 100m, memory: 256Mi)",
            )
        ]

    return _obj(
        "CPU and memory requests and limits of the runtime container.",
        {
            "requests": quantities
            | {
                "description": "Minimum resources, e.g. {cpu: 100m, memory: 256Mi}.",
                "x-kubernetes-validations": non_negative("requests"),
            },
            "limits": quantities
            | {
                "description": "Maximum resources the container may use.",
                "x-kubernetes-validations": non_negative("limits"),
            },
        },
        **{
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits)"
                    " || " + _Q.format("self.requests[k]") + ".compareTo(" + _Q.format("self.limits[k]") + ")"
                    " <= 0)",
                    "resources.requests must not exceed resources.limits for the same resource (the "
                    "kubelet would refuse the pod)",
                )
            ]
        },
    )


def _verifier() -> Schema:
    return _obj(
        "The Spark job that proves a downgrade safe. The operator runs it on demand during a downgrade "
        "and, if a schedule is set, periodically as a CronJob.",
        {
            "schedule": _p(
                "string",
                "Cron schedule of the periodic verification CronJob (five fields, e.g. '*/30 * * * *', or "
                "@hourly/@daily/...); empty: only on demand.",
                default="",
                maxLength=100,
                pattern=_CRON,
            ),
            "sparkMaster": _p(
                "string",
                "Spark master URL the job runs against: local[*] (or local[N]) runs Spark inside the job's "
                "pod; spark://host:port a standalone cluster; k8s://https://host:port Kubernetes.",
                default="local[*]",
                maxLength=253,
                pattern=_SPARK_MASTER,
            ),
            "retrySeconds": _p(
                "integer",
                "While the verifier reports live batched data, run it again after this many seconds.",
                default=30,
                minimum=5,
                maximum=86400,
            ),
        },
        default={"schedule": "", "sparkMaster": "local[*]", "retrySeconds": 30},
    )


def _spec(kind: str) -> Schema:
    coordinator = kind == "TransactionCoordinator"
    props: dict[str, Schema] = {
        "replicas": _p(
            "integer",
            "Number of pods (kubectl scale works). Each pod owns its own persistent volume; what it serves "
            "(shards of topics, coordinator ids) is recorded in the ConfigMap {name}-placement and moved "
            "online: on scale-out the new pods receive work once Ready, on scale-in the work moves off "
            "the pods being removed first and the StatefulSet shrinks only when they hold nothing "
            "(docs/contracts.md §12).",
            default=3,
            minimum=1,
            maximum=64,
        ),
        "version": _p(
            "string",
            "Release every pod should run (1.x: unbatched format only; 2.x: can read and write batched "
            "entries; 3.x: also offload and single-key transactions). Changing it rolls the pods one at "
            "a time, highest ordinal first; a downgrade to 1.x waits until the verifier proves no live "
            "batched entry remains; a downgrade from 3.x to 2.x needs spec.offload removed first.",
            pattern=_SEMVER,
            maxLength=64,
        ),
        "image": _p(
            "string",
            "Container image of the runtime; leave it out to use the operator's default (TXNKEEPER_IMAGE).",
            minLength=1,
            maxLength=512,
            pattern=r"^\S+$",
        ),
        "batchedWrite": _batched_write(
            "transaction log of every coordinator" if coordinator else "pending-ack log of every subscription"
        ),
        "storage": _storage(),
        "resources": _resources(),
        "verifier": _verifier(),
        "connectionLimits": _connection_limits(),
        "maintenanceWindows": _arr(
            "When rollouts may restart healthy pods: cron expressions in UTC (minute hour day-of-month "
            "month day-of-week; the time is inside a window during every minute one matches), e.g. "
            f"'{windows.EXAMPLE}'. A planned restart waits for the next window (status says when); steps "
            "that restart nothing (templates, batch-log switches, rollovers, the verifier) and the restart "
            "of a pod that is down do not wait. Empty: restarts whenever a rollout needs them.",
            _p("string", "One window (cron, UTC).", minLength=1, maxLength=windows.MAX_EXPRESSION_LENGTH),
            maxItems=windows.MAX_WINDOWS,
            **{
                "x-kubernetes-validations": [
                    _rule(
                        f"self.all(w, w.matches('{windows.crd_pattern()}'))",
                        "spec.maintenanceWindows: each entry is a cron expression in UTC with five fields "
                        "(minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 0-7 "
                        f"or SUN-SAT; *, N, N-M, /STEP, lists with ','), e.g. '{windows.EXAMPLE}'",
                    )
                ]
            },
        ),
        "maxUnavailable": _p(
            "integer",
            "PodDisruptionBudget: how many pods voluntary disruptions (drains) may take down at once, "
            "from 1 (0 would block every node drain); more than spec.replicas counts as spec.replicas "
            "(so that kubectl scale is never refused for it).",
            default=1,
            minimum=1,
        ),
    }
    props["tls"] = crd_tls.spec_schema()
    peer_key, peer_kind = (
        ("pendingAckStore", "PendingAckStore")
        if coordinator
        else ("transactionCoordinator", "TransactionCoordinator")
    )
    props["scaling"] = _obj(
        "How the operator moves work between pods when spec.replicas changes or a rebalance is "
        "requested (annotation txnkeeper.io/rebalance=now).",
        {
            "maxConcurrentMoves": _p(
                "integer",
                "Shards (coordinator ids) moved at the same time. Each move fences its unit for a moment "
                "on the old pod; more at once finishes sooner but pauses more clients together.",
                default=1,
                minimum=1,
                maximum=16,
            ),
            "precopyMiBPerSecond": _p(
                "integer",
                "Store shards: how fast the new pod copies the shard's closed ledgers while the old one "
                "still serves (the pre-copy before the fence), in MiB/s; 0: as fast as the pods go. "
                "The bound keeps the clients' throughput during a move where both pods share a disk or "
                "a link (docs/performance.md); raise it where pods have their own disks.",
                default=DEFAULT_PRECOPY_MIB_PER_S,
                minimum=0,
                maximum=10240,
            ),
        },
        default={"maxConcurrentMoves": 1, "precopyMiBPerSecond": DEFAULT_PRECOPY_MIB_PER_S},
    )
    props["pulsar"] = _obj(
        "Pulsar's binary protocol (served on port 6650 beside txnkeeper's own).",
        {
            peer_key: _p(
                "string",
                f"The {peer_kind} (same namespace) that serves Pulsar clients together with this one: its "
                "pods' addresses are given to this resource's pods, so a Pulsar client reaching either finds "
                "topics and transaction coordinators alike (Pulsar transactions need both). Name each other "
                "from both resources. Pods start once it exists; pods already running learn a changed "
                "reference at their next restart.",
                minLength=1,
                maxLength=63,
                pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            ),
        },
    )
    required = ["version"]
    rules = [
        _rule(
            "self.version.matches('^(" + "|".join(str(m) for m in known_majors()) + r")\\.')",
            "spec.version must be a known release line (" + ", ".join(f"{m}.x" for m in known_majors()) + ")",
        ),
        _rule(
            "!self.batchedWrite.enabled || !self.version.startsWith('1.')",
            "batchedWrite.enabled needs version 2.x: 1.x releases cannot read batched entries; set "
            "batchedWrite.enabled to false or upgrade spec.version",
        ),
    ]
    if not coordinator:
        props["offload"] = _offload()
        props["clientAuthentication"] = _client_authentication()
        props["singleKeyTransactions"] = _single_key_transactions()
        props["topicPolicies"] = _topic_policies()
        props[memory.MEMORY_SECTION] = _memory()
        rules.append(_release_rule("offload", Feature.OFFLOAD_SEGMENTS, "self.offload.enabled"))
        rules.append(
            _release_rule(
                "singleKeyTransactions", Feature.SINGLE_KEY_TRANSACTIONS, "self.singleKeyTransactions.enabled"
            )
        )
        props["shards"] = _p(
            "integer",
            "How many shards the topics hash into (crc32(topic) mod shards); each shard is owned by one "
            "pod and moves as a whole. Fixed for the resource's life; at creation a multiple of "
            "spec.replicas (so every existing topic stays on its pod). Default: 16 x spec.replicas at "
            "creation (status.placement.shards shows the count in force).",
            minimum=1,
            maximum=4096,
            **{
                "x-kubernetes-validations": [
                    _rule("self == oldSelf", "spec.shards is immutable: every topic's shard depends on it")
                ]
            },
        )
        rules.append(
            _rule(
                "has(self.shards) == has(oldSelf.shards)",
                "spec.shards cannot be added or removed after creation: the shard count was fixed when the "
                "resource was created (see status.placement.shards)",
            )
        )
    if coordinator:
        props["transactions"] = _transactions()
        props["coordinators"] = _p(
            "integer",
            "Number of transaction coordinators (TxnID most-significant bits 0..N-1); each coordinator id "
            "is owned by one pod (first c mod replicas) and moves with its transaction log when "
            "spec.replicas changes. A pod that owns none only waits.",
            default=16,
            minimum=1,
            maximum=4096,
        )
        props["coordinators"]["x-kubernetes-validations"] = [
            _rule("self == oldSelf", "coordinators is immutable: TxnIDs already issued name coordinator ids")
        ]
    return _obj(
        f"Desired state of the {kind}.",
        props,
        required=required,
        **{"x-kubernetes-validations": rules},
    )


def _writer_stat(description: str) -> Schema:
    return _obj(
        description,
        {
            "batchEnabled": _p("boolean", "Batching on for this store."),
            "batchedWriteMaxRecords": _p("integer", "Batch record limit in force."),
            "batchedWriteMaxSize": _p("integer", "Batch size limit in force (bytes)."),
            "batchedWriteMaxDelayInMillis": _p("integer", "Batch delay limit in force (milliseconds)."),
        },
    )


_BATCH_STATES = ["Enabled", "Disabled"]


def _status(kind: str) -> Schema:
    coordinator = kind == "TransactionCoordinator"
    time = {"type": "string", "format": "date-time"}
    condition = _obj(
        "A condition, keyed by type (Kubernetes API conventions).",
        {
            "type": _p(
                "string",
                "Ready, Progressing, BatchLogEnabled, DowngradeSafe, Paused, SettingsValid, "
                "ScaleInSafe, FeaturesSupported, OffloadHealthy or OffloadAudit.",
            ),
            "status": _p("string", "True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": _p("string", "CamelCase reason."),
            "message": _p("string", "Human explanation."),
            "lastTransitionTime": time | {"description": "When status last changed."},
            "observedGeneration": _p("integer", "Generation the condition was computed for."),
        },
        required=["type", "status"],
    )
    pod = _obj(
        "One pod as the operator last saw it.",
        {
            "name": _p("string", "Pod name."),
            "version": _p("string", "Release the pod's spec runs."),
            "release": _p("string", "Release the pod's admin API reports."),
            "formatLevel": _p("integer", "Storage format level the pod reports (1, 2 or 3)."),
            "offload": _obj(
                "The pod's offload state from GET /admin/v1/offload/summary (PendingAckStore pods of 3.x).",
                {
                    "maxMetadataVersion": _p(
                        "integer", "Highest managed-ledger metadata version (2: offload)."
                    ),
                    "tierOnlyLedgers": _p("integer", "Ledgers whose entries exist only in the tier."),
                    "assignedSegments": _p("integer", "Segments being uploaded."),
                    "offloadedSegments": _p("integer", "Segments complete in the tier."),
                    "failedSegments": _p("integer", "Segments whose upload failed (retried)."),
                    "error": _p("string", "Why the summary could not be read, if it could not."),
                },
            ),
            "ready": _p("boolean", "Pod Ready condition."),
            "batchLog": _p("string", "Enabled, Disabled or Unknown.", enum=[*_BATCH_STATES, "Unknown"]),
        },
        required=["name"],
    )
    marker_store = _obj(
        "A store's LastBatchedLedger.",
        {
            "store": _p("string", "Managed-ledger name of the store."),
            "lastBatchedLedger": _p("integer", "Largest ledger id that existed when it was rolled over."),
        },
    )
    downgrade = _obj(
        "Progress of a downgrade to a release that cannot read batched entries (persisted so that an "
        "operator restart resumes it).",
        {
            "startedAt": time | {"description": "When the downgrade started."},
            "fromVersion": _p(
                "string", "The batched-capable release the data was written by (recreation fallback)."
            ),
            "rolledOver": _arr(
                "Pods whose stores were rolled over after batching was disabled, with LastBatchedLedger.",
                _obj(
                    "One pod's rollover markers.",
                    {
                        "pod": _p("string", "Pod name."),
                        "stores": _arr("Markers of the pod's stores.", marker_store),
                    },
                ),
            ),
            "markersCompleteAt": time | {"description": "When every pod had been rolled over."},
            "verifierRequestedAt": time | {"description": "When the verifier was last started."},
            "blockedSince": time | {"description": "First verifier report that found live batched data."},
            "verifiedAt": time | {"description": "When a fresh safe report was accepted."},
        },
    )
    verdict = _obj(
        "The verifier's verdict on one store.",
        {
            "pod": _p("string", "Pod that owns the store."),
            "store": _p("string", "Managed-ledger name."),
            "safe": _p("boolean", "No live batched entry remains."),
            "reason": _p("string", "Why."),
        },
    )
    props: dict[str, Schema] = {
        "observedGeneration": _p("integer", "The spec generation this status describes."),
        "phase": _p("string", "Rollout phase, e.g. Ready, RollingUpgrade, DowngradeBlocked."),
        "phaseReason": _p("string", "Human explanation of the phase and what the operator waits for."),
        "conditions": _arr(
            "Ready, Progressing, BatchLogEnabled, DowngradeSafe, Paused, SettingsValid, ScaleInSafe "
            "(False, reason WouldLoseData: a scale-in refused because a pod being removed still holds "
            "data whose move failed; the message says what to do), AdminTLS with TLS (False while the "
            "operator's client certificate Secret txnkeeper-operator-client-tls is missing or unusable: no "
            "call reaches the pods) (and for a PendingAckStore FeaturesSupported, OffloadHealthy, "
            "OffloadAudit).",
            condition,
            **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        ),
        "replicas": _p("integer", "Pods that exist (scale subresource)."),
        "readyReplicas": _p("integer", "Pods that are Ready."),
        "selector": _p("string", "Label selector of the pods (scale subresource)."),
        "currentVersion": _p("string", "Release every pod runs, or a comma list while they differ."),
        "batchLog": _p(
            "string", "Enabled (every pod), Disabled (none) or Partial.", enum=[*_BATCH_STATES, "Partial"]
        ),
        "pods": _arr("Per-pod version and batch-log state.", pod),
        "downgrade": downgrade,
        "placement": _placement_status(),
        "lastVerifierReport": _obj(
            "The last verifier report the operator read (docs/contracts.md §7).",
            {
                "generatedAt": time | {"description": "When the report was produced."},
                "safe": _p("boolean", "Overall verdict."),
                "stores": _arr("Per-store verdicts that were not safe (at most 50).", verdict),
            },
        ),
        "tls": crd_tls.status_schema(),
        "lastAction": _obj(
            "The last action the operator took.",
            {
                "action": _p("string", "What it did."),
                "time": time | {"description": "When."},
            },
        ),
    }
    if coordinator:
        props["coordinatorArray"] = _arr(
            "Per-coordinator state and transaction-log batched-write settings (PIP-160).",
            _obj(
                "One coordinator.",
                {
                    "pod": _p("string", "Pod serving it."),
                    "coordinatorId": _p("integer", "Coordinator id."),
                    "state": _p("string", "Coordinator state."),
                    "transactionLogBatchedWriteStat": _writer_stat("Its transaction log writer."),
                },
            ),
        )
    else:
        finding = _obj(
            "One thing the audit found wrong.",
            {
                "kind": _p(
                    "string",
                    "missing-object, corrupt, orphan, pod-unreadable or mismatch (tier and pod differ).",
                ),
                "pod": _p("string", "Pod whose metadata names the segment."),
                "store": _p("string", "Managed-ledger name."),
                "uuid": _p("string", "Segment uuid."),
                "key": _p("string", "Blob-store object key."),
                "detail": _p("string", "What was wrong."),
            },
        )
        props["offloadAudit"] = _obj(
            "The last verify-offload report (the offload audit CronJob's ConfigMap {name}-offload-audit).",
            {
                "generatedAt": time | {"description": "When the audit ran."},
                "ok": _p("boolean", "Nothing was found (and the audit could run)."),
                "error": _p("string", "Why the audit could not run, if it could not."),
                "pods": _p("integer", "Store pods audited against."),
                "segments": _p("integer", "Segments the pods' metadata records."),
                "segmentsChecked": _p("integer", "Offloaded segments checked in the tier."),
                "blocksSampled": _p("integer", "Blocks read back with their CRCs."),
                "objects": _p("integer", "Objects listed in the tier."),
                "findingCount": _p("integer", "Findings in the report."),
                "findings": _arr("The first 20 findings.", finding),
                "stale": _p(
                    "string",
                    "Set when the last audit run (its Job, or its scheduled run) left no report: this "
                    "report is an earlier run's. Says what to check (the Job's logs).",
                ),
            },
        )
        props["subscriptionArray"] = _arr(
            "Per-subscription pending-ack batched-write settings (PIP-160).",
            _obj(
                "One subscription's pending-ack store.",
                {
                    "pod": _p("string", "Pod owning it."),
                    "topic": _p("string", "Topic."),
                    "subscription": _p("string", "Subscription."),
                    "transactionPendingAckBatchedWriteStat": _writer_stat("Its pending-ack log writer."),
                },
            ),
        )
    return _obj(f"Observed state of the {kind}, written by the operator.", props)


def _root_rules(kind: str) -> Schema:
    """Rules that need status: "a multiple of spec.replicas when the resource is created" cannot be a
    spec rule (it would refuse every later kubectl scale to another count) nor a transition rule (those
    never run on create; optionalOldSelf needs Kubernetes 1.30). The operator writes status.placement
    with the first record, so until then (on create, where the API server drops any status) the rule
    holds spec.shards to the replica count; afterwards the count is fixed and spec.replicas free."""
    if kind != "PendingAckStore":
        return {}
    return {
        "x-kubernetes-validations": [
            _rule(
                "!has(self.spec.shards) || self.spec.shards % self.spec.replicas == 0 || "
                "(has(self.status) && has(self.status.placement))",
                "spec.shards must be a multiple of spec.replicas when the PendingAckStore is created (the "
                "first placement keeps every topic on pod crc32(topic) mod replicas): e.g. 16 x "
                "spec.replicas, or leave spec.shards out",
            )
        ]
    }


def _placement_status() -> Schema:
    move = {
        "id": _p("string", "Move id (the pods' verbs are idempotent for it)."),
        "unit": _p("integer", "Shard (coordinator id) being moved."),
        "source": _p("integer", "Ordinal of the pod it moves off."),
        "target": _p("integer", "Ordinal of the pod it moves to."),
        "error": _p("string", "Why its last step failed, if it did."),
    }
    return _obj(
        "Who owns what (the record in ConfigMap {name}-placement, docs/contracts.md §12) and the moves "
        "in flight.",
        {
            "kind": _p("string", "store-shards or coordinator-ids."),
            "epoch": _p("integer", "Epoch of the record (every change is a new epoch)."),
            "shards": _p("integer", "How many shards (coordinator ids) the record has; fixed."),
            "phase": _p("string", "Balanced, ScalingOut, Draining, Rebalancing or ScaleInRefused."),
            "message": _p("string", "What the scaling waits for or does."),
            "rebalance": _p("string", "Why a rebalance is running, if one is."),
            "pods": _arr(
                "What each pod owns.",
                _obj(
                    "One pod's share.",
                    {
                        "pod": _p("string", "Pod name."),
                        "owned": _arr(
                            "Shards (coordinator ids) it owns.", _p("integer", "A shard (coordinator id).")
                        ),
                        "count": _p("integer", "How many."),
                    },
                ),
            ),
            "moves": _arr(
                "Moves in flight, at most spec.scaling.maxConcurrentMoves.",
                _obj(
                    "One move.",
                    {
                        **move,
                        "phase": _p(
                            "string",
                            "The step it takes next: fence, receive, switch, release or rollback.",
                            enum=["fence", "receive", "switch", "release", "rollback"],
                        ),
                        "reason": _p("string", "drain (scale-in), count or load (rebalance)."),
                        "failures": _p("integer", "Failures of its current step (5 roll it back)."),
                    },
                ),
            ),
            "failedMoves": _arr(
                "Moves rolled back after failing for good; their units are not moved again until "
                "txnkeeper.io/rebalance=now is set.",
                _obj("One failed move.", move),
            ),
        },
    )


def _crd(kind: str, plural: str, short: str, description: str) -> dict[str, Any]:
    ready = '.status.conditions[?(@.type=="Ready")].status'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "txnkeeper"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["txnkeeper"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": _obj(
                            description,
                            {
                                "apiVersion": _p("string", "APIVersion of this object."),
                                "kind": _p("string", "Kind of this object."),
                                "metadata": {"type": "object"},
                                "spec": _spec(kind),
                                "status": _status(kind),
                            },
                            required=["spec"],
                            **_root_rules(kind),
                        )
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Version", "type": "string", "jsonPath": ".spec.version"},
                        {"name": "Running", "type": "string", "jsonPath": ".status.currentVersion"},
                        {"name": "Batch Log", "type": "string", "jsonPath": ".status.batchLog"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Ready", "type": "string", "jsonPath": ready},
                        {
                            "name": "Reason",
                            "type": "string",
                            "jsonPath": ".status.phaseReason",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def definitions() -> dict[str, dict[str, Any]]:
    """File name -> CRD document."""
    return {
        "transactioncoordinators.yaml": _crd(
            "TransactionCoordinator",
            "transactioncoordinators",
            "tc",
            "Transaction coordinators whose transaction logs may be written in PIP-160 batches; the "
            "operator rolls versions and the batch log across its pods in the only safe order.",
        ),
        "pendingackstores.yaml": _crd(
            "PendingAckStore",
            "pendingackstores",
            "pas",
            "Pods that own topic partitions and their subscriptions' pending-ack logs (PIP-160 batched "
            "when enabled), rolled out by the operator like TransactionCoordinator.",
        ),
    }


HEADER = "# Generated by `python -m txnkeeper_operator.crdgen`; edit operator/txnkeeper_operator/crdgen.py.\n"


def render(document: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", nargs="+", type=Path, help="directories to write the CRDs into")
    args = parser.parse_args(argv)
    for out in args.out:
        out.mkdir(parents=True, exist_ok=True)
        for name, doc in definitions().items():
            (out / name).write_text(render(doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
