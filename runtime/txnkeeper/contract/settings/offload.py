"""PIP-76 offload settings, declared once: the store pod's ``--config`` file's ``offload`` section and a
topic's ``offload-policies set`` (both under Pulsar's broker.conf / OffloadPolicies key names, plus ours
where Pulsar has none), the ``PendingAckStore.spec.offload`` fields that are the same settings (their CR
name is the ``cr`` spelling), the CRD's fragment of those fields and the docs' table.

Why: the CRD's limits, the pod's file reader and the admin API's override check each carried their own
copy of these keys, types and bounds. The reader (server/offload_settings.py) still owns what is
offload's own: values may be decimal strings as in Pulsar's properties files (read strictly by
``contract.store_settings.plain_number``), and whether the merged values make a working offloader.
Standard library only (docs/contracts.md §0: the operator imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txnkeeper.contract.settings.schema import Section, Setting, property_schema

OFFLOAD_DRIVERS = ("filesystem", "aws-s3", "S3")
S3_DRIVERS = ("aws-s3", "S3")
# Where the operator mounts the filesystem driver's RWX volume in a store pod (fileSystemURI).
OFFLOAD_MOUNT_DIR = "/var/lib/txnkeeper-offload"
# The credentials Secret's keys, passed to the pod as env of the same names (boto3's chain reads them).
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MIB = 1024 * 1024
JAVA_LONG_MAX = 2**63 - 1
# Pulsar's defaults (broker.conf), what the CRD documents when a field is left out.
DEFAULT_THRESHOLD_BYTES = -1  # manual offload only
DEFAULT_DELETION_LAG_MS = 4 * 3600 * 1000
DEFAULT_MAX_SEGMENT_SIZE_BYTES = 1024 * MIB
DEFAULT_MAX_SEGMENT_ROLLOVER_SECONDS = 600
DEFAULT_MIN_SEGMENT_ROLLOVER_SECONDS = 0
DEFAULT_MAX_BLOCK_SIZE_BYTES = 64 * MIB
DEFAULT_MIN_BLOCK_SIZE_BYTES = 5 * MIB  # streaming's block (Pulsar's streamingBlockSize)
DEFAULT_READ_BUFFER_SIZE_BYTES = 1 * MIB
DEFAULT_WRITE_BUFFER_SIZE_BYTES = 10 * MIB
DEFAULT_RETRY_INTERVAL_SECONDS = 30
MAX_MAX_BLOCK_SIZE_BYTES = 256 * MIB  # a block is one ranged GET held in memory
# The runtime's smallest block: its 128-byte header plus one framed (empty) entry (ledger.offload.config).
MIN_MAX_BLOCK_SIZE_BYTES = 128 + 12
# A segment younger than a second is a retry storm of tiny objects; one older than a week holds
# a week of acknowledged data outside the tier.
MIN_SEGMENT_ROLLOVER_SECONDS = 1
MAX_SEGMENT_ROLLOVER_SECONDS = 7 * 24 * 3600
# Retries faster than once a second turned a full tier into hundreds of errors a second (issue 25).
MIN_RETRY_INTERVAL_SECONDS = 1
MAX_RETRY_INTERVAL_SECONDS = 24 * 3600
MAX_OFFLOAD_BUFFER_BYTES = 256 * MIB  # write (read-ahead) and read buffers: memory the offloader holds
MAX_TEXT = 1024  # a bucket, region, endpoint or directory; longer is a mistake
TEXT_RANGE = f"a string of at most {MAX_TEXT} characters without control characters"


def _text(key: str, default: str, description: str, cr: str | None = None) -> Setting:
    return Setting(
        key,
        key,
        "text",
        default,
        description,
        range_text=TEXT_RANGE,
        spellings={"cr": cr} if cr else {},
        in_cr=cr is not None,
    )


def _count(key: str, default: int, description: str, **extra: Any) -> Setting:
    return Setting(key, key, "int", default, description, unit="bytes", **extra)


OFFLOAD = Section(
    "offload",
    "PIP-76 offload of a store pod's topic ledgers (the config file's section, and a topic's overrides "
    "through the admin API's offload-policies set, the topic's keys over the pod's). Numbers may be "
    "JSON numbers or plain decimal strings, as in Pulsar's properties files.",
    (
        # ---- the blob store (OffloadConfig)
        _text(
            "managedLedgerOffloadDriver",
            "filesystem",
            "filesystem, aws-s3 or S3 (checked with the other settings: a topic override may leave it out).",
            "driver",
        ),
        _text("managedLedgerOffloadBucket", "", "S3 bucket (required for aws-s3/S3).", "bucket"),
        _text("managedLedgerOffloadRegion", "", "S3 region, e.g. eu-west-1.", "region"),
        _text(
            "managedLedgerOffloadServiceEndpoint",
            "",
            "S3 service endpoint URL (MinIO, Ceph RGW, ...); empty: AWS's for the region.",
            "endpoint",
        ),
        _text(
            "fileSystemURI", "", "The filesystem driver's directory (the operator sets its volume's mount)."
        ),
        _count(
            "managedLedgerOffloadMaxBlockSizeInBytes",
            DEFAULT_MAX_BLOCK_SIZE_BYTES,
            "Size of one data block (one ranged read), default 64 MiB.",
            minimum=MIN_MAX_BLOCK_SIZE_BYTES,
            maximum=MAX_MAX_BLOCK_SIZE_BYTES,
            spellings={"cr": "maxBlockSizeBytes"},
        ),
        _count(
            "managedLedgerOffloadMinBlockSizeInBytes",
            DEFAULT_MIN_BLOCK_SIZE_BYTES,
            "Streaming mode's block size (capped at the max block size when left out), at most the max.",
            minimum=MIN_MAX_BLOCK_SIZE_BYTES,
            maximum=MAX_MAX_BLOCK_SIZE_BYTES,
            in_cr=False,
        ),
        _count(
            "managedLedgerOffloadReadBufferSizeInBytes",
            DEFAULT_READ_BUFFER_SIZE_BYTES,
            "Size of each read from a ranged GET's response stream.",
            minimum=1,
            maximum=MAX_OFFLOAD_BUFFER_BYTES,
            in_cr=False,
        ),
        _count(
            "managedLedgerOffloadWriteBufferSizeInBytes",
            DEFAULT_WRITE_BUFFER_SIZE_BYTES,
            "Bytes of local entries streaming reads ahead of the upload (bounds the offloader's memory).",
            minimum=1,
            maximum=MAX_OFFLOAD_BUFFER_BYTES,
            in_cr=False,
        ),
        # ---- the policy (OffloadPolicy)
        _count(
            "managedLedgerOffloadThresholdInBytes",
            DEFAULT_THRESHOLD_BYTES,
            "Offload once a topic holds more than this; -1 (default): only on demand (txnkeeper admin "
            "topics offload).",
            # -1 is Pulsar's "on demand only": the range -1..max is exactly {-1} and 0..max for an integer.
            minimum=-1,
            range_text=f"-1 (offload on demand only) or 0..{JAVA_LONG_MAX}",
            spellings={"cr": "thresholdBytes"},
        ),
        Setting(
            "managedLedgerOffloadDeletionLagMs",
            "managedLedgerOffloadDeletionLagMs",
            "int",
            DEFAULT_DELETION_LAG_MS,
            "Keep local files this long after their segment is offloaded (default 4 h).",
            minimum=0,
            unit="ms",
            spellings={"cr": "deletionLagMs"},
        ),
        _count(
            "maxOffloadSegmentSizeInBytes",
            DEFAULT_MAX_SEGMENT_SIZE_BYTES,
            "Close a segment at this size (default 1 GiB).",
            minimum=1,
            spellings={"cr": "maxSegmentSizeBytes"},
        ),
        Setting(
            "maxOffloadSegmentRolloverTimeInSeconds",
            "maxOffloadSegmentRolloverTimeInSeconds",
            "number",
            DEFAULT_MAX_SEGMENT_ROLLOVER_SECONDS,
            "Close a segment at this age (default 600, at most a week).",
            minimum=MIN_SEGMENT_ROLLOVER_SECONDS,
            maximum=MAX_SEGMENT_ROLLOVER_SECONDS,
            unit="s",
            spellings={"cr": "maxSegmentRolloverSeconds"},
            cr_integer=True,  # the CR takes whole seconds
        ),
        Setting(
            "minOffloadSegmentRolloverTimeInSeconds",
            "minOffloadSegmentRolloverTimeInSeconds",
            "number",
            DEFAULT_MIN_SEGMENT_ROLLOVER_SECONDS,
            "Never close a segment younger than this (default 0, at most a week).",
            minimum=0,
            maximum=MAX_SEGMENT_ROLLOVER_SECONDS,
            unit="s",
            spellings={"cr": "minSegmentRolloverSeconds"},
            cr_integer=True,
        ),
        _text(
            "managedLedgerDataReadPriority",
            "tiered-storage-first",
            "tiered-storage-first or bookkeeper-first: where a ledger both local and offloaded is read.",
        ),
        Setting(
            "offloadRetryIntervalSeconds",
            "offloadRetryIntervalSeconds",
            "number",
            DEFAULT_RETRY_INTERVAL_SECONDS,
            "Seconds between attempts after a failed upload (ours).",
            minimum=MIN_RETRY_INTERVAL_SECONDS,
            maximum=MAX_RETRY_INTERVAL_SECONDS,
            unit="s",
            in_cr=False,
        ),
        _text(
            "offloadMode",
            "streaming",
            "streaming (PIP-76: segments of the open ledger) or ledger (one segment per closed ledger); "
            "ours.",
        ),
    ),
)
# The settings of the policy (OffloadPolicy); the others make its blob store (OffloadConfig).
POLICY_KEYS = frozenset(
    {
        "managedLedgerOffloadThresholdInBytes",
        "managedLedgerOffloadDeletionLagMs",
        "maxOffloadSegmentSizeInBytes",
        "maxOffloadSegmentRolloverTimeInSeconds",
        "minOffloadSegmentRolloverTimeInSeconds",
        "managedLedgerDataReadPriority",
        "offloadRetryIntervalSeconds",
        "offloadMode",
    }
)
# CR field -> Pulsar key in the config file's "offload" section, for every CR field that is one of these
# settings.
OFFLOAD_KEYS: dict[str, str] = {cr: s.key for cr, s in OFFLOAD.keys("cr").items()}


def bounds(setting: Setting) -> tuple[float, float]:
    """The lowest and highest value a numeric setting takes (Java's long where it states no maximum)."""
    low = -JAVA_LONG_MAX if setting.minimum is None else setting.minimum
    return low, JAVA_LONG_MAX if setting.maximum is None else setting.maximum


def range_text(setting: Setting) -> str:
    """What a refusal says a numeric setting must be."""
    low, high = bounds(setting)
    return setting.range_text or f"{low}..{high}"


def cr_properties() -> dict[str, Any]:
    """The CRD's properties of the numeric CR fields (their text ones carry CR-only checks: the driver's
    choices, S3's bucket name length, an endpoint URL, so crdgen writes those)."""
    return {
        cr: property_schema(s, f"{s.key}: {s.description}")
        for cr, s in OFFLOAD.keys("cr").items()
        if s.kind in ("int", "number")
    }


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
