"""Event numbers and sequence ids beyond int64 against a real store process (issue 25 item 5): refused
with BAD_REQUEST before anything is stored or remembered, and such state left by an older release
neither disables a name nor surfaces as an internal error ("ValueError: Value out of range")."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest
from runtime_pods import ServePod
from srk_wire import SrkWire

from txnkeeper.client import Client
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import encode_events

pytestmark = pytest.mark.timeout(240)

TOPIC = "persistent://t/ns/numbers"
RELEASE = "3.0.0"


def _store(pods: Callable[..., ServePod]) -> ServePod:
    return pods("pas-0", "store", release=RELEASE, extra=["--srk-enabled", "true"])


async def test_sequence_ids_and_event_numbers_beyond_int64_are_refused_before_anything_is_stored(
    pods: Callable[..., ServePod],
) -> None:
    pod = _store(pods)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup_producer(TOPIC, "p") == -1
    for sequence_id in (2**63, 2**64 - 1):
        with pytest.raises(ServiceError) as out_of_range:
            await wire.produce(TOPIC, b"too-far", "p", sequence_id)
        assert out_of_range.value.code == api.BAD_REQUEST, out_of_range.value
        assert "2^63 - 1" in str(out_of_range.value)
    # Nothing was stored or remembered: the name still starts from scratch and its next send is written.
    assert await wire.setup_producer(TOPIC, "p", resume=True) == -1
    receipt = await wire.produce(TOPIC, b"first", "p", 0)
    assert not receipt.duplicate

    assert await wire.setup(TOPIC, "w") == -1
    block = encode_events([b"a", b"b"])
    wire.send_chunks("w", block.data, 1024)
    with pytest.raises(ServiceError) as beyond:
        await wire.end("w", 2**63 - 1, 2, block.total_bytes, crc=block.crc)
    assert beyond.value.code == api.BAD_REQUEST and "2^63 - 1" in str(beyond.value), beyond.value
    assert await wire.setup(TOPIC, "w") == -1
    assert not (await wire.append("w", 0, [b"a"])).duplicate
    wire.close()
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        consumer = await client.subscribe(TOPIC, "audit")
        got = [(await consumer.receive(timeout=30)).data for _ in range(2)]
    assert got == [b"first", b"a"]


# Run as a child process against a stopped pod's data: what an older release that accepted
# sequence_id 2^63 left behind, in the ledger (a record after the snapshot) and in the snapshot.
_OLD_STATE = """
import asyncio, sys
from pathlib import Path
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.topic import snapshot as snapshots
from txnkeeper.topic.records import encode_data

async def main() -> None:
    data, topic = Path(sys.argv[1]), sys.argv[2]
    factory = ManagedLedgerFactory(data / "ledgers")
    ledger = await factory.open(topic)
    await ledger.add_entry(encode_data(b"old-build", "", None, 0, producer_name="legacy", sequence_id=2**63))
    await factory.close()
    path = snapshots.snapshot_path(data / "store" / "txnbuffer-snapshots", topic)
    old = snapshots.read(path, topic)
    assert old is not None, path
    rows = [*old.writers, ("legacy-snapshot", 2**63 + 5, 2**63 + 5, -1, -1, 0)]
    snapshots.write(path, snapshots.BufferSnapshot(old.topic, old.covers, old.ended, old.open, rows))

asyncio.run(main())
"""


async def test_out_of_range_state_from_an_older_release_is_reported_and_does_not_disable_the_name(
    pods: Callable[..., ServePod],
) -> None:
    pod = _store(pods)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup_producer(TOPIC, "legacy") == -1
    await wire.produce(TOPIC, b"in-range", "legacy", 3)
    wire.close()
    pod.stop()  # graceful: the snapshot is written
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _OLD_STATE, str(pod.data_dir), TOPIC)
    assert await asyncio.wait_for(child.wait(), 60) == 0
    pod.start()
    wire = await SrkWire.open(pod.listen)
    # The names still work: their state is the last in-range sequence id (none for the snapshot's).
    assert await wire.setup_producer(TOPIC, "legacy", resume=True) == 3
    assert not (await wire.produce(TOPIC, b"next", "legacy", 4)).duplicate
    assert await wire.setup_producer(TOPIC, "legacy-snapshot", "instance-2") == -1
    assert not (await wire.produce(TOPIC, b"again", "legacy-snapshot", 0)).duplicate
    wire.close()
    log = pod.log()
    assert "Value out of range" not in log
    assert "'legacy'" in log and "9223372036854775808" in log  # named, with the value and the rule
    assert "'legacy-snapshot'" in log and "9223372036854775813" in log
