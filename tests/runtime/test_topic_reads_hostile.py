"""The bulk-read verbs (``GET /admin/v1/topics/read-state`` and ``/entries``, what the Spark data source
asks a store pod) answer every bad query with a 400 or 404 saying what was wrong, bound every answer,
and serve exactly the stored entries of a range.

A real ``txnkeeper serve`` store pod over a socket, a topic written through the client.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request

import pytest
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.admin.app import ENTRIES_MAX
from txnkeeper.client import Client
from txnkeeper.contract import entry_frames
from txnkeeper.topic.records import decode

TOPIC = "persistent://public/default/read-me"
COUNT = 40
PAYLOAD = 1000


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_content_type(), exc.read()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> object:
    workdir = tmp_path_factory.mktemp("reads")
    tc = ServePod(workdir, "tc-0", "coordinator").start()
    pod = ServePod(workdir, "pas-0", "store").start()

    async def produce() -> None:
        async with Client(coordinators=[tc.listen], stores=[pod.listen]) as client:
            producer = await client.create_producer(TOPIC)
            for i in range(COUNT):
                await producer.send(f"{i:04d}".encode().ljust(PAYLOAD, b"."))

    asyncio.run(produce())
    yield pod
    pod.stop()
    tc.stop()


def _entries_url(pod: ServePod, **query: object) -> str:
    return f"{pod.admin_url()}/admin/v1/topics/entries?" + urllib.parse.urlencode(query)


def _ledger(pod: ServePod) -> int:
    status, doc = http(
        "GET", f"{pod.admin_url()}/admin/v1/topics/read-state?topic={urllib.parse.quote(TOPIC)}"
    )
    assert status == 200, doc
    (ledger,) = [item for item in doc["ledgers"] if item["entries"]]
    assert ledger["entries"] == COUNT and ledger["tierOnly"] is False
    assert doc["maxReadPosition"] == f"{ledger['ledgerId']}:{COUNT - 1}" and doc["abortedTxns"] == []
    return int(ledger["ledgerId"])


def test_a_range_is_served_exactly_and_bounded(store: ServePod) -> None:
    ledger = _ledger(store)
    status, ctype, body = _get(_entries_url(store, topic=TOPIC, ledger=ledger, entry=5, maxEntries=7))
    assert status == 200 and ctype == entry_frames.CONTENT_TYPE
    got = entry_frames.decode(body)
    assert (got.ledger_id, got.first_entry_id, got.durable_entries) == (ledger, 5, COUNT)
    assert [decode(d, TOPIC, i).payload[:4] for i, d in enumerate(got.entries)] == [
        f"{i:04d}".encode() for i in range(5, 12)
    ]
    # The byte bound cuts between entries (at least one is always served).
    status, _, body = _get(_entries_url(store, topic=TOPIC, ledger=ledger, entry=0, maxBytes=2500))
    assert status == 200 and len(entry_frames.decode(body).entries) == 2
    status, _, body = _get(_entries_url(store, topic=TOPIC, ledger=ledger, entry=0, maxBytes=1))
    assert status == 200 and len(entry_frames.decode(body).entries) == 1
    # At and past the durable end: nothing, with the ledger's length to stop at.
    status, _, body = _get(_entries_url(store, topic=TOPIC, ledger=ledger, entry=COUNT))
    got = entry_frames.decode(body)
    assert status == 200 and got.entries == [] and got.durable_entries == COUNT


# (query, status, a fragment the error must contain)
HOSTILE_QUERIES: list[tuple[str, int, str]] = [
    ("", 400, "'topic' is required"),
    (f"topic={TOPIC}", 400, "'ledger' is required"),
    (f"topic={TOPIC}&ledger=1", 400, "'entry' is required"),
    (f"topic={TOPIC}&ledger=-1&entry=0", 400, "'ledger' must be an integer in 0..9223372036854775807"),
    (f"topic={TOPIC}&ledger=%D9%A1&entry=0", 400, "'ledger' must be an integer"),  # Arabic-Indic one
    (f"topic={TOPIC}&ledger=+1&entry=0", 400, "'ledger' must be an integer"),
    (f"topic={TOPIC}&ledger=1_0&entry=0", 400, "'ledger' must be an integer"),
    (f"topic={TOPIC}&ledger=99999999999999999999&entry=0", 400, "'ledger' must be an integer"),
    (f"topic={TOPIC}&ledger=1&entry=0x1", 400, "'entry' must be an integer"),
    (f"topic={TOPIC}&ledger=1&entry=0&maxEntries=0", 400, "'maxEntries' must be an integer in 1..10000"),
    (f"topic={TOPIC}&ledger=1&entry=0&maxEntries={ENTRIES_MAX[0] + 1}", 400, "'maxEntries' must be"),
    (f"topic={TOPIC}&ledger=1&entry=0&maxBytes={ENTRIES_MAX[1] + 1}", 400, "'maxBytes' must be"),
    (f"topic={TOPIC}&ledger=1&entry=0&ledger=2", 400, "'ledger' is given more than once"),
    (f"topic={TOPIC}&ledger=1&entry=0&evil=1", 400, "unknown query parameter 'evil'"),
    ("topic=%FF&ledger=1&entry=0", 400, "not UTF-8"),
    ("&".join(f"k{i}=1" for i in range(40)), 400, "too many parameters"),
    ("topic=persistent://public/default/never&ledger=1&entry=0", 404, "is not on this pod"),
    ("topic=../../etc/passwd&ledger=1&entry=0", 404, "is not on this pod"),
    ("topic=a%00b&ledger=1&entry=0", 404, "no topic of this pod has such a name"),
    (f"topic={TOPIC}&ledger=999&entry=0", 404, "ledger 999 of topic"),
]


@pytest.mark.parametrize(("query", "status", "fragment"), HOSTILE_QUERIES)
def test_hostile_entry_queries_get_clear_errors(
    store: ServePod, query: str, status: int, fragment: str
) -> None:
    got, ctype, body = _get(f"{store.admin_url()}/admin/v1/topics/entries?{query}")
    assert (got, ctype) == (status, "application/json"), body[:300]
    assert fragment in body.decode(), body[:300]


@pytest.mark.parametrize(
    ("query", "status", "fragment"),
    [
        ("", 400, "'topic' is required"),
        ("topic=persistent://public/default/never", 404, "is not on this pod"),
        ("topic=%FF", 400, "not UTF-8"),
    ],
)
def test_hostile_read_state_queries_get_clear_errors(
    store: ServePod, query: str, status: int, fragment: str
) -> None:
    got, _, body = _get(f"{store.admin_url()}/admin/v1/topics/read-state?{query}")
    assert got == status and fragment in body.decode(), body[:300]


def test_the_verbs_are_read_only(store: ServePod) -> None:
    name = "persistent://public/default/created-by-a-read"
    status, _, body = _get(_entries_url(store, topic=name, ledger=0, entry=0))
    assert status == 404, body
    # Asking about a topic the pod does not hold created nothing.
    assert not list((store.data_dir / "ledgers").glob("*created-by-a-read*"))
    status, doc = http("POST", _entries_url(store, topic=TOPIC, ledger=0, entry=0), {}, TOKEN)
    assert status == 405 and "GET" in doc["error"], doc
