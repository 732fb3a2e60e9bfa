"""The data source's pure parts: entries to rows (Pulsar batches split, markers and aborted messages
dropped, compressed batches refused) and the plan (pod-held ledgers, tier segments spanning ledgers,
a range no segment holds refused)."""

from __future__ import annotations

import re
import struct
import zlib
from datetime import UTC, datetime

import pytest

from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.spark.plan import PodPart, ReadOptionError, TierPart, TopicView, parse_options, plan_topic
from txnkeeper.spark.rows import TopicDataError, Visibility, entry_rows, partition_index
from txnkeeper.topic.records import encode_data, encode_marker
from txnkeeper.txnid import TxnID

TOPIC = "persistent://public/default/t-partition-3"
ABORTED, OPEN, COMMITTED = TxnID(1, 1), TxnID(1, 2), TxnID(1, 3)
VIS = Visibility(frozenset({ABORTED}), frozenset({OPEN}))


def _batch(
    messages: list[tuple[str, bytes, dict[str, str]]],
    compression: pulsar.CompressionType.ValueType = pulsar.NONE,
) -> bytes:
    meta = pulsar.MessageMetadata(producer_name="java-app", sequence_id=7, publish_time=1_700_000_000_123)
    meta.num_messages_in_batch = len(messages)
    meta.compression = compression
    payload = b""
    for key, data, props in messages:
        single = pulsar.SingleMessageMetadata(payload_size=len(data), partition_key=key)
        single.properties.extend(pulsar.KeyValue(key=k, value=v) for k, v in props.items())
        raw = single.SerializeToString()
        payload += struct.pack(">I", len(raw)) + raw + data
    return encode_data(payload, "", None, 1_700_000_000_999, metadata=meta.SerializeToString())


def test_a_pulsar_batch_is_split_with_batch_indexes_keys_and_properties() -> None:
    entry = _batch([("a", b"one", {"x": "1"}), ("b", b"two", {}), ("", b"three", {"y": "2"})])
    rows = list(entry_rows(TOPIC, 5, 9, entry, VIS))
    assert [(r[1], r[2], r[3], r[4], r[6], r[7], r[8], r[9]) for r in rows] == [
        (3, 5, 9, 0, "java-app", "a", {"x": "1"}, b"one"),
        (3, 5, 9, 1, "java-app", "b", {}, b"two"),
        (3, 5, 9, 2, "java-app", None, {"y": "2"}, b"three"),
    ]
    # Pulsar's publish time, as its consumers see it.
    assert {r[5] for r in rows} == {datetime.fromtimestamp(1_700_000_000.123, UTC)}


def _compressed(codec: pulsar.CompressionType.ValueType, payload: bytes, declared: int) -> bytes:
    meta = pulsar.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    meta.compression = codec
    meta.uncompressed_size = declared
    return encode_data(payload, "", None, 1, metadata=meta.SerializeToString())


@pytest.mark.parametrize(
    ("codec", "payload", "declared", "problem"),
    [
        (pulsar.ZLIB, zlib.compress(b"hello"), 4, "decompresses to 4 bytes or more, not the 4"),
        (pulsar.ZLIB, zlib.compress(b"hello"), 6, "decompresses to 5 bytes, not the 6"),
        (pulsar.ZLIB, zlib.compress(b"hello") + b"junk", 5, "or more"),
        (pulsar.ZLIB, b"not zlib", 5, "ZLIB payload does not decompress"),
        (pulsar.LZ4, b"\xff\xff\xff\xff", 5, "LZ4 payload does not decompress"),
        (pulsar.ZSTD, b"garbage!", 5, "ZSTD payload does not decompress"),
        (pulsar.SNAPPY, b"\xff\xff\xff\xff\x0f", 5, "SNAPPY payload does not decompress"),
        (pulsar.ZLIB, zlib.compress(b"x"), 1 << 30, "declares 1073741824 uncompressed bytes"),
    ],
)
def test_damaged_compressed_payloads_are_refused_naming_the_entry(
    codec: pulsar.CompressionType.ValueType, payload: bytes, declared: int, problem: str
) -> None:
    with pytest.raises(TopicDataError, match=re.escape(problem)) as refused:
        list(entry_rows(TOPIC, 5, 9, _compressed(codec, payload, declared), VIS))
    assert f"{TOPIC}@5:9" in str(refused.value)


def test_a_codec_newer_than_our_proto_is_refused_not_served_as_data() -> None:
    meta = pulsar.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    compression = pulsar.MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number
    raw = meta.SerializeToString() + bytes([compression << 3, 9])  # compression = 9 (varint)
    entry = encode_data(b"compressed?", "", None, 1, metadata=raw)
    with pytest.raises(TopicDataError, match="compression type 9, which this reader does not know"):
        list(entry_rows(TOPIC, 5, 9, entry, VIS))


def test_cut_batches_are_refused_not_guessed() -> None:
    meta = pulsar.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=2)
    single = pulsar.SingleMessageMetadata(payload_size=3).SerializeToString()
    cut = encode_data(
        struct.pack(">I", len(single)) + single + b"abc", "", None, 1, metadata=meta.SerializeToString()
    )
    with pytest.raises(TopicDataError, match="batch ends inside message 1 of 2"):
        list(entry_rows(TOPIC, 5, 9, cut, VIS))
    with pytest.raises(TopicDataError, match="not a partition record"):
        list(entry_rows(TOPIC, 5, 9, b"\xff\xff\xff", VIS))


def test_markers_aborted_and_open_messages() -> None:
    assert list(entry_rows(TOPIC, 1, 0, encode_marker(COMMITTED, True), VIS)) == []
    assert list(entry_rows(TOPIC, 1, 1, encode_data(b"x", "k", ABORTED, 5), VIS)) == []
    (row,) = entry_rows(TOPIC, 1, 2, encode_data(b"y", "k", COMMITTED, 5), VIS)
    assert (row[9], row[10], row[11]) == (b"y", "(1,3)", "committed")
    with pytest.raises(TopicDataError, match="open when the read was planned"):
        list(entry_rows(TOPIC, 1, 3, encode_data(b"z", "k", OPEN, 5), VIS))
    everything = Visibility(frozenset({ABORTED}), frozenset({OPEN}), committed_only=False)
    (row,) = entry_rows(TOPIC, 1, 1, encode_data(b"x", "k", ABORTED, 5), everything)
    assert row[11] == "aborted"
    assert partition_index("persistent://a/b/t") == -1 and partition_index(TOPIC) == 3


def _state(segments: list[tuple[str, str, str]]) -> dict[str, object]:
    return {
        "ledgers": [
            {"ledgerId": 1, "entries": 10, "tierOnly": True},
            {"ledgerId": 2, "entries": 10, "tierOnly": True},
            {"ledgerId": 3, "entries": 10, "tierOnly": False},
            {"ledgerId": 4, "entries": 0, "tierOnly": False},
        ],
        "segments": [{"uuid": u, "status": "Offloaded", "begin": b, "end": e} for u, b, e in segments],
    }


VIEW = TopicView(TOPIC, "http://pod", frozenset(), frozenset(), Position(3, 9), Position(3, 9))


def test_plan_one_part_per_segment_and_pod_ledger() -> None:
    state = _state([("s1", "1:0", "2:3"), ("s2", "2:4", "2:9")])
    parts = plan_topic(VIEW, state, Position(1, 5), Position(3, 6))
    assert parts == [
        TierPart(VIEW, "s1", ((1, 5, 9), (2, 0, 3))),
        TierPart(VIEW, "s2", ((2, 4, 9),)),
        PodPart(VIEW, 3, 0, 6),
    ]
    assert plan_topic(VIEW, state, Position(3, 7), Position(3, 6)) == []


def test_a_range_no_segment_holds_is_refused() -> None:
    with pytest.raises(ReadOptionError, match=r"entries 2:4\.\.9 of topic .* are in no Offloaded segment"):
        plan_topic(VIEW, _state([("s1", "1:0", "2:3")]), Position(-1, -1), Position(3, 9))


def test_option_errors_name_the_option() -> None:
    with pytest.raises(ReadOptionError, match="unknown option"):
        parse_options({"topic": "t", "adminUrl": "http://x", "startingOffsets": "earliest"})
    with pytest.raises(ReadOptionError, match="not an http"):
        parse_options({"topic": "t", "adminUrl": "ftp://x"})
    with pytest.raises(ReadOptionError, match=r"'maxEntriesPerRequest' must be an integer in 1\.\.10000"):
        parse_options({"topic": "t", "adminUrl": "http://x", "maxEntriesPerRequest": "0"})
    options = parse_options(
        {"topics": "a, b,a", "adminurl": "http://x", "startPublishTime": "2026-01-01T00:00:00Z"}
    )
    assert options.topics == ("a", "b") and options.min_publish_ms == 1_767_225_600_000
