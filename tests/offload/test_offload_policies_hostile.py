"""`offload-policies set` against hostile input, over HTTP to a real store pod (issue 25 item 6).

Before, it answered 200 for topics the pod does not hold (``../../etc``, names with NUL or newline, 617
characters) and persisted them, and it took ``"١٢٣"`` as 123, ``" 12 "``, ``"-0"``, a negative threshold,
a retry interval of 1e-9 s, a rollover of 1e308 s, a min block of 2^31 and a min block over the max.
Each row is one request with the exact answer it must get; none of them may persist anything.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

pytestmark = pytest.mark.timeout(120)

TOPIC = "persistent://public/default/policies"
SUB = "reader"
MAX_BLOCK = 4096  # the pod's own setting
LONG = "x" * 617
NOT_HELD = "is not on this pod; ask the pod that holds it"
NOT_A_NAME = "must be 1..512 printable characters; no topic of this pod has such a name"
PLAIN_INT = "is not an integer in plain decimal (ASCII digits 0-9, an optional leading '-', no spaces)"
PLAIN_NUMBER = (
    "is not a number in plain decimal (ASCII digits 0-9, an optional leading '-', no spaces, "
    "'.' for a fraction, no exponent)"
)
LONG_MAX = 9223372036854775807
VALID = {"offloadMode": "ledger"}
THRESHOLD = "managedLedgerOffloadThresholdInBytes"
RETRY = "offloadRetryIntervalSeconds"
MIN_ROLLOVER = "minOffloadSegmentRolloverTimeInSeconds"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServePod]:
    work = tmp_path_factory.mktemp("policies")
    tier = work / "tier"
    tier.mkdir()
    offload = {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadMaxBlockSizeInBytes": MAX_BLOCK,
    }
    pod = ServePod(work, "pas-0", "store", release="3.0.0", config={"offload": offload})
    try:
        pod.start()
        asyncio.run(_hold_topic(pod))
        yield pod
    finally:
        pod.stop()


async def _hold_topic(pod: ServePod) -> None:
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        await client.subscribe(TOPIC, SUB)  # its pending-ack log is a managed ledger of this pod too
        await (await client.create_producer(TOPIC)).send(b"held")


def _set(pod: ServePod, topic: str, body: object) -> tuple[int, Any]:
    query = urllib.parse.urlencode({"topic": topic})
    return http("POST", f"{pod.admin_url()}/admin/v1/topics/offload-policies?{query}", body, TOKEN)


# (topic, body, status, the whole error message)
HOSTILE: list[tuple[str, object, int, str]] = [
    # --- topics the pod does not hold: 404, before the body is looked at ---------------------------
    ("../../etc", VALID, 404, f"topic '../../etc' {NOT_HELD}"),
    ("/etc/passwd", VALID, 404, f"topic '/etc/passwd' {NOT_HELD}"),
    ("persistent://t/ns/never", VALID, 404, f"topic 'persistent://t/ns/never' {NOT_HELD}"),
    ("persistent://t/ns/a\x00b", VALID, 404, f"topic name 'persistent://t/ns/a\\x00b' {NOT_A_NAME}"),
    ("persistent://t/ns/a\nb", VALID, 404, f"topic name 'persistent://t/ns/a\\nb' {NOT_A_NAME}"),
    (LONG, VALID, 404, f"topic name '{'x' * 60}'... (617 characters) {NOT_A_NAME}"),
    ("persistent://t/ns/" + "y" * 223, VALID, 404, f"topic 'persistent://t/ns/{'y' * 182}' {NOT_HELD}"),
    (
        f"{TOPIC}-{SUB}__transaction_pending_ack",  # a managed ledger this pod holds, but not a topic
        VALID,
        404,
        f"topic name '{TOPIC}-{SUB}__transaction_pending_ack' may not end with __transaction_pending_ack;"
        " no topic of this pod has such a name",
    ),
    # --- numbers: strict decimal, nothing int() or float() would also take ---------------------------
    *(
        (
            TOPIC,
            {"managedLedgerOffloadThresholdInBytes": text},
            400,
            f"body: managedLedgerOffloadThresholdInBytes={text!r} {PLAIN_INT}",
        )
        for text in ("\u0661\u0662\u0663", " 12 ", "12 ", "+12", "1_000", "012", "0x10", "1e3", "12.0", "")
    ),
    (
        TOPIC,
        {"managedLedgerOffloadThresholdInBytes": "-0"},
        400,
        "body: managedLedgerOffloadThresholdInBytes='-0' is a negative zero; write 0",
    ),
    (
        TOPIC,
        {"offloadRetryIntervalSeconds": "-0.0"},
        400,
        "body: offloadRetryIntervalSeconds='-0.0' is a negative zero; write 0",
    ),
    (
        TOPIC,
        {"offloadRetryIntervalSeconds": -0.0},
        400,
        "body: offloadRetryIntervalSeconds is a negative zero; write 0",
    ),
    *(
        (TOPIC, {RETRY: text}, 400, f"body: {RETRY}={text!r} {PLAIN_NUMBER}")
        for text in ("\u0665", " 5", "5.", ".5", "1e3", "inf", "NaN")
    ),
    (
        TOPIC,
        {"managedLedgerOffloadThresholdInBytes": True},
        400,
        "body: managedLedgerOffloadThresholdInBytes must be a number, got a boolean",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadThresholdInBytes": 2**63},
        400,
        f"body: managedLedgerOffloadThresholdInBytes must be an integer that fits 64 bits, got {2**63}",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadThresholdInBytes": 1.5},
        400,
        "body: managedLedgerOffloadThresholdInBytes must be an integer that fits 64 bits, got 1.5",
    ),
    # --- ranges -----------------------------------------------------------------------------------------
    *(
        (
            TOPIC,
            {THRESHOLD: value},
            400,
            f"body: {THRESHOLD} must be -1 (offload on demand only) or 0..{LONG_MAX}, got -{abs(int(value))}",
        )
        for value in (-2, -5, "-5", -(2**62))
    ),
    (
        TOPIC,
        {"managedLedgerOffloadDeletionLagMs": -1},
        400,
        f"body: managedLedgerOffloadDeletionLagMs must be 0..{LONG_MAX}, got -1",
    ),
    (
        TOPIC,
        {"maxOffloadSegmentSizeInBytes": 0},
        400,
        f"body: maxOffloadSegmentSizeInBytes must be 1..{LONG_MAX}, got 0",
    ),
    (
        TOPIC,
        {"offloadRetryIntervalSeconds": 1e-9},
        400,
        "body: offloadRetryIntervalSeconds must be 1..86400, got 1e-09",
    ),
    (
        TOPIC,
        {"offloadRetryIntervalSeconds": "0.5"},
        400,
        "body: offloadRetryIntervalSeconds must be 1..86400, got 0.5",
    ),
    (
        TOPIC,
        {"offloadRetryIntervalSeconds": 86401},
        400,
        "body: offloadRetryIntervalSeconds must be 1..86400, got 86401.0",
    ),
    (
        TOPIC,
        {"maxOffloadSegmentRolloverTimeInSeconds": 1e308},
        400,
        "body: maxOffloadSegmentRolloverTimeInSeconds must be 1..604800, got 1e+308",
    ),
    (
        TOPIC,
        {"maxOffloadSegmentRolloverTimeInSeconds": 0},
        400,
        "body: maxOffloadSegmentRolloverTimeInSeconds must be 1..604800, got 0.0",
    ),
    (
        TOPIC,
        {"minOffloadSegmentRolloverTimeInSeconds": -1},
        400,
        "body: minOffloadSegmentRolloverTimeInSeconds must be 0..604800, got -1.0",
    ),
    (
        TOPIC,
        {MIN_ROLLOVER: 700, "maxOffloadSegmentRolloverTimeInSeconds": 600},
        400,
        f"offload of {TOPIC}: minOffloadSegmentRolloverTimeInSeconds must be between 0 and "
        "maxOffloadSegmentRolloverTimeInSeconds=600.0 (got 700.0)",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadMinBlockSizeInBytes": 2**31},
        400,
        "body: managedLedgerOffloadMinBlockSizeInBytes must be 140..268435456, got 2147483648",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadMinBlockSizeInBytes": 139},
        400,
        "body: managedLedgerOffloadMinBlockSizeInBytes must be 140..268435456, got 139",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadMinBlockSizeInBytes": MAX_BLOCK + 1},
        400,
        f"offload of {TOPIC}: managedLedgerOffloadMinBlockSizeInBytes={MAX_BLOCK + 1} is larger than "
        f"managedLedgerOffloadMaxBlockSizeInBytes={MAX_BLOCK}; a block is never larger than the max, "
        "so set the min block size at most the max",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadMaxBlockSizeInBytes": 2**31},
        400,
        "body: managedLedgerOffloadMaxBlockSizeInBytes must be 140..268435456, got 2147483648",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadWriteBufferSizeInBytes": 2**40},
        400,
        "body: managedLedgerOffloadWriteBufferSizeInBytes must be 1..268435456, got 1099511627776",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadReadBufferSizeInBytes": 0},
        400,
        "body: managedLedgerOffloadReadBufferSizeInBytes must be 1..268435456, got 0",
    ),
    # --- strings and locations ------------------------------------------------------------------------
    (
        TOPIC,
        {"fileSystemURI": "../../../etc"},
        400,
        f"offload of {TOPIC}: fileSystemURI='../../../etc' must be an absolute directory path (the tier's "
        "mount, e.g. /var/lib/txnkeeper-offload)",
    ),
    (
        TOPIC,
        {"fileSystemURI": "/tmp/a\x00b"},
        400,
        "body: fileSystemURI must be at most 1024 characters without control characters",
    ),
    (
        TOPIC,
        {"managedLedgerOffloadBucket": "b" * 1025},
        400,
        "body: managedLedgerOffloadBucket must be at most 1024 characters without control characters",
    ),
    (
        TOPIC,
        {"offloadMode": "sideways"},
        400,
        f"offload of {TOPIC}: offloadMode='sideways' is not supported; use one of streaming, ledger",
    ),
    (TOPIC, {}, 400, 'body has no offload setting; send e.g. {"offloadMode": "ledger"}'),
]


@pytest.mark.parametrize(("topic", "body", "status", "error"), HOSTILE)
def test_hostile_offload_policies_set_is_refused_and_persists_nothing(
    store: ServePod, topic: str, body: object, status: int, error: str
) -> None:
    assert _set(store, topic, body) == (status, {"error": error})
    assert not (store.data_dir / "store" / "offload-policies.json").exists()
    query = urllib.parse.urlencode({"topic": TOPIC})
    doc = http("GET", f"{store.admin_url()}/admin/v1/topics/offload-policies?{query}")[1]
    assert doc["override"] == {}, doc


def test_the_other_policy_verbs_answer_404_for_topics_the_pod_does_not_hold(store: ServePod) -> None:
    for topic in ("../../etc", "persistent://t/ns/a\nb", LONG, "persistent://t/ns/never"):
        query = urllib.parse.urlencode({"topic": topic})
        url = f"{store.admin_url()}/admin/v1/topics/offload-policies?{query}"
        for method in ("GET", "DELETE"):
            status, doc = http(method, url, None, TOKEN)
            assert status == 404 and ("not on this pod" in doc["error"] or NOT_A_NAME in doc["error"]), doc


def test_valid_settings_in_the_same_forms_are_accepted_and_persisted(store: ServePod) -> None:
    body = {
        "managedLedgerOffloadThresholdInBytes": "-1",
        "offloadRetryIntervalSeconds": "1.5",
        "maxOffloadSegmentRolloverTimeInSeconds": 604800,
        "managedLedgerOffloadMinBlockSizeInBytes": MAX_BLOCK,
        "managedLedgerOffloadDeletionLagMs": "0",
    }
    try:
        status, doc = _set(store, TOPIC, body)
        assert status == 200, doc
        assert doc["override"] == {
            "managedLedgerOffloadThresholdInBytes": -1,
            "offloadRetryIntervalSeconds": 1.5,
            "maxOffloadSegmentRolloverTimeInSeconds": 604800.0,
            "managedLedgerOffloadMinBlockSizeInBytes": MAX_BLOCK,
            "managedLedgerOffloadDeletionLagMs": 0,
        }
        saved = (store.data_dir / "store" / "offload-policies.json").read_text()
        assert json.loads(saved.split("\n", 1)[1])["topics"] == {TOPIC: doc["override"]}
    finally:
        query = urllib.parse.urlencode({"topic": TOPIC})
        http("DELETE", f"{store.admin_url()}/admin/v1/topics/offload-policies?{query}", None, TOKEN)
