"""Pulsar's topic policies (retention, message TTL, backlog quota) as a store pod's defaults, declared once:
the ``--config`` file's ``topicPolicies`` section (Pulsar's key names, one block per admin verb: a block is
exactly the body of ``txnkeeper admin topics retention|message-ttl|backlog-quota set``), the
PendingAckStore's ``spec.topicPolicies`` fields (their ``cr`` spelling: the CR spells units out and is
flat), the CRD's fragment of them and the docs' table.

Why: the CRD's bounds, the operator's check of a CR, the pod's reader and the admin verbs each named
these keys and bounds on their own. A block is a nested object of the file, so its keys are dotted
(``retention.retentionTimeInMinutes``, as ``tls.clientAuth.client``). The reader
(server/topic_policies.py) keeps what is the policies' own: numbers may be plain decimal strings as in
Pulsar's properties files (read strictly by ``contract.store_settings.plain_number``) and a topic's blocks
merge over the pod's. Standard library only (docs/contracts.md §0: the operator imports it).
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

MIB = 1024 * 1024
_JAVA_INT_MAX = 2**31 - 1
_JAVA_LONG_MAX = 2**63 - 1

TOPIC_POLICIES_SECTION = "topicPolicies"
RETENTION_BLOCK = "retention"
MESSAGE_TTL_BLOCK = "messageTTL"
BACKLOG_QUOTA_BLOCK = "backlogQuota"
CHECK_INTERVAL_KEY = "checkIntervalSeconds"
BACKLOG_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")
DEFAULT_BACKLOG_POLICY = "producer_request_hold"  # Pulsar's backlogQuotaDefaultRetentionPolicy
# How often a store pod applies them (retention trims, TTL, backlog quota checks): Pulsar checks
# retention every 120 s, expiry every 5 min and quotas every 60 s; one interval here, 10 s by default.
DEFAULT_CHECK_INTERVAL_SECONDS = 10
MIN_CHECK_INTERVAL_SECONDS = 1
MAX_CHECK_INTERVAL_SECONDS = 3600


def _policy(
    key: str,
    cr: str,
    description: str,
    *,
    low: int,
    high: int,
    special: str,
    default: int | None = None,
    unit: str | None = None,
) -> Setting:
    """A numeric policy key: Pulsar's Java types bound them (minutes, seconds and limitTime are ints,
    sizes longs; retentionSizeInMB so that its bytes fit one); ``special`` is what the lowest values
    mean."""
    return Setting(
        key,
        cr,
        "int",
        default,
        description,
        minimum=low,
        maximum=high,
        range_text=f"{special} or {low + 1}..{high}" if low == 0 else f"{special} or 0..{high}",
        spellings={"cr": cr},
        cr_default=False,
        unit=unit,
    )


TOPIC_POLICIES = Section(
    TOPIC_POLICIES_SECTION,
    "A store pod's defaults of every topic's retention, message TTL and backlog quota (a topic's own "
    "settings override them key by key; a key neither sets has Pulsar's default), and how often they are "
    "applied. Numbers may be JSON numbers or plain decimal strings, as in Pulsar's properties files.",
    (
        _policy(
            f"{RETENTION_BLOCK}.retentionTimeInMinutes",
            "retentionMinutes",
            "retentionTimeInMinutes: a consumed ledger goes once closed longer ago than this (-1: no time "
            "limit, 0: at once). Set with retentionSizeMB.",
            low=-1,
            high=_JAVA_INT_MAX,
            special="-1 (infinite)",
            unit="min",
        ),
        _policy(
            f"{RETENTION_BLOCK}.retentionSizeInMB",
            "retentionSizeMB",
            "retentionSizeInMB: a consumed ledger goes once the topic holds this many MiB without it (-1: "
            "no size limit, 0: at once). Set with retentionMinutes.",
            low=-1,
            high=_JAVA_LONG_MAX // MIB,
            special="-1 (infinite)",
        ),
        _policy(
            f"{MESSAGE_TTL_BLOCK}.messageTTLInSeconds",
            "messageTTLSeconds",
            "messageTTLInSeconds: every subscription acknowledges messages published longer ago than this "
            "(0: no TTL).",
            low=0,
            high=_JAVA_INT_MAX,
            special="0 (no TTL)",
            default=0,
            unit="s",
        ),
        _policy(
            f"{BACKLOG_QUOTA_BLOCK}.limitSize",
            "backlogQuotaLimitBytes",
            "Backlog quota limitSize: a subscription's backlog past this many bytes is over the quota (-1: "
            "no limit).",
            low=-1,
            high=_JAVA_LONG_MAX,
            special="-1 (no limit)",
            default=-1,
            unit="bytes",
        ),
        _policy(
            f"{BACKLOG_QUOTA_BLOCK}.limitTime",
            "backlogQuotaLimitSeconds",
            "Backlog quota limitTime: a subscription whose oldest unacknowledged message is older than this "
            "many seconds is over the quota (-1: no limit).",
            low=-1,
            high=_JAVA_INT_MAX,
            special="-1 (no limit)",
            default=-1,
            unit="s",
        ),
        Setting(
            f"{BACKLOG_QUOTA_BLOCK}.policy",
            "backlogQuotaPolicy",
            "enum",
            DEFAULT_BACKLOG_POLICY,
            "Backlog quota policy while over the quota: producer_request_hold (default: sends wait, at most "
            "20 s), producer_exception (sends fail with BACKLOG_QUOTA_EXCEEDED) or "
            "consumer_backlog_eviction (the oldest backlog is skipped).",
            choices=BACKLOG_POLICIES,
            spellings={"cr": "backlogQuotaPolicy"},
            cr_default=False,
        ),
        Setting(
            CHECK_INTERVAL_KEY,
            "checkIntervalSeconds",
            "int",
            DEFAULT_CHECK_INTERVAL_SECONDS,
            "How often a store pod applies the policies (retention trims, TTL, quota checks); default "
            f"{DEFAULT_CHECK_INTERVAL_SECONDS}.",
            minimum=MIN_CHECK_INTERVAL_SECONDS,
            maximum=MAX_CHECK_INTERVAL_SECONDS,
            range_text=f"{MIN_CHECK_INTERVAL_SECONDS}..{MAX_CHECK_INTERVAL_SECONDS}",
            unit="s",
            spellings={"cr": CHECK_INTERVAL_KEY},
            cr_default=False,
        ),
    ),
    unknown_error="{where}: unknown key(s) {unknown}; known keys: {known}",
)


def block_settings(block: str) -> dict[str, Setting]:
    """A block's settings by their key in the block (``retentionTimeInMinutes``), in declared order."""
    prefix = f"{block}."
    return {k.removeprefix(prefix): s for k, s in TOPIC_POLICIES.keys().items() if k.startswith(prefix)}


BLOCKS = (RETENTION_BLOCK, MESSAGE_TTL_BLOCK, BACKLOG_QUOTA_BLOCK)
