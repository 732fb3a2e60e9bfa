"""The PendingAckStore's release-gated settings: ``spec.offload`` (PIP-76) and
``spec.singleKeyTransactions`` (PDP-44), in the CR's spelling and in the pod ``--config`` file's.

Why here: the CRD (its limits and CEL rules are generated from these constants), the operator (which
renders a CR into the config file) and the runtime (which reads the file) must agree on names, limits
and defaults, as for batched writes (``contract.batching``). The config file uses Pulsar's key names for
offload (broker.conf's ``managedLedgerOffload*``), so an operator who knows Pulsar recognises them.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txnkeeper.contract.formats import Feature

MIB = 1024 * 1024

# ---- offload ------------------------------------------------------------------------------------------

OFFLOAD_DRIVERS = ("filesystem", "aws-s3", "S3")
S3_DRIVERS = ("aws-s3", "S3")
# Where the operator mounts the filesystem driver's RWX volume in a store pod (fileSystemURI).
OFFLOAD_MOUNT_DIR = "/var/lib/txnkeeper-offload"
# The credentials Secret's keys, passed to the pod as env of the same names (boto3's chain reads them).
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

# CR field -> Pulsar key in the config file's top-level "offload" section.
OFFLOAD_KEYS: dict[str, str] = {
    "driver": "managedLedgerOffloadDriver",
    "bucket": "managedLedgerOffloadBucket",
    "region": "managedLedgerOffloadRegion",
    "endpoint": "managedLedgerOffloadServiceEndpoint",
    "thresholdBytes": "managedLedgerOffloadThresholdInBytes",
    "deletionLagMs": "managedLedgerOffloadDeletionLagMs",
    "maxSegmentSizeBytes": "maxOffloadSegmentSizeInBytes",
    "maxSegmentRolloverSeconds": "maxOffloadSegmentRolloverTimeInSeconds",
    "minSegmentRolloverSeconds": "minOffloadSegmentRolloverTimeInSeconds",
    "maxBlockSizeBytes": "managedLedgerOffloadMaxBlockSizeInBytes",
}
# Pulsar's defaults (broker.conf), what the CRD documents when a field is left out.
DEFAULT_THRESHOLD_BYTES = -1  # manual offload only
DEFAULT_DELETION_LAG_MS = 4 * 3600 * 1000
DEFAULT_MAX_SEGMENT_SIZE_BYTES = 1024 * MIB
DEFAULT_MAX_SEGMENT_ROLLOVER_SECONDS = 600
DEFAULT_MIN_SEGMENT_ROLLOVER_SECONDS = 0
DEFAULT_MAX_BLOCK_SIZE_BYTES = 64 * MIB
MAX_MAX_BLOCK_SIZE_BYTES = 256 * MIB  # a block is one ranged GET held in memory
# The runtime's smallest block: its 128-byte header plus one framed (empty) entry (ledger.offload.config).
MIN_MAX_BLOCK_SIZE_BYTES = 128 + 12
# Limits of the pod's offload settings (config file and `offload-policies set`) beyond the CR's fields.
# A segment younger than a second is a retry storm of tiny objects; one older than a week holds
# a week of acknowledged data outside the tier.
MIN_SEGMENT_ROLLOVER_SECONDS = 1
MAX_SEGMENT_ROLLOVER_SECONDS = 7 * 24 * 3600
# Retries faster than once a second turned a full tier into hundreds of errors a second (issue 25).
MIN_RETRY_INTERVAL_SECONDS = 1
MAX_RETRY_INTERVAL_SECONDS = 24 * 3600
MAX_OFFLOAD_BUFFER_BYTES = 256 * MIB  # write (read-ahead) and read buffers: memory the offloader holds


def offload_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config file's ``offload`` section for a CR's ``spec.offload`` (only the keys it sets).

    ``enabled: false`` keeps the location (pods must still read, and a downgrade restore, what was
    offloaded) but stops automatic offload: the threshold becomes -1 (manual only, as in Pulsar)."""
    out: dict[str, Any] = {}
    for field, key in OFFLOAD_KEYS.items():
        if field in spec and spec[field] is not None and spec[field] != "":
            out[key] = spec[field]
    if spec.get("driver") == "filesystem":
        out["fileSystemURI"] = OFFLOAD_MOUNT_DIR
    if spec.get("enabled") is False:
        out[OFFLOAD_KEYS["thresholdBytes"]] = -1
    return out


# ---- single-key transactions --------------------------------------------------------------------------

SRK_MAX_BLOCK_BYTES = 16 * MIB  # PDP-44's max transaction size; a block is applied in one group commit
SRK_DEFAULT_MAX_BLOCK_BYTES = 16 * MIB
# How long a silent writer's last event number (and an idempotent producer's last sequence id) is
# remembered: 7 days, longer than Pulsar's brokerDeduplicationProducerInactivityMinutes (360), because a
# writer that reconnects after its state expired gets WRITER_STATE_LOST instead of a retry.
SRK_DEFAULT_WRITER_INACTIVITY_MINUTES = 7 * 24 * 60
SRK_MAX_WRITER_INACTIVITY_MINUTES = 365 * 24 * 60  # a year
SRK_DEFAULT_MAX_WRITERS_PER_TOPIC = 10_000
SRK_MAX_MAX_WRITERS_PER_TOPIC = 1_000_000  # the writer table is held in memory and in every snapshot
SRK_KEYS = ("enabled", "maxBlockBytes", "writerInactivityMinutes", "maxWritersPerTopic")


def single_key_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config file's ``singleKeyTransactions`` section (same key names as the CR)."""
    return {key: spec[key] for key in SRK_KEYS if key in spec and spec[key] is not None}


# ---- release gating -----------------------------------------------------------------------------------

# spec field -> the feature it needs; a section counts as "used" per ``used``.
GATED_SECTIONS: dict[str, Feature] = {
    "offload": Feature.OFFLOAD_SEGMENTS,
    "singleKeyTransactions": Feature.SINGLE_KEY_TRANSACTIONS,
}


def used(section: str, spec: Mapping[str, Any]) -> bool:
    """Whether a gated section is switched on: ``offload`` by a driver and ``enabled`` (default
    true), ``singleKeyTransactions`` by ``enabled: true``."""
    value = spec.get(section)
    if not isinstance(value, Mapping):
        return False
    if section == "offload":
        return bool(value.get("driver")) and value.get("enabled", True) is not False
    return bool(value.get("enabled"))


def configured(section: str, spec: Mapping[str, Any]) -> bool:
    """Whether a section must reach pods that can use it: ``offload`` whenever it names a driver
    (disabled, it still says where offloaded data lives), others when used."""
    value = spec.get(section)
    if section == "offload":
        return isinstance(value, Mapping) and bool(value.get("driver"))
    return used(section, spec)
