"""Property: whatever mix of writes, batching toggles, transaction ends, rollovers, crashes and reopens
happens, replay rebuilds exactly the acknowledged, not-deleted records, and a level-1 open is refused
exactly when one of them sits in a batched entry."""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnkeeper.bufferedwriter import BatchedWriteConfig, WritePosition
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.txnlog import FormatLevelError, TransactionLogStore, TxnID

from .helpers import Op, add_partition, add_subscription, new_txn, update

COORD = 1
LEDGER = ManagedLedgerConfig(max_entries_per_ledger=4)

configs = st.builds(
    BatchedWriteConfig,
    enabled=st.booleans(),
    max_records=st.integers(1, 6),
    max_size_bytes=st.sampled_from([64, 300, 4 * 1024 * 1024]),
    max_delay_millis=st.sampled_from([0, 0.5, 1]),
)
# A choice of 0 starts a new transaction; others pick an open one.
choice = st.integers(0, 3)
burst = st.lists(
    st.tuples(choice, st.sampled_from(["partition", "subscription", "big"])), min_size=1, max_size=6
)
ops = st.one_of(
    st.tuples(st.just("burst"), burst),
    st.tuples(st.just("toggle"), configs),
    st.tuples(st.just("end"), choice, st.booleans()),
    st.tuples(st.just("committing"), choice),
    st.tuples(st.just("rollover")),
    st.tuples(st.just("crash"), st.lists(choice, max_size=5), st.integers(0, 3)),
    st.tuples(st.just("reopen")),
)


@dataclass
class Model:
    """Acknowledged, not deleted records per transaction; the sequence of transaction ids."""

    live: dict[TxnID, list[tuple[WritePosition, tm.TransactionMetadataEntry]]] = field(default_factory=dict)
    open_txns: list[int] = field(default_factory=list)
    next_seq: int = 0

    def pick(self, choice: int) -> int | None:
        return self.open_txns[choice % len(self.open_txns)] if self.open_txns else None


def key(p: WritePosition) -> tuple[int, int, int]:
    return (p.ledger_id, p.entry_id, p.batch_index)


def record_for(model: Model, choice: int, kind: str) -> tm.TransactionMetadataEntry:
    seq = model.pick(choice)
    if seq is None or choice == 0:
        seq = model.next_seq
        model.next_seq += 1
        model.open_txns.append(seq)
        return new_txn(COORD, seq, owner="o" * (400 if kind == "big" else 1))
    if kind == "subscription":
        return add_subscription(COORD, seq, f"persistent://t/ns/{seq}", f"s{choice}")
    return add_partition(COORD, seq, f"p{choice}" + ("x" * 400 if kind == "big" else ""))


def acknowledge(model: Model, record: tm.TransactionMetadataEntry, result: object) -> None:
    if isinstance(result, WritePosition):
        txn = TxnID(record.txnid_most_bits, record.txnid_least_bits)
        model.live.setdefault(txn, []).append((result, record))


async def check_replay(store: TransactionLogStore, model: Model) -> None:
    state = await store.replay()
    assert set(state) == set(model.live), "replay found other transactions than were acknowledged"
    for txn, records in model.live.items():
        got = state[txn]
        assert sorted(map(key, got.positions)) == sorted(key(p) for p, _ in records)
        in_log_order = [r for _, r in sorted(records, key=lambda pr: key(pr[0]))]
        status = tm.OPEN
        partitions: list[str] = []
        for r in in_log_order:
            if r.metadata_op == Op.UPDATE:
                status = r.new_status
            for p in r.partitions:
                if p not in partitions:
                    partitions.append(p)
        assert got.status == status
        assert got.partitions == partitions
        assert got.complete == any(r.metadata_op == Op.NEW for r in in_log_order)


async def reopen(
    factory: ManagedLedgerFactory, model: Model, config: BatchedWriteConfig
) -> TransactionLogStore:
    any_batched = any(p.batch_size > 0 for recs in model.live.values() for p, _ in recs)
    try:
        old = await TransactionLogStore.open(factory, COORD, format_level=1, ledger_config=LEDGER)
    except FormatLevelError:
        assert any_batched, "level 1 refused a log whose live records are all unbatched"
    else:
        assert not any_batched, "level 1 opened a log with a live batched record"
        await old.close()
    store = await TransactionLogStore.open(factory, COORD, config, ledger_config=LEDGER)
    await check_replay(store, model)
    return store


async def scenario(root: Path, steps: list[tuple[object, ...]]) -> None:
    factory = ManagedLedgerFactory(root, io_threads=2)
    model = Model()
    config = BatchedWriteConfig(enabled=True, max_records=3)
    store = await TransactionLogStore.open(factory, COORD, config, ledger_config=LEDGER)
    try:
        for step in steps:
            match step:
                case ("burst", items):
                    records = [record_for(model, c, k) for c, k in items]  # type: ignore[attr-defined]
                    results = await asyncio.gather(
                        *(store.append(r) for r in records), return_exceptions=True
                    )
                    for r, res in zip(records, results, strict=True):
                        assert isinstance(res, WritePosition), res
                        acknowledge(model, r, res)
                case ("toggle", BatchedWriteConfig() as new_config):
                    config = new_config
                    await store.configure(config)
                case ("end", int(choice), bool(commit)):
                    seq = model.pick(choice)
                    if seq is None:
                        continue
                    mid, final = (tm.COMMITTING, tm.COMMITTED) if commit else (tm.ABORTING, tm.ABORTED)
                    for r in (update(COORD, seq, tm.OPEN, mid), update(COORD, seq, mid, final)):
                        acknowledge(model, r, await store.append(r))
                    await store.delete_txn(TxnID(COORD, seq))
                    model.live.pop(TxnID(COORD, seq), None)
                    model.open_txns.remove(seq)
                case ("committing", int(choice)):
                    seq = model.pick(choice)
                    if seq is not None:
                        r = update(COORD, seq, tm.OPEN, tm.COMMITTING)
                        acknowledge(model, r, await store.append(r))
                case ("rollover",):
                    await store.rollover()
                case ("crash", choices, int(yields)):
                    records = [record_for(model, c, "partition") for c in choices]  # type: ignore[attr-defined]
                    tasks = [asyncio.ensure_future(store.append(r)) for r in records]
                    for _ in range(yields):  # let some reach the ledger before the "crash"
                        await asyncio.sleep(0)
                    await store.close(flush=False)
                    for r, res in zip(
                        records, await asyncio.gather(*tasks, return_exceptions=True), strict=True
                    ):
                        acknowledge(model, r, res)
                    store = await reopen(factory, model, config)
                case ("reopen",):
                    await store.close()
                    store = await reopen(factory, model, config)
        await store.close()
        store = await reopen(factory, model, config)
    finally:
        await store.close()
        await factory.close()


@settings(
    max_examples=int(os.environ.get("TXNKEEPER_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(ops, min_size=1, max_size=25))
def test_replay_equals_acknowledged_minus_deleted(steps: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="txnlog-prop-") as tmp:
        asyncio.run(scenario(Path(tmp), steps))
