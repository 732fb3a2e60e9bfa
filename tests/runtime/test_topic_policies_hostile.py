"""The topic-policy verbs (`retention`, `message-ttl`, `backlog-quota` get|set|remove) against hostile
input, over HTTP to a real store pod, and the config file's ``topicPolicies`` section (issue 25 item 14).

Each row is one request with the exact answer it must get; none of them may persist anything. The
rules are offload-policies' (contracts §9): 404 for a topic the pod does not hold, before the body is
looked at; numbers as JSON integers or plain ASCII decimal text; each value within its range.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from policy_pods import policy_url
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

pytestmark = pytest.mark.timeout(120)

TOPIC = "persistent://public/default/topic-policies"
LONG = "x" * 617
NOT_HELD = "is not on this pod; ask the pod that holds it"
NOT_A_NAME = "must be 1..512 printable characters; no topic of this pod has such a name"
PLAIN_INT = "is not an integer in plain decimal (ASCII digits 0-9, an optional leading '-', no spaces)"
INT_MAX = 2147483647
LONG_MAX = 9223372036854775807
VERBS = ("retention", "message-ttl", "backlog-quota")
VALID: dict[str, dict[str, Any]] = {
    "retention": {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10},
    "message-ttl": {"messageTTLInSeconds": 60},
    "backlog-quota": {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"},
}
KEYS = {
    "retention": "retentionSizeInMB, retentionTimeInMinutes",
    "message-ttl": "messageTTLInSeconds",
    "backlog-quota": "limitSize, limitTime, policy",
}
EXAMPLES = {
    "retention": '{"retentionTimeInMinutes": 60, "retentionSizeInMB": 1024}',
    "message-ttl": '{"messageTTLInSeconds": 3600}',
    "backlog-quota": '{"limitSize": 10737418240, "limitTime": -1, "policy": "producer_request_hold"}',
}
# verb -> (an integer key, the range text its refusal names)
INTEGER_KEY = {
    "retention": ("retentionTimeInMinutes", f"-1 (infinite) or 0..{INT_MAX}"),
    "message-ttl": ("messageTTLInSeconds", f"0 (no TTL) or 1..{INT_MAX}"),
    "backlog-quota": ("limitTime", f"-1 (no limit) or 0..{INT_MAX}"),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServePod]:
    pod = ServePod(tmp_path_factory.mktemp("topic-policies"), "pas-0", "store")
    try:
        pod.start()
        asyncio.run(_hold_topic(pod))
        yield pod
    finally:
        pod.stop()


async def _hold_topic(pod: ServePod) -> None:
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        await client.subscribe(TOPIC, "reader")
        await (await client.create_producer(TOPIC)).send(b"held")


def _rows() -> Iterator[tuple[str, str, str, object, int, str]]:
    """(verb, method, topic, body, status, the whole error message)."""
    for verb in VERBS:
        valid = VALID[verb]
        key, range_text = INTEGER_KEY[verb]
        # --- topics the pod does not hold: 404 for every method, before the body is looked at -----
        for method in ("GET", "POST", "DELETE"):
            body = valid if method == "POST" else None
            yield verb, method, "../../etc", body, 404, f"topic '../../etc' {NOT_HELD}"
            yield (
                verb,
                method,
                "persistent://t/ns/never",
                body,
                404,
                f"topic 'persistent://t/ns/never' {NOT_HELD}",
            )
            yield (
                verb,
                method,
                "persistent://t/ns/a\x00b",
                body,
                404,
                f"topic name 'persistent://t/ns/a\\x00b' {NOT_A_NAME}",
            )
            yield (
                verb,
                method,
                "persistent://t/ns/a\nb",
                body,
                404,
                f"topic name 'persistent://t/ns/a\\nb' {NOT_A_NAME}",
            )
            yield verb, method, LONG, body, 404, f"topic name '{'x' * 60}'... (617 characters) {NOT_A_NAME}"
            yield (
                verb,
                method,
                f"{TOPIC}-reader__transaction_pending_ack",
                body,
                404,
                f"topic name '{TOPIC}-reader__transaction_pending_ack' may not end with "
                "__transaction_pending_ack; no topic of this pod has such a name",
            )
        yield (
            verb,
            "POST",
            "persistent://t/ns/never",
            "not json",
            404,
            f"topic 'persistent://t/ns/never' {NOT_HELD}",
        )
        yield (
            verb,
            "GET",
            "",
            None,
            400,
            "query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)",
        )
        yield verb, "DELETE", TOPIC, None, 404, f"topic '{TOPIC}' has no {verb} override to remove"
        # --- bodies -------------------------------------------------------------------------------
        yield verb, "POST", TOPIC, {}, 400, f"body has no {verb} setting; send e.g. {EXAMPLES[verb]}"
        yield verb, "POST", TOPIC, [1], 400, "body must be a JSON object, got list"
        yield (
            verb,
            "POST",
            TOPIC,
            {"x": 1},
            400,
            f"body: unknown {verb} setting 'x'; known settings: {KEYS[verb]}",
        )
        yield (
            verb,
            "POST",
            TOPIC,
            {**valid, "managedLedgerOffloadDriver": "filesystem"},
            400,
            f"body: unknown {verb} setting 'managedLedgerOffloadDriver'; known settings: {KEYS[verb]}",
        )
        # --- numbers: strict decimal, nothing int() would also take -------------------------------
        for text in ("\u0661\u0662\u0663", " 12 ", "+12", "1_000", "012", "0x10", "1e3", "12.0", ""):
            yield verb, "POST", TOPIC, {key: text}, 400, f"body: {key}={text!r} {PLAIN_INT}"
        yield verb, "POST", TOPIC, {key: "-0"}, 400, f"body: {key}='-0' is a negative zero; write 0"
        yield verb, "POST", TOPIC, {key: True}, 400, f"body: {key} must be a number, got a boolean"
        yield verb, "POST", TOPIC, {key: None}, 400, f"body: {key} must be a number, got None"
        yield (
            verb,
            "POST",
            TOPIC,
            {key: 1.5},
            400,
            f"body: {key} must be an integer that fits 64 bits, got 1.5",
        )
        yield (
            verb,
            "POST",
            TOPIC,
            {key: 2**64},
            400,
            f"body: {key} must be an integer that fits 64 bits, got {2**64}",
        )
        yield verb, "POST", TOPIC, {key: -2}, 400, f"body: {key} must be {range_text}, got -2"
        yield (
            verb,
            "POST",
            TOPIC,
            {key: INT_MAX + 1},
            400,
            f"body: {key} must be {range_text}, got {INT_MAX + 1}",
        )
        yield verb, "POST", TOPIC, {key: [1]}, 400, f"body: {key} must be a number, got list"
    # --- per verb -------------------------------------------------------------------------------------
    size_range = f"-1 (infinite) or 0..{LONG_MAX // (1024 * 1024)}"
    yield (
        "retention",
        "POST",
        TOPIC,
        {"retentionSizeInMB": LONG_MAX},
        400,
        f"body: retentionSizeInMB must be {size_range}, got {LONG_MAX}",
    )
    yield (
        "retention",
        "POST",
        TOPIC,
        {"retentionSizeInMB": "-5"},
        400,
        f"body: retentionSizeInMB must be {size_range}, got -5",
    )
    yield (
        "message-ttl",
        "POST",
        TOPIC,
        {"messageTTLInSeconds": -1},
        400,
        f"body: messageTTLInSeconds must be 0 (no TTL) or 1..{INT_MAX}, got -1",
    )
    yield (
        "backlog-quota",
        "POST",
        TOPIC,
        {"limitSize": -3},
        400,
        f"body: limitSize must be -1 (no limit) or 0..{LONG_MAX}, got -3",
    )
    policies = "producer_request_hold, producer_exception, consumer_backlog_eviction"
    for bad in ("drop", "PRODUCER_EXCEPTION", "producer_exception ", "", "x" * 2000):
        shown = repr(bad if len(bad) <= 40 else bad[:40])
        yield (
            "backlog-quota",
            "POST",
            TOPIC,
            {"policy": bad},
            400,
            f"body: policy must be one of {policies}, got {shown}",
        )
    yield "backlog-quota", "POST", TOPIC, {"policy": 1}, 400, "body: policy must be a string, got int"


ROWS = list(_rows())


def _send(pod: ServePod, verb: str, method: str, topic: str, body: object) -> tuple[int, Any]:
    url = policy_url(pod, verb, topic) if topic else f"{pod.admin_url()}/admin/v1/topics/{verb}"
    if isinstance(body, str):  # not JSON
        return _raw(url, body.encode())
    return http(method, url, body, TOKEN)


def _raw(url: str, data: bytes) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(ROWS)])
def test_hostile_input_gets_its_exact_answer(
    store: ServePod, row: tuple[str, str, str, object, int, str]
) -> None:
    verb, method, topic, body, status, error = row
    got_status, answer = _send(store, verb, method, topic, body)
    assert (got_status, answer) == (status, {"error": error})


def test_nothing_hostile_was_persisted(store: ServePod) -> None:
    for verb in VERBS:
        status, answer = http("GET", policy_url(store, verb, TOPIC))
        assert status == 200 and answer["override"] == {}, (verb, answer)
    path = store.data_dir / "store" / "topic-policies.json"
    assert not path.exists() or "never" not in path.read_text()


def test_a_valid_setting_is_answered_persisted_and_removed(store: ServePod) -> None:
    for verb in VERBS:
        status, answer = _send(store, verb, "POST", TOPIC, VALID[verb])
        assert status == 200 and answer["override"] == VALID[verb], answer
        assert answer["effective"] == {**answer["pod"], **VALID[verb]}
        status, answer = _send(store, verb, "DELETE", TOPIC, None)
        assert status == 200 and answer["override"] == {}, answer


def test_mutating_verbs_need_the_token(store: ServePod) -> None:
    for verb in VERBS:
        status, _ = http("POST", policy_url(store, verb, TOPIC), VALID[verb])
        assert status == 401
        status, _ = http("DELETE", policy_url(store, verb, TOPIC))
        assert status == 401


# --- the config file's section: serve exits 2 naming the key ---------------------------------------------

CONFIG_ROWS: list[tuple[object, str]] = [
    (
        {"retention": {"retentionTimeInMinutes": -2}},
        f"topicPolicies: retention: retentionTimeInMinutes must be -1 (infinite) or 0..{INT_MAX}, got -2",
    ),
    (
        {"retention": {"retentionTimeInMinutes": "\u0661"}},
        f"topicPolicies: retention: retentionTimeInMinutes='\u0661' {PLAIN_INT}",
    ),
    (
        {"messageTTL": {"messageTTLInSeconds": -1}},
        f"topicPolicies: messageTTL: messageTTLInSeconds must be 0 (no TTL) or 1..{INT_MAX}, got -1",
    ),
    (
        {"backlogQuota": {"policy": "drop"}},
        "topicPolicies: backlogQuota: policy must be one of producer_request_hold, producer_exception, "
        "consumer_backlog_eviction, got 'drop'",
    ),
    (
        {"backlogQuota": {"limitSize": 1.5}},
        "topicPolicies: backlogQuota: limitSize must be an integer that fits 64 bits, got 1.5",
    ),
    ({"checkIntervalSeconds": 0}, "topicPolicies: checkIntervalSeconds must be 1..3600, got 0"),
    ({"checkIntervalSeconds": "1e3"}, f"topicPolicies: checkIntervalSeconds='1e3' {PLAIN_INT}"),
    (
        {"retentions": {}},
        "topicPolicies: unknown key 'retentions'; known keys: backlogQuota, checkIntervalSeconds, "
        "messageTTL, retention",
    ),
    ({"retention": []}, "topicPolicies: retention must be an object of retention settings, got list"),
    ([], "section topicPolicies must be an object"),
    # the declared bounds (contract/settings/topic_policies.py) and the strict numbers, each way round
    ({"checkIntervalSeconds": 3601}, "topicPolicies: checkIntervalSeconds must be 1..3600, got 3601"),
    (
        {"checkIntervalSeconds": 1e308},
        "topicPolicies: checkIntervalSeconds must be an integer that fits 64 bits, got 1e+308",
    ),
    ({"checkIntervalSeconds": " 12 "}, f"topicPolicies: checkIntervalSeconds=' 12 ' {PLAIN_INT}"),
    ({"checkIntervalSeconds": "-0"}, "topicPolicies: checkIntervalSeconds='-0' is a negative zero; write 0"),
    (
        {"messageTTL": {"messageTTLInSeconds": True}},
        "topicPolicies: messageTTL: messageTTLInSeconds must be a number, got a boolean",
    ),
    (
        {"backlogQuota": {"limitSize": LONG_MAX + 1}},
        f"topicPolicies: backlogQuota: limitSize must be an integer that fits 64 bits, got {LONG_MAX + 1}",
    ),
    (
        {"retention": {"retentionTimeInMinute": 1}},
        "topicPolicies: retention: unknown retention setting 'retentionTimeInMinute'; known settings: "
        "retentionSizeInMB, retentionTimeInMinutes",
    ),
]


@pytest.mark.parametrize(("section", "error"), CONFIG_ROWS)
def test_a_bad_config_section_stops_serve(tmp_path: Path, section: object, error: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"topicPolicies": section}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "serve",
            "--role",
            "store",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{config}: {error}" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("verb", "pairs", "expected"),
    [
        (
            "retention",
            ["retentionTimeInMinutes=60", "retentionSizeInMB=-1"],
            {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
        ),
        ("message-ttl", ["messageTTLInSeconds=3600"], {"messageTTLInSeconds": 3600}),
        (
            "backlog-quota",
            ["limitSize=1000", "policy=consumer_backlog_eviction"],
            {"limitSize": 1000, "policy": "consumer_backlog_eviction"},
        ),
    ],
)
def test_the_cli_verbs(store: ServePod, verb: str, pairs: list[str], expected: dict[str, Any]) -> None:
    base = ["--url", store.admin_url(), "--token-file", str(store.token_file), "topics", verb]
    done = _cli(*base, "set", TOPIC, *pairs)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["override"] == expected
    got = _cli("--url", store.admin_url(), "topics", verb, "get", TOPIC)
    assert got.returncode == 0 and json.loads(got.stdout)["effective"] == expected, got.stderr
    bad = _cli(*base, "set", TOPIC, f"{next(iter(expected))}=\u0661")
    assert bad.returncode == 1 and "HTTP 400" in bad.stderr and PLAIN_INT in bad.stderr, bad.stderr
    malformed = _cli(*base, "set", TOPIC, "no-equals-sign")
    assert malformed.returncode == 2 and "is not KEY=VALUE" in malformed.stderr
    removed = _cli(*base, "remove", TOPIC)
    assert removed.returncode == 0 and json.loads(removed.stdout)["override"] == {}, removed.stderr
    gone = _cli(*base, "remove", TOPIC)
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr and f"has no {verb} override" in gone.stderr
