"""Helpers for tests of topic policies (retention, message TTL, backlog quotas) against real pods.

Every wait is on a condition with a deadline: a policy check runs every ``checkIntervalSeconds`` (1 s
in these tests), and the counter ``txnkeeper_topic_policy_checks_total`` says how many have run, so a
test can wait for checks to have happened instead of sleeping.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from typing import Any

from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

# Every test pod checks its topics' policies each second (the default is 10 s).
FAST_CHECKS = {"checkIntervalSeconds": 1}


def store_config(**policies: Any) -> dict[str, Any]:
    """A store pod's config file with a ``topicPolicies`` section (checks every second)."""
    return {"topicPolicies": {**FAST_CHECKS, **policies}}


def policy_url(pod: ServePod, verb: str, topic: str) -> str:
    return f"{pod.admin_url()}/admin/v1/topics/{verb}?{urllib.parse.urlencode({'topic': topic})}"


def set_policy(pod: ServePod, verb: str, topic: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = http("POST", policy_url(pod, verb, topic), body, TOKEN)
    assert status == 200, (status, answer)
    assert isinstance(answer, dict)
    return answer


def get_policy(pod: ServePod, verb: str, topic: str) -> dict[str, Any]:
    status, answer = http("GET", policy_url(pod, verb, topic))
    assert status == 200, (status, answer)
    assert isinstance(answer, dict)
    return answer


def internal_stats(pod: ServePod, topic: str) -> dict[str, Any]:
    status, answer = http("GET", policy_url(pod, "internal-stats", topic))
    assert status == 200, (status, answer)
    stats = answer["managedLedgerInternalStats"]
    assert isinstance(stats, dict)
    return stats


def ledger_ids(pod: ServePod, topic: str) -> list[int]:
    return [int(ledger["ledgerId"]) for ledger in internal_stats(pod, topic)["ledgers"]]


def mark_delete(pod: ServePod, topic: str, subscription: str) -> tuple[int, int]:
    text = internal_stats(pod, topic)["cursors"][subscription]["markDeletePosition"]
    ledger, entry = text.split(":")
    return int(ledger), int(entry)


def metric(pod: ServePod, name: str, topic: str, **labels: str) -> float:
    """The value of sample ``name{topic=..., labels}`` (0 when the pod reports no such sample)."""
    status, text = http("GET", f"{pod.admin_url()}/metrics")
    assert status == 200
    wanted = {"topic": topic, **labels}
    for line in str(text).splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        if found == wanted:
            return float(match.group(3))
    return 0.0


def checks(pod: ServePod, topic: str) -> float:
    return metric(pod, "txnkeeper_topic_policy_checks_total", topic)


async def wait_for(predicate: Any, within: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate()`` (sync, run in a thread: it makes HTTP calls) until it is truthy."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        last = await asyncio.to_thread(predicate)
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


async def wait_for_checks(pod: ServePod, topic: str, count: int, within: float = 60.0) -> None:
    """Wait until ``count`` more policy checks of ``topic`` have run."""
    start = await asyncio.to_thread(checks, pod, topic)
    await wait_for(lambda: checks(pod, topic) >= start + count, within, f"{count} policy checks of {topic}")


async def fill(client: Client, topic: str, count: int, size: int, prefix: str = "m") -> list[Any]:
    """Send ``count`` messages of ``size`` bytes (``prefix-i`` then padding); their message ids."""
    producer = await client.create_producer(topic)
    sends = [producer.send(f"{prefix}-{i}".encode().ljust(size, b".")) for i in range(count)]
    return list(await asyncio.gather(*sends))
