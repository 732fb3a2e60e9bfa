"""What one ``txnkeeper serve`` process is, declared once: its role, addresses, pod name, data directory,
coordinator ids, secret files and log level, as flags and ``TXNKEEPER_*`` env (the operator passes them
as the StatefulSet's args and env).

Why flags and env only (``in_file=False``, ``in_cr=False``): the ``--config`` file is one per resource,
rendered from its CR and mounted on every pod alike, while these differ per pod (its name, ordinal,
files) or name the file itself. The rules between them (``--coordinator-ids auto`` needs ``--replicas``
and a pod name ending in its ordinal; ``--release`` must be a known release; the files must be readable
secrets) are serve's and the loaders' in ``server/``; each value on its own is checked here.
"""

from __future__ import annotations

from txnkeeper.contract.placement import MAX_MEMBERS, MAX_SHARDS
from txnkeeper.contract.settings.schema import Section, Setting

ROLES = ("coordinator", "store")
MAX_COORDINATORS = 4096  # the CRD's spec.coordinators maximum
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ADDRESS = r"^\S*:[0-9]{1,5}$"


def _text(
    key: str,
    flag: str,
    description: str,
    *,
    range_text: str = "a file path",
    default: str | None = None,
    pattern: str | None = None,
) -> Setting:
    env = flag.lstrip("-").upper().replace("-", "_")
    return Setting(
        key,
        env.lower(),
        "text",
        default,
        description,
        flag=flag,
        env=env,
        range_text=range_text,
        pattern=pattern,
        in_file=False,
        in_cr=False,
    )


def _count(key: str, flag: str, description: str, maximum: int) -> Setting:
    env = flag.lstrip("-").upper().replace("-", "_")
    return Setting(
        key,
        env.lower(),
        "int",
        None,
        description,
        flag=flag,
        env=env,
        minimum=1,
        maximum=maximum,
        in_file=False,
        in_cr=False,
    )


PROCESS = Section(
    "process",
    "One serve process: its role, addresses and files (flags and env only: they differ per pod).",
    (
        Setting(
            "role",
            "role",
            "enum",
            None,
            "What the pod runs: transaction coordinators, or topics with their subscriptions and "
            "pending-ack stores. Required.",
            flag="--role",
            env="ROLE",
            choices=ROLES,
            in_file=False,
            in_cr=False,
        ),
        _text(
            "dataDir",
            "--data-dir",
            "The pod's data directory (its volume). Required.",
            range_text="a directory path",
        ),
        _text(
            "release",
            "--release",
            "The release whose formats the pod writes (contracts §4); default: this runtime's version.",
            range_text="a release such as 2.0.0",
        ),
        _text(
            "listen",
            "--listen",
            "Client protocol host:port (txnkeeper's protocol and Pulsar's).",
            range_text="host:port (port 0: any free port)",
            pattern=_ADDRESS,
            default="0.0.0.0:6650",
        ),
        _text(
            "adminListen",
            "--admin-listen",
            "Admin API (and /metrics) host:port.",
            range_text="host:port (port 0: any free port)",
            pattern=_ADDRESS,
            default="0.0.0.0:8080",
        ),
        _text(
            "podName",
            "--pod-name",
            "The pod's name, ending in its ordinal (tc-2); default: the POD_NAME variable, else the host "
            "name.",
            range_text="a pod name",
        ),
        _count(
            "coordinators",
            "--coordinators",
            "Transaction coordinators of the resource (default 1).",
            MAX_COORDINATORS,
        ),
        _text(
            "coordinatorIds",
            "--coordinator-ids",
            "Coordinator ids this pod serves: a list (0,1) or auto (c mod --replicas == the pod's ordinal); "
            "default: 0..coordinators-1.",
            range_text="comma-separated coordinator ids (0,1,...) or auto",
        ),
        _count(
            "replicas",
            "--replicas",
            "Pods of the resource: sharing the coordinators, or (store pods) the first placement record's "
            "pods (contracts §12; without it and without a record given, a store serves every topic).",
            MAX_MEMBERS,
        ),
        _count(
            "shards",
            "--shards",
            "Store pods: the resource's shard count (a multiple of --replicas; default 16 x --replicas).",
            MAX_SHARDS,
        ),
        _text("adminTokenFile", "--admin-token-file", "File holding the admin API's bearer token."),
        _text(
            "clusterSecretFile",
            "--cluster-secret-file",
            "Secret shared by coordinator and store pods; without it transactions are refused.",
        ),
        _text(
            "clientTokenKeyFile",
            "--client-token-key-file",
            "Store pods: HS256 key of client tokens; with it, single-key writer ids and producer names "
            "belong to the principal of the connection's token (ClientAuth), which SetupAppend then "
            "requires.",
        ),
        _text(
            "config",
            "--config",
            "The JSON/YAML config file: the sections of contracts §6 (batchedWrite, offload, "
            "singleKeyTransactions, transactions, topicPolicies, pulsar, tls, connectionLimits, memory).",
        ),
        _text(
            "portsFile",
            "--ports-file",
            "Write {listen, admin} bound addresses here once ready (useful with port 0).",
        ),
        _text(
            "logLevel",
            "--log-level",
            "Log level (any case).",
            range_text="one of " + ", ".join(LOG_LEVELS) + " (any case)",
            pattern="(?i)^(" + "|".join(LOG_LEVELS) + ")$",
            default="INFO",
        ),
    ),
)
