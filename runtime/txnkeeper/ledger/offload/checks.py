"""What a segment's objects must satisfy before anything in them is served: one set of checks, used
by the pod's reader (``SegmentReader``, and through it ``verify-offload``) and by
``txnkeeper inspect-offload``.

Why a module: inspect-offload used to check less than the reader (it walked the data object by its
block headers and compared CRCs by position), so a data object cut on a block boundary passed
inspection while the pod refused it. Both now ask these functions, so an object the pod refuses is
an object inspection reports, in the same words.

An index is checked against its data object's length and for a parsable CRC of every block
(``check_index``); each block against what the index says it is (``check_block``: its length, CRC,
structure, the ledger and first entry in its header, and the entries it must hold, no more and no
fewer). Damage is an ``OffloadCorruptionError`` naming the segment, the part (None: the index), the
object offset and what was found.
"""

from __future__ import annotations

from dataclasses import dataclass

from .block import DecodedBlock, block_crc, decode_block
from .errors import OffloadCorruptionError, OffloadFormatError
from .index import IndexEntry, OffloadIndex
from .writer import data_key, index_key


@dataclass(frozen=True)
class BlockPlan:
    """One block as the index describes it: where it is, how long, its CRC (None: the index records
    none) and the last entry it must hold (None: the index does not say, e.g. the last block of a
    ledger in a segment written by Pulsar, whose LedgerInfo may count the whole ledger)."""

    entry: IndexEntry
    length: int
    crc: int | None
    last_entry_id: int | None


def check_index(uuid: str, idx: OffloadIndex, *, data_length: int, require_crc: bool) -> list[BlockPlan]:
    """The segment's blocks in object order (``block_plans``), once the index agrees with its data
    object's length."""
    if data_length != idx.data_object_length:
        raise OffloadCorruptionError(
            uuid,
            None,
            8,
            f"index says the data object is {idx.data_object_length} bytes, it is {data_length} "
            f"(the data object {data_key(uuid)!r} was cut short, grown or replaced after the segment "
            "was written)",
            index_key(uuid),
        )
    return block_plans(uuid, idx, require_crc=require_crc)


def block_plans(uuid: str, idx: OffloadIndex, *, require_crc: bool) -> list[BlockPlan]:
    """Every block of the segment in object order, as the index describes it; the index must record a
    well-formed CRC for each (a missing one is refused only with ``require_crc``)."""
    plans: dict[int, BlockPlan] = {}
    for led in idx.ledgers:
        try:
            crcs = led.info.block_crcs()
        except OffloadFormatError as exc:
            raise OffloadCorruptionError(uuid, None, 0, exc.problem, index_key(uuid)) from None
        for n, e in enumerate(led.entries):
            crc = crcs.get(e.part_id)
            if crc is None and require_crc:
                raise OffloadCorruptionError(
                    uuid,
                    e.part_id,
                    e.offset,
                    "the index records no CRC for this block (not written by txnkeeper?); "
                    "open the reader with require_crc=False to read it unverified",
                    index_key(uuid),
                )
            if n + 1 < len(led.entries):
                last: int | None = led.entries[n + 1].first_entry_id - 1
            else:
                # txnkeeper's index counts exactly the entries the segment holds of the ledger (its
                # CRCs say it wrote the index); Pulsar's may count the whole ledger.
                last = led.info.last_entry_id if crc is not None else None
            plans[e.offset] = BlockPlan(e, idx.block_length(e), crc, last)
    return [plans[e.offset] for e in idx.blocks()]


def check_block(uuid: str, raw: memoryview, plan: BlockPlan, *, require_crc: bool) -> DecodedBlock:
    """One block's bytes against the index's ``plan`` of it: length, CRC, structure, header ids and
    the entries it holds; returns the decoded block."""
    entry = plan.entry
    key = data_key(uuid)

    def corrupt(offset: int, problem: str) -> OffloadCorruptionError:
        return OffloadCorruptionError(uuid, entry.part_id, offset, problem, key)

    if len(raw) != plan.length:
        raise corrupt(
            entry.offset + len(raw), f"object truncated: block needs {plan.length} bytes, got {len(raw)}"
        )
    if plan.crc is not None:
        actual = block_crc(raw)
        if actual != plan.crc:
            raise corrupt(entry.offset, f"block CRC-32 is {actual:08x}, the index recorded {plan.crc:08x}")
    elif require_crc:
        raise corrupt(entry.offset, "the index records no CRC for this block")
    try:
        decoded = decode_block(raw)
    except OffloadFormatError as exc:
        raise corrupt(entry.offset + exc.offset, exc.problem) from None
    header = decoded.header
    if header.ledger_id != entry.ledger_id or header.first_entry_id != entry.first_entry_id:
        raise corrupt(
            entry.offset,
            f"block header holds {header.ledger_id}:{header.first_entry_id}, "
            f"the index says {entry.ledger_id}:{entry.first_entry_id}",
        )
    held = decoded.entries[-1][0]
    if plan.last_entry_id is not None and held != plan.last_entry_id:
        missing = (
            f"entries {held + 1}..{plan.last_entry_id} are missing"
            if held < plan.last_entry_id
            else f"entries {plan.last_entry_id + 1}..{held} belong to no block of the index"
        )
        raise corrupt(
            entry.offset,
            f"block holds entries {entry.first_entry_id}..{held} of ledger {entry.ledger_id}, the index "
            f"says {entry.first_entry_id}..{plan.last_entry_id}: {missing}",
        )
    return decoded
