"""Apache Pulsar's own Python client (the ``pulsar-client`` wheel, the C++ client inside), unmodified,
against a real store pod (issue 26): produce and consume with and without batching, subscription
types, initial positions, negative acks, and messages crossing between Pulsar's protocol and
txnkeeper's own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pulsar
import pytest
from pulsar_wire import RawPulsar, T, command
from runtime_pods import ServePod

from txnkeeper.client import Client as OwnClient
from txnkeeper.pb import PulsarApi_pb2 as pulsar_api


@pytest.fixture
def store(pods: Callable[..., ServePod]) -> ServePod:
    return pods("pas-0", "store")


@pytest.fixture
def client(store: ServePod) -> Iterator[pulsar.Client]:
    pulsar_client = pulsar.Client(f"pulsar://{store.listen}", operation_timeout_seconds=15)
    yield pulsar_client
    pulsar_client.close()


def _drain(consumer: pulsar.Consumer, count: int, *, ack: bool = True) -> list[pulsar.Message]:
    received = []
    for _ in range(count):
        message = consumer.receive(timeout_millis=10_000)
        received.append(message)
        if ack:
            consumer.acknowledge(message)
    return received


def _nothing_more(consumer: pulsar.Consumer, wait_ms: int = 500) -> bool:
    try:
        consumer.receive(timeout_millis=wait_ms)
    except pulsar.Timeout:
        return True
    return False


def test_unbatched_messages_keep_payload_key_properties_and_event_time(client: pulsar.Client) -> None:
    topic = "persistent://public/default/plain"
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [
        producer.send(
            f"m{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i}", event_timestamp=1000 + i
        )
        for i in range(20)
    ]
    received = _drain(consumer, 20)
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(20)]
    assert [m.properties() for m in received] == [{"i": str(i)} for i in range(20)]
    assert [m.partition_key() for m in received] == [f"k{i}" for i in range(20)]
    assert [m.event_timestamp() for m in received] == [1000 + i for i in range(20)]
    assert [str(m.message_id()) for m in received] == [str(s) for s in sent]
    assert all(m.publish_timestamp() > 0 for m in received)
    assert _nothing_more(consumer)


def test_batched_messages_arrive_each_once_in_order(client: pulsar.Client) -> None:
    topic = "persistent://public/default/batched"
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=20
    )
    receipts: list[pulsar.MessageId] = []
    for i in range(95):
        producer.send_async(f"b{i}".encode(), lambda result, message_id: receipts.append(message_id))
    producer.flush()
    received = _drain(consumer, 95)
    assert [m.data() for m in received] == [f"b{i}".encode() for i in range(95)]
    batch_indexes = {m.message_id().batch_index() for m in received}
    assert max(batch_indexes) > 0, "the producer batched, so messages share entries"
    assert len(receipts) == 95
    assert _nothing_more(consumer)


def test_batch_index_acks_survive_reconnects_and_acked_messages_never_come_back(
    client: pulsar.Client, store: ServePod
) -> None:
    """A consumer with batch-index acks on acknowledges some messages of each batch; after it leaves
    (and after a store restart) a new consumer gets exactly the others: the store kept the indexes
    left (the cursor's ack sets) and said so in each MESSAGE (Pulsar's ack set), which the client
    obeys by skipping the acknowledged ones."""
    topic = "persistent://public/default/batch-index"
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
    )
    consumer = client.subscribe(
        topic, "s", initial_position=pulsar.InitialPosition.Earliest, batch_index_ack_enabled=True
    )
    for i in range(40):
        producer.send_async(f"i{i}".encode(), None)
    producer.flush()
    received = _drain(consumer, 40, ack=False)
    assert max(m.message_id().batch_index() for m in received) > 0, "the producer batched"
    for message in received:
        if int(message.data()[1:]) % 3 == 0:
            consumer.acknowledge(message)
    left = sorted(f"i{i}" for i in range(40) if i % 3)
    consumer.close()  # flushes the grouped acks
    again = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert sorted(m.data().decode() for m in _drain(again, len(left), ack=False)) == left
    assert _nothing_more(again)
    again.close()
    store.restart()
    last = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert sorted(m.data().decode() for m in _drain(last, len(left))) == left
    assert _nothing_more(last)


def test_unsubscribe_deletes_the_subscription_and_a_new_one_starts_afresh(
    client: pulsar.Client, store: ServePod
) -> None:
    topic = "persistent://public/default/unsubscribed"
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(5):
        producer.send(f"u{i}".encode())
    _drain(consumer, 3)
    shared = client.subscribe(topic, "shared-one", consumer_type=pulsar.ConsumerType.Shared)
    second = client.subscribe(topic, "shared-one", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.PulsarException):
        shared.unsubscribe()  # another consumer is attached
    second.close()
    shared.unsubscribe()
    consumer.unsubscribe()
    store.restart()  # the registry no longer lists them: the pod starts without them
    again = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in _drain(again, 5)] == [f"u{i}".encode() for i in range(5)]
    assert _nothing_more(again)
    pending_ack_logs = [p for p in (store.data_dir / "ledgers").iterdir() if "shared-one" in p.name]
    assert pending_ack_logs == [], pending_ack_logs


def test_seek_by_message_id_by_time_and_to_the_start_delivers_again(client: pulsar.Client) -> None:
    """Pulsar's seek resets the subscription: what follows the point is delivered again, acknowledged
    or not (the server closes the consumer, the client subscribes again from there)."""
    topic = "persistent://public/default/seek"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"s{i}".encode()) for i in range(10)]
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    first = _drain(consumer, 10)
    assert _nothing_more(consumer)
    consumer.seek(ids[3])
    # The server delivers from s3 on, as Pulsar's broker (its read position is the message sought);
    # the client drops that one message itself (start-message-id-inclusive is off by default).
    assert [m.data() for m in _drain(consumer, 6)] == [f"s{i}".encode() for i in range(4, 10)]
    assert _nothing_more(consumer)
    at = first[6].publish_timestamp()
    later = [m.data() for m in first if m.publish_timestamp() >= at]
    consumer.seek(at)
    assert [m.data() for m in _drain(consumer, len(later))] == later
    assert _nothing_more(consumer)
    consumer.seek(pulsar.MessageId.earliest)
    assert [m.data() for m in _drain(consumer, 10)] == [f"s{i}".encode() for i in range(10)]
    assert _nothing_more(consumer)


def test_an_exclusive_subscription_refuses_a_second_consumer(client: pulsar.Client) -> None:
    topic = "persistent://public/default/exclusive"
    first = client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Shared)
    first.close()
    client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Exclusive).close()


def test_shared_consumers_split_the_messages_and_a_closed_ones_go_to_the_other(client: pulsar.Client) -> None:
    topic = "persistent://public/default/shared"
    one = client.subscribe(
        topic,
        "work",
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=5,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    two = client.subscribe(
        topic,
        "work",
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=5,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(f"w{i}".encode())
    from_one = [m.data() for m in _drain(one, 10)]
    one.close()  # with messages still out to it, unacknowledged: they go to the other consumer
    from_two = [m.data() for m in _drain(two, 30)]
    assert sorted(from_one + from_two) == sorted(f"w{i}".encode() for i in range(40))
    assert _nothing_more(two)


def test_a_negative_ack_redelivers_the_message(client: pulsar.Client) -> None:
    topic = "persistent://public/default/nack"
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"retry me")
    first = consumer.receive(timeout_millis=10_000)
    consumer.negative_acknowledge(first)
    again = consumer.receive(timeout_millis=10_000)
    assert again.data() == b"retry me" and str(again.message_id()) == str(first.message_id())
    assert again.redelivery_count() == 1
    consumer.acknowledge(again)
    assert _nothing_more(consumer)


def test_initial_position_latest_skips_what_was_written_before(client: pulsar.Client) -> None:
    topic = "persistent://public/default/latest"
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    latest = client.subscribe(topic, "latest", initial_position=pulsar.InitialPosition.Latest)
    earliest = client.subscribe(topic, "earliest", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"after")
    assert [m.data() for m in _drain(latest, 1)] == [b"after"]
    assert [m.data() for m in _drain(earliest, 2)] == [b"before", b"after"]
    assert _nothing_more(latest)


def test_messages_cross_between_pulsars_protocol_and_txnkeepers_own(
    client: pulsar.Client, store: ServePod
) -> None:
    topic = "persistent://public/default/crossing"
    pulsar_consumer = client.subscribe(topic, "pulsar-side", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic, batching_enabled=False).send(b"from pulsar", partition_key="pk")

    async def own_side() -> tuple[bytes, str]:
        own = OwnClient(coordinators=[], stores=[store.listen])
        try:
            producer = await own.create_producer(topic)
            await producer.send(b"from txnkeeper", key="own-key")
            consumer = await own.subscribe(topic, "own-side")
            message = await consumer.receive(10)
            return message.data, message.key
        finally:
            await own.close()

    assert asyncio.run(own_side()) == (b"from pulsar", "pk")
    received = _drain(pulsar_consumer, 2)
    assert [m.data() for m in received] == [b"from pulsar", b"from txnkeeper"]
    assert received[1].partition_key() == "own-key"


def test_key_shared_keeps_each_key_on_one_consumer_in_order(client: pulsar.Client) -> None:
    topic = "persistent://public/default/key-shared"
    options = {
        "consumer_type": pulsar.ConsumerType.KeyShared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "receiver_queue_size": 10,
    }
    one = client.subscribe(topic, "ks", **options)
    two = client.subscribe(topic, "ks", **options)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(60):
        producer.send(f"{i % 6}:{i}".encode(), partition_key=f"key-{i % 6}")
    by_consumer: dict[str, list[str]] = {"one": [], "two": []}
    for _ in range(60):
        for name, consumer in (("one", one), ("two", two)):
            try:
                message = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            by_consumer[name].append(message.data().decode())
            consumer.acknowledge(message)
    got = by_consumer["one"] + by_consumer["two"]
    assert sorted(got) == sorted(f"{i % 6}:{i}" for i in range(60))
    keys_one = {m.split(":")[0] for m in by_consumer["one"]}
    keys_two = {m.split(":")[0] for m in by_consumer["two"]}
    assert not keys_one & keys_two, "a key went to both consumers"
    for messages in by_consumer.values():
        for key in {m.split(":")[0] for m in messages}:
            order = [int(m.split(":")[1]) for m in messages if m.startswith(f"{key}:")]
            assert order == sorted(order), f"key {key} out of order: {order}"


def test_failover_delivers_to_one_consumer_and_the_next_takes_over(client: pulsar.Client) -> None:
    topic = "persistent://public/default/failover"
    first = client.subscribe(
        topic,
        "fo",
        consumer_type=pulsar.ConsumerType.Failover,
        consumer_name="a",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    second = client.subscribe(
        topic,
        "fo",
        consumer_type=pulsar.ConsumerType.Failover,
        consumer_name="b",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"f{i}".encode())
    got_first = _drain(first, 6)
    got_first += _drain(first, 2, ack=False)  # received, never acknowledged
    assert _nothing_more(second), "the standby consumer got a message while the first was active"
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Shared)
    first.close()
    rest = [m.data() for m in _drain(second, 4)]
    assert rest == [b"f6", b"f7", b"f8", b"f9"]
    assert [m.data() for m in got_first] == [f"f{i}".encode() for i in range(8)]


def test_a_partitioned_topic_spreads_over_its_partitions(pods: Callable[..., ServePod]) -> None:
    topic = "persistent://public/default/parts"
    store = pods("pas-1", "store", config={"pulsar": {"partitionedTopics": {topic: 3}}})
    partitioned = pulsar.Client(f"pulsar://{store.listen}", operation_timeout_seconds=15)
    try:
        consumer = partitioned.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        producer = partitioned.create_producer(topic, batching_enabled=False)
        for i in range(30):
            producer.send(f"p{i}".encode(), partition_key=f"key-{i}")
        received = _drain(consumer, 30)
        assert sorted(m.data() for m in received) == sorted(f"p{i}".encode() for i in range(30))
        partitions = {m.topic_name() for m in received}
        assert partitions <= {f"{topic}-partition-{i}" for i in range(3)} and len(partitions) >= 2, partitions
        # The base name is not a topic of its own: a producer on it is refused (Pulsar's clients
        # never open one; a raw frame does).
        raw = RawPulsar(store.listen)
        raw.handshake()
        cmd = command(T.PRODUCER)
        cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = topic, 1, 1
        raw.send(cmd)
        error = raw.expect(T.ERROR).error
        assert error.error == pulsar_api.NotAllowedError and "partitioned topic" in error.message, error
    finally:
        partitioned.close()


def test_the_largest_message_the_server_announces_goes_through(client: pulsar.Client) -> None:
    topic = "persistent://public/default/large"
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    largest = 5 * 1024 * 1024 - 10 * 1024 - 4096  # under max_message_size with room for the metadata
    producer.send(b"x" * largest)
    assert len(consumer.receive(timeout_millis=20_000).data()) == largest
    # Just under 5 MiB would not fit a 5 MiB frame with its framing: the announced size keeps the
    # client from sending it (else the server would have to close the connection on it).
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (5 * 1024 * 1024 - 100))


def test_key_shared_keeps_key_order_when_a_consumer_leaves_with_messages_out(client: pulsar.Client) -> None:
    topic = "persistent://public/default/key-shared-leave"
    options = {
        "consumer_type": pulsar.ConsumerType.KeyShared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "receiver_queue_size": 5,
    }
    leaving = client.subscribe(topic, "ks", **options)
    staying = client.subscribe(topic, "ks", **options)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(f"{i % 4}:{i}".encode(), partition_key=f"key-{i % 4}")
    held = []
    for _ in range(3):  # received by the leaving consumer and never acknowledged
        try:
            held.append(leaving.receive(timeout_millis=2000).data().decode())
        except pulsar.Timeout:
            break
    leaving.close()
    got: list[str] = []
    while True:
        try:
            message = staying.receive(timeout_millis=1500)
        except pulsar.Timeout:
            break
        got.append(message.data().decode())
        staying.acknowledge(message)
    assert sorted(set(got)) == sorted(f"{i % 4}:{i}" for i in range(40)), (held, got)
    for key in range(4):
        order = [int(m.split(":")[1]) for m in got if m.startswith(f"{key}:")]
        first_seen = list(dict.fromkeys(order))
        assert first_seen == sorted(first_seen), f"key {key} out of order: {order}"


def test_readers_start_where_asked_and_leave_nothing_behind(client: pulsar.Client, store: ServePod) -> None:
    topic = "persistent://public/default/readers"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"r{i}".encode()) for i in range(10)]
    earliest = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while earliest.has_message_available():
        got.append(earliest.read_next(timeout_millis=10_000).data())
    assert got == [f"r{i}".encode() for i in range(10)]
    from_fourth = client.create_reader(topic, ids[3])
    assert from_fourth.read_next(timeout_millis=10_000).data() == b"r4"  # what comes after the id
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    producer.send(b"new")
    assert latest.read_next(timeout_millis=10_000).data() == b"new"
    for reader in (earliest, from_fourth, latest):
        reader.close()
    # Nothing persisted: the topic has no cursor (its only readers were non-durable).
    cursors = [p for p in (store.data_dir / "ledgers").rglob("*") if p.parent.name == "cursors"]
    assert cursors == []


def test_a_named_producer_is_deduplicated_across_sessions_and_restarts(pods: Callable[..., ServePod]) -> None:
    """With idempotent producers on (Pulsar's broker deduplication), a producer's name carries its last
    sequence id into every new session, and a send it already made is not written twice."""
    store = pods("pas-0", "store", extra=["--srk-enabled", "true", "--release", "3.0.0"])
    topic = "persistent://public/default/dedup"
    client = pulsar.Client(f"pulsar://{store.listen}", operation_timeout_seconds=15)
    try:
        consumer = client.subscribe(topic, "audit", initial_position=pulsar.InitialPosition.Earliest)
        first = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert first.last_sequence_id() == -1
        for i in range(5):
            first.send(f"m{i}".encode())
        first.close()
        second = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert second.last_sequence_id() == 4  # PRODUCER_SUCCESS carried the name's last sequence id
        second.send(b"m2 again", sequence_id=2)  # a retransmission: answered, not written
        second.send(b"m5")  # numbered after the last one: 5
        batched = client.create_producer(topic, producer_name="batch-app", batching_max_publish_delay_ms=50)
        for i in range(10):
            batched.send_async(f"b{i}".encode(), None)
        batched.flush()
        assert batched.last_sequence_id() == 9
        received = [m.data() for m in _drain(consumer, 16)]
        assert received[:6] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
        assert sorted(received[6:]) == sorted(f"b{i}".encode() for i in range(10))
        assert _nothing_more(consumer)
    finally:
        client.close()
    store.restart()
    client = pulsar.Client(f"pulsar://{store.listen}", operation_timeout_seconds=15)
    try:
        after = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert after.last_sequence_id() == 5  # durable: the writer table survived the restart
        again = client.create_producer(topic, producer_name="batch-app")
        assert again.last_sequence_id() == 9  # a batch counts by its highest sequence id
        again.send(b"b3 again", sequence_id=3)
        consumer = client.subscribe(topic, "audit")
        assert _nothing_more(consumer, 1000)
    finally:
        client.close()


@pytest.mark.parametrize(
    "compression",
    [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib, pulsar.CompressionType.ZSTD,
     pulsar.CompressionType.SNAPPY],
    ids=["lz4", "zlib", "zstd", "snappy"],
)  # fmt: skip
def test_compressed_messages_read_back_by_the_spark_source_rows(
    client: pulsar.Client, store: ServePod, compression: pulsar.CompressionType
) -> None:
    """The broker stores compressed payloads as the producer sent them (Pulsar's too); the data source
    is a consumer and must undo each codec, batched and not, exactly as the Pulsar client compressed."""
    from txnkeeper.spark import store_http
    from txnkeeper.spark.rows import Visibility, entry_rows

    topic = f"persistent://public/default/compressed-{compression}"
    # Compressible payloads, so every codec really shrinks them (a codec may store incompressible
    # data as-is, which would test nothing).
    sent = [(f"k{i}", f"message {i} ".encode() * (20 + i)) for i in range(12)]
    single = client.create_producer(topic, compression_type=compression, batching_enabled=False)
    for key, payload in sent[:4]:
        single.send(payload, partition_key=key, properties={"n": key})
    batched = client.create_producer(
        topic, compression_type=compression, batching_enabled=True, batching_max_publish_delay_ms=50
    )
    for key, payload in sent[4:]:
        batched.send_async(payload, None, partition_key=key, properties={"n": key})
    batched.flush()

    state = store_http.read_state(store.admin_url(), topic, 30)
    vis = Visibility(frozenset(), frozenset())
    rows: list[tuple[object, ...]] = []
    stored_sizes: list[int] = []
    for ledger in state["ledgers"]:
        found = store_http.read_entries(
            store.admin_url(), topic, (ledger["ledgerId"], 0), (ledger["entries"], 16 << 20), 30
        )
        for offset, data in enumerate(found.entries):
            stored_sizes.append(len(data))
            rows.extend(entry_rows(topic, ledger["ledgerId"], offset, data, vis))
    # columns: topic, partition, ledgerId, entryId, batchIndex, publishTime, producer, key, properties,
    # payload, ...
    assert [(row[7], row[9]) for row in rows] == sent
    assert [row[8] for row in rows] == [{"n": key} for key, _ in sent]
    batch_indexes = [row[4] for row in rows]
    assert batch_indexes[:4] == [-1] * 4 and all(isinstance(i, int) and i >= 0 for i in batch_indexes[4:])
    assert sum(stored_sizes) < sum(len(p) for _, p in sent)  # stored compressed, not re-encoded
