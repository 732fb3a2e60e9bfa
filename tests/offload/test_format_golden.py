"""Golden vectors of Pulsar's PIP-76 streaming offload objects, written out by hand from Pulsar's Java.

Each vector follows one Java class of apache/pulsar ``tiered-storage/jcloud`` (read, not copied):

- block header: ``StreamingDataBlockHeaderImpl.toStream`` -- int magic 0x26A66D32, long header length
  (128), long block length, long first entry id, long ledger id, zeros to 128 bytes;
- entry framing: ``BufferedOffloadStream.read`` -- int entry length, long entry id, entry bytes;
- padding: ``BlockAwareSegmentInputStreamImpl.BLOCK_END_PADDING`` (0xFE 0xDC 0xDE 0xAD, restarting at
  the first padding byte) up to the length from ``BufferedOffloadStream.calculateBlockSize``;
- index: ``OffloadIndexBlockV2Impl.toStream`` -- int magic 0x3D1FB0BC, int index length, long data
  object length, long data header length, then per ledger long ledger id, int block count, int
  metadata length, the LedgerInfo bytes and per block long entry id, int part id, long offset
  (``OffloadIndexBlockV2BuilderImpl.addBlock``: the block's start in the data object);
- ledger metadata: protobuf-java's encoding of ``MLDataFormats.ManagedLedgerInfo.LedgerInfo``.
Java writes big-endian. The bytes below were written from that reading, not produced by this code.
"""

from __future__ import annotations

import pytest

from txnkeeper.ledger.offload import block, index, ledgerinfo
from txnkeeper.ledger.offload.errors import OffloadFormatError
from txnkeeper.ledger.offload.index import IndexEntry, LedgerIndex
from txnkeeper.ledger.offload.ledgerinfo import LedgerInfo


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


# Ledger 3, entries 0 ("ab") and 1 ("xyz"), maxBlockSize 160: 128 + 2*12 + 5 = 157 bytes, 3 of padding.
BLOCK_HEADER = h(
    """
    26A66D32
    0000000000000080
    00000000000000A0
    0000000000000000
    0000000000000003
    """
) + bytes(92)
BLOCK_ENTRIES = h(
    """
    00000002 0000000000000000 6162
    00000003 0000000000000001 78797A
    """
)
BLOCK = BLOCK_HEADER + BLOCK_ENTRIES + h("FEDCDE")

# LedgerInfo{ledgerId=3, entries=2, size=5}: tags 0x08, 0x10, 0x18 with one-byte varints.
LEDGER_INFO = h("08 03 10 02 18 05")

# The index of a data object holding just BLOCK as part 1: 24 + 16 + 6 + 20 = 66 = 0x42 bytes.
INDEX = h(
    """
    3D1FB0BC 00000042 00000000000000A0 0000000000000080
    0000000000000003 00000001 00000006 080310021805
    0000000000000000 00000001 0000000000000000
    """
)


def test_block_header_golden() -> None:
    header = block.BlockHeader(header_len=128, block_len=160, first_entry_id=0, ledger_id=3)
    assert block.encode_header(header) == BLOCK_HEADER
    assert len(BLOCK_HEADER) == 128
    assert block.decode_header(BLOCK_HEADER) == header


def test_block_with_entries_and_padding_golden() -> None:
    assert block.encode_block(3, [(0, b"ab"), (1, b"xyz")], max_block_size=160) == BLOCK
    decoded = block.decode_block(BLOCK)
    assert decoded.entries == ((0, b"ab"), (1, b"xyz"))
    assert decoded.data_end == 157


def test_padding_repeats_the_pattern_from_its_first_byte() -> None:
    assert block.padding(9) == h("FEDCDEAD FEDCDEAD FE")
    encoded = block.encode_block(0, [(5, b"")], max_block_size=128 + 12 + 6)
    assert encoded[-6:] == h("FEDCDEAD FEDC")


def test_block_grows_to_hold_a_large_entry_as_calculate_block_size_does() -> None:
    encoded = block.encode_block(1, [(0, bytes(20))], max_block_size=140)
    assert len(encoded) == 128 + 12 + 20
    assert encoded[12:20] == (160).to_bytes(8, "big")
    assert block.decode_block(encoded).entries == ((0, bytes(20)),)


def test_ledger_info_golden_and_varints() -> None:
    assert ledgerinfo.encode(LedgerInfo(3, entries=2, size=5)) == LEDGER_INFO
    # 300 is the two-byte varint AC 02; -1 is ten bytes (int64 two's complement), as protobuf-java writes.
    assert ledgerinfo.encode(LedgerInfo(300)) == h("08 AC02")
    assert ledgerinfo.encode(LedgerInfo(1, timestamp=-1)) == h("08 01 20 FFFFFFFFFFFFFFFFFF01")
    # properties=6 is a KeyValue{key=1, value=2} message.
    assert ledgerinfo.encode(LedgerInfo(1, properties=(("k", "vv"),))) == h("08 01 32 07 0A016B 12027676")
    assert ledgerinfo.decode(h("08 01 20 FFFFFFFFFFFFFFFFFF01")).timestamp == -1


def test_ledger_info_decode_skips_fields_it_does_not_use() -> None:
    # offloadContext (field 5, length-delimited) and an unknown fixed64 field 9 are skipped.
    raw = LEDGER_INFO + h("2A 03 080910") + h("49 0102030405060708")
    assert ledgerinfo.decode(raw) == LedgerInfo(3, entries=2, size=5)


def test_index_golden() -> None:
    led = LedgerIndex(LedgerInfo(3, entries=2, size=5), (IndexEntry(3, 0, 1, 0),))
    assert index.encode(160, [led]) == INDEX
    decoded = index.decode(INDEX)
    assert decoded.data_object_length == 160
    assert decoded.data_header_length == 128
    assert decoded.ledgers == (led,)
    assert decoded.block_length(decoded.ledgers[0].entries[0]) == 160


def test_crc_rides_in_ledger_info_properties() -> None:
    crc = block.block_crc(BLOCK)
    info = LedgerInfo(3, entries=2, size=5, properties=(ledgerinfo.crc_property(1, crc),))
    key = b"txnkeeper.block.crc32.part-1"
    value = f"{crc:08x}".encode()
    kv = b"\x0a" + bytes([len(key)]) + key + b"\x12\x08" + value
    assert ledgerinfo.encode(info) == LEDGER_INFO + b"\x32" + bytes([len(kv)]) + kv
    assert ledgerinfo.decode(ledgerinfo.encode(info)).block_crcs() == {1: crc}


def test_multi_ledger_index_round_trip_orders_ledgers_and_offsets() -> None:
    ledgers = [
        LedgerIndex(LedgerInfo(9, entries=4, size=1), (IndexEntry(9, 0, 3, 320), IndexEntry(9, 2, 4, 480))),
        LedgerIndex(LedgerInfo(7, entries=10, size=2), (IndexEntry(7, 5, 1, 0), IndexEntry(7, 8, 2, 160))),
    ]
    raw = index.encode(640, ledgers)
    decoded = index.decode(raw)
    assert [x.info.ledger_id for x in decoded.ledgers] == [7, 9]
    assert [e.offset for e in decoded.blocks()] == [0, 160, 320, 480]
    assert decoded.block_length(decoded.blocks()[-1]) == 160


def test_index_in_pulsars_hashmap_order_is_read_and_a_repeated_ledger_refused() -> None:
    led7 = LedgerIndex(LedgerInfo(7, entries=10, size=2), (IndexEntry(7, 5, 1, 0), IndexEntry(7, 8, 2, 160)))
    led9 = LedgerIndex(LedgerInfo(9, entries=4, size=1), (IndexEntry(9, 0, 3, 320),))
    rec7 = index.encode(640, [led7])[24:]
    rec9 = index.encode(640, [led9])[24:]

    def whole(body: bytes) -> bytes:
        return (
            h("3D1FB0BC")
            + (24 + len(body)).to_bytes(4, "big")
            + h("0000000000000280 0000000000000080")
            + body
        )

    assert index.decode(whole(rec9 + rec7)).ledgers == (led7, led9)
    with pytest.raises(OffloadFormatError, match="ledger 7 appears twice"):
        index.decode(whole(rec7 + rec7))


@pytest.mark.parametrize(
    ("raw", "offset", "problem"),
    [
        (h("3D1FB0BD") + INDEX[4:], 0, "index magic is 0x3D1FB0BD"),
        (INDEX[:-1], 4, "the object has 65"),
        (INDEX[:20], 0, "needs at least 24 bytes"),
    ],
)
def test_index_decode_refuses_damage(raw: bytes, offset: int, problem: str) -> None:
    with pytest.raises(OffloadFormatError) as err:
        index.decode(raw)
    assert err.value.offset == offset
    assert problem in str(err.value)


def test_block_decode_names_the_offset_of_damage() -> None:
    bad_magic = h("26A66D33") + BLOCK[4:]
    with pytest.raises(OffloadFormatError, match="block magic is 0x26A66D33") as err:
        block.decode_block(bad_magic)
    assert err.value.offset == 0
    bad_padding = BLOCK[:-1] + b"\x00"
    with pytest.raises(OffloadFormatError, match="padding") as err:
        block.decode_block(bad_padding)
    assert err.value.offset == 159
    bad_id = bytearray(BLOCK)
    bad_id[128 + 14 + 11] = 7  # the second entry's id becomes 7
    with pytest.raises(OffloadFormatError, match="entry id 7 where 1 was expected") as err:
        block.decode_block(bytes(bad_id))
    assert err.value.offset == 128 + 14 + 4
