"""Names, labels and annotations of everything the operator owns, in one place.

The handlers, the resource builders, the verifier Job and the tests must agree on these exactly (a pod
found by the wrong selector is a pod the rollout never waits for), so none of them spells one itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from txnkeeper.contract.admin import COORDINATOR_LOG, PENDING_ACK_LOG
from txnkeeper.contract.names import (
    GROUP,
    PAUSE_ANNOTATION,
    REBALANCE_ANNOTATION,
    STARTUP_BATCH_ANNOTATION,
    VERIFIER_OF_LABEL,
    VERSION_LABEL,
)
from txnkeeper.contract.names import VERSION as API_VERSION

__all__ = [
    "API_VERSION",
    "GROUP",
    "PAUSE_ANNOTATION",
    "REBALANCE_ANNOTATION",
    "STARTUP_BATCH_ANNOTATION",
    "VERIFIER_OF_LABEL",
    "VERSION_LABEL",
]

FIELD_MANAGER = "txnkeeper-operator"


CLIENT_PORT = 6650
ADMIN_PORT = 8080
DATA_DIR = "/data"
CONFIG_DIR = "/etc/txnkeeper/config"
CONFIG_FILE = f"{CONFIG_DIR}/config.json"
TOKEN_DIR = "/etc/txnkeeper/token"
TOKEN_FILE = f"{TOKEN_DIR}/token"
# One per namespace, shared by the coordinator and store pods of every resource there (they must agree).
CLUSTER_SECRET = "txnkeeper-cluster-secret"
CLUSTER_SECRET_DIR = "/etc/txnkeeper/cluster"
CLUSTER_SECRET_FILE = f"{CLUSTER_SECRET_DIR}/secret"
# spec.clientAuthentication's Secret key, mounted in store pods (serve --client-token-key-file).
CLIENT_TOKEN_KEY_DIR = "/etc/txnkeeper/client-token-key"
CLIENT_TOKEN_KEY_FILE = f"{CLIENT_TOKEN_KEY_DIR}/key"
MARKERS_KEY = "markers.json"
PLACEMENT_KEY = "placement.json"
MOVES_KEY = "moves.json"
REPORT_KEY = "report.json"


@dataclass(frozen=True, slots=True)
class Kind:
    """One of the two custom resources and what differs between them."""

    kind: str
    plural: str
    short: str
    role: str  # the runtime's --role
    stat_key: str  # admin API body key: which log the batchedWrite block governs
    array_key: str  # admin API array of per-store stats
    array_stat_key: str  # field of an array entry holding its TxnBufferedWriterStat


TRANSACTION_COORDINATOR = Kind(
    "TransactionCoordinator",
    "transactioncoordinators",
    "tc",
    "coordinator",
    COORDINATOR_LOG.stat_key,
    COORDINATOR_LOG.array_key,
    COORDINATOR_LOG.array_stat_key,
)
PENDING_ACK_STORE = Kind(
    "PendingAckStore",
    "pendingackstores",
    "pas",
    "store",
    PENDING_ACK_LOG.stat_key,
    PENDING_ACK_LOG.array_key,
    PENDING_ACK_LOG.array_stat_key,
)
KINDS = (TRANSACTION_COORDINATOR, PENDING_ACK_STORE)


def selector_labels(kind: Kind, name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "txnkeeper",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": kind.role,
    }


def labels(kind: Kind, name: str) -> dict[str, str]:
    return {**selector_labels(kind, name), "app.kubernetes.io/managed-by": FIELD_MANAGER}


def verifier_labels(name: str) -> dict[str, str]:
    """Verifier Jobs and their pods: a component of their own, so the runtime pods' Service, PDB and
    the verifier's own pod selector never match them."""
    return {
        "app.kubernetes.io/name": "txnkeeper",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "verifier",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        VERIFIER_OF_LABEL: name,
    }


def selector_string(kind: Kind, name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(kind, name).items())


def config_map(name: str) -> str:
    return f"{name}-config"


def token_secret(name: str) -> str:
    return f"{name}-admin-token"


def verifier(name: str) -> str:
    """ServiceAccount, Role, RoleBinding and CronJob of the verifier."""
    return f"{name}-verifier"


def markers_config_map(name: str) -> str:
    return f"{name}-verifier-markers"


def report_config_map(name: str) -> str:
    """contracts §7: where the verifier Job writes its report."""
    return f"{name}-verifier-report"


def offload_audit(name: str) -> str:
    """CronJob of the periodic ``txnkeeper verify-offload`` tier audit (PendingAckStores with offload)."""
    return f"{name}-verify-offload"


def offload_audit_report(name: str) -> str:
    """Where the audit writes its report (key report.json); the operator reads it into status."""
    return f"{name}-offload-audit"


def offload_audit_labels(name: str) -> dict[str, str]:
    """Audit Jobs and pods: neither runtime pods nor verify-invalidation Jobs (whose label
    VERIFIER_OF_LABEL the downgrade gate lists), so neither selector ever matches them."""
    return {
        "app.kubernetes.io/name": "txnkeeper",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "offload-audit",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
    }


def placement_config_map(name: str) -> str:
    """contracts §12: the placement record and the operator's moves in flight."""
    return f"{name}-placement"


def verifier_job(name: str, stamp: int) -> str:
    return f"{name}-verify-{stamp}"


def pod_ordinal(pod_name: str) -> int:
    return int(pod_name.rsplit("-", 1)[1])
