"""Memory soak: RSS of real coordinator and store processes under a steady mixed load (issue 25).

Starts one coordinator pod and one store pod (real ``txnkeeper serve`` processes, fsync on, single-key
transactions on) and, for ``--seconds`` (default 3600), drives at once:
  - transactions at ``--rate`` per second (default 5,000; paced, ``--in-flight`` at a time; what the
    machine reached is reported): half on a topic *with* a subscription (each consumes the message an
    earlier one produced and acks it in the transaction: produce 1 + transactional ack 1), half on a
    topic *without* one (produce 1);
  - lazy consumers: every ``--lazy-every`` seconds, ``--lazy`` raw connections subscribe with 100,000
    permits on a prefilled 20 MB topic and never read (the store cuts them; the next batch comes);
  - a writer flood: every 10 s one connection sends ``--flood`` SetupAppends with fresh writer ids
    that never write, and ``--srk-writers`` single-key writers commit a 2-event transaction each
    about once a second.
Every ``--interval`` seconds it samples each process's RSS (/proc/<pid>/status VmRSS) and the store's
gauges (kept transaction outcomes per topic, writers, unsent bytes, connections).

Verdict (printed as JSON; exit 1 when it fails): per process, RSS *flat* (no level of the last sixth
of the run above the level at the first sixth by more than 5 %: for an hour, the last 10 minutes
against the 10-minute mark, a level being the median RSS over the minute before; ``judge`` says why
levels) and *under its budget* (``BUDGET_MB``, every sample; docs/performance.md says why).
``growth`` attributes the store's RSS growth over the judged window to the transaction outcomes kept
for topics without subscriptions (the store's gauge, times the bytes one costs), the known growth that
retention bounds.

A machine that cannot reach ``--rate`` runs the load as fast as it can, so the load follows the
machine's speed and memory follows the load (transaction outcomes are kept for a time, so their count
scales with the rate): on this 2-core machine the reached rate moved between 1,900 and 3,700 txn/s within
one run. A flatness verdict needs a rate the machine sustains: ``--rate 1500`` here (``load`` in the
JSON shows the rate before the mark and in the judged window).

    .venv/bin/python bench/memory_soak.py [--seconds 3600] [--rate 5000] [--interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import txn_e2e  # the same pods as the e2e bench (bench/ is on the path when run as a script)

from txnkeeper import gcpolicy, process_settings
from txnkeeper.client import Client, Consumer, Producer, ServiceError, SingleKeyWriter
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.process_settings import ProcessSettings
from txnkeeper.protocol.frames import encode_frame
from txnkeeper.protocol.rpc import connect, split_address

RELEASE = "3.0.0"  # single-key transactions need format level 3
SUB_TOPIC = "persistent://bench/ns/with-subscription"
NOSUB_TOPIC = "persistent://bench/ns/without-subscription"
LAZY_TOPIC = "persistent://bench/ns/lazy"
FLOOD_TOPIC = "persistent://bench/ns/writer-flood"
SRK_TOPIC = "persistent://bench/ns/single-key"
WORK = "work"
START_TIMEOUT_S = 60.0
LAZY_MESSAGES = 2_000
LAZY_PAYLOAD = 10_000  # bytes: a 20 MB topic for the lazy consumers
LAZY_PERMITS = 100_000
FLOOD_EVERY_S = 10.0
FLOOD_PER_CONNECTION = 200
# RSS budgets (MiB) and why: docs/performance.md, "Memory soak". The store's holds its interpreter and
# libraries (~60 MiB), the process-wide push budget (--max-total-unsent-bytes, 64 MiB) that lazy
# consumers fill, per-connection buffers, open transactions and caches, and the allocator's slack; the
# coordinator's holds its interpreter, open transactions and the transaction log's batching.
BUDGET_MB = {"coordinator": 256, "store": 384}
FLAT_PCT = 5.0
JUDGED_SHARE = 1 / 6  # the mark at 1/6 of the run; the judged window is its last 1/6
LEVEL_SHARE = 1 / 60  # an RSS level is the median over this share of the run (a minute of an hour)
# What one kept transaction outcome costs the store (txnbuffer.ENDED_ROW, 41 bytes, in a bytearray
# that doubles as it grows), to attribute growth to the outcomes kept for topics without subscriptions.
OUTCOME_BYTES = 41


def start_pod(
    root: Path, name: str, role: str, extra: tuple[str, ...] = (), config: dict[str, Any] | None = None
) -> RuntimeProcess:
    """The e2e bench's pod launcher, at this soak's release."""
    return txn_e2e.start_pod(root, name, role, extra, release=RELEASE, config=config)


def store_config(retention_minutes: int) -> dict[str, Any] | None:
    """The store's --config: with ``retention_minutes`` > 0, a retention default for every topic (so
    the topic without subscriptions is trimmed as Pulsar's retention trims it); else none."""
    if retention_minutes <= 0:
        return None
    retention = {"retentionTimeInMinutes": retention_minutes, "retentionSizeInMB": 1024}
    return {"topicPolicies": {"retention": retention}}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


_METRIC = re.compile(r"^(txnkeeper_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)
GAUGES = (
    "txnkeeper_topic_kept_txn_outcomes",
    "txnkeeper_srk_writers",
    "txnkeeper_server_unsent_bytes",
    "txnkeeper_server_open_connections",
    "txnkeeper_coordinator_ongoing_transactions",
    "txnkeeper_store_tail_cache_bytes",
    "txnkeeper_store_ledger_index_bytes",
    "txnkeeper_process_heap_bytes",
    "txnkeeper_process_heap_trims_total",
)
# Where the memory is, per process, at the mark and at the end: what grew (docs/performance.md).
PARTS = (
    "heap in_use",
    "heap free",
    "heap mmapped",
    "txnkeeper_store_tail_cache_bytes",
    "txnkeeper_store_ledger_index_bytes",
)


def scrape(admin: str) -> dict[str, float]:
    """The gauges of interest, summed over labels (kept outcomes also per topic)."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for name, labels, value in _METRIC.findall(text):
        if name in GAUGES:
            found[name] = found.get(name, 0.0) + float(value)
            if name == "txnkeeper_process_heap_bytes":
                state = re.search(r'state="([^"]*)"', labels or "")
                if state:
                    found[f"heap {state.group(1)}"] = float(value)
            if name == "txnkeeper_topic_kept_txn_outcomes":
                topic = re.search(r'topic="([^"]*)"', labels or "")
                if topic:
                    found[f"kept_txn_outcomes {topic.group(1)}"] = float(value)
    return found


class Pacer:
    """Hands out start times ``1/rate`` apart; a worker waits for its slot (open-loop pacing)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    async def slot(self) -> None:
        now = time.monotonic()
        self.next = max(self.next + self.interval, now - 1.0)  # never bank more than a second of slack
        if self.next > now:
            await asyncio.sleep(self.next - now)


class Load:
    """The load generators; each runs until ``stop`` is set, counting what it did."""

    def __init__(self, client: Client, store: str, args: argparse.Namespace) -> None:
        self.client = client
        self.store = store
        self.args = args
        self.stop = asyncio.Event()
        self.counts: dict[str, int] = {
            "txn_with_subscription": 0,
            "txn_without_subscription": 0,
            "txn_failed": 0,
            "lazy_consumers_opened": 0,
            "setup_appends_never_written": 0,
            "setup_appends_refused": 0,
            "single_key_commits": 0,
            "single_key_failed": 0,
        }
        self.last_error = ""

    def failed(self, what: str, exc: BaseException) -> None:
        self.counts[what] += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    async def transactions(self) -> None:
        pacer = Pacer(self.args.rate)
        consumer = await self.client.subscribe(SUB_TOPIC, WORK, receiver_queue_size=2000)
        sub_out = await self.client.create_producer(SUB_TOPIC)
        nosub_out = await self.client.create_producer(NOSUB_TOPIC)
        seed = await asyncio.gather(*(sub_out.send(b"seed") for _ in range(self.args.in_flight)))
        del seed
        turn = itertools.count()
        await asyncio.gather(
            *(self.txn_worker(pacer, consumer, sub_out, nosub_out, turn) for _ in range(self.args.in_flight))
        )

    async def txn_worker(
        self,
        pacer: Pacer,
        consumer: Consumer,
        sub_out: Producer,
        nosub_out: Producer,
        turn: itertools.count[int],
    ) -> None:
        subscription = [(SUB_TOPIC, WORK)]
        while not self.stop.is_set():
            await pacer.slot()
            with_subscription = next(turn) % 2 == 0
            try:
                if with_subscription:
                    # Consume what an earlier transaction produced, ack it in this one, produce one.
                    message = await consumer.receive(timeout=30)
                    txn = await self.client.new_transaction(
                        30_000, topics=[SUB_TOPIC], subscriptions=subscription
                    )
                    sent = sub_out.send(b"x" * 100, txn=txn)
                    acked = consumer.acknowledge(message, txn=txn)
                    await sent
                    await acked
                else:
                    txn = await self.client.new_transaction(30_000, topics=[NOSUB_TOPIC])
                    await nosub_out.send(b"x" * 100, txn=txn)
                await txn.commit()
            except (ServiceError, TimeoutError) as exc:
                self.failed("txn_failed", exc)
                continue
            self.counts["txn_with_subscription" if with_subscription else "txn_without_subscription"] += 1

    async def lazy_consumers(self) -> None:
        """Batches of raw connections that subscribe with huge permits and never read."""
        producer = await self.client.create_producer(LAZY_TOPIC)
        for start in range(0, LAZY_MESSAGES, 200):
            batch = range(start, min(start + 200, LAZY_MESSAGES))
            await asyncio.gather(*(producer.send(b"z" * LAZY_PAYLOAD) for _ in batch))
        open_now: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                for sock in open_now:
                    sock.close()
                open_now = [self.lazy_consumer(f"lazy-{i}") for i in range(self.args.lazy)]
                self.counts["lazy_consumers_opened"] += len(open_now)
                await self.pause(self.args.lazy_every)
        finally:
            for sock in open_now:
                sock.close()

    def lazy_consumer(self, subscription: str) -> socket.socket:
        host, port = split_address(self.store)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, port))
        subscribe = api.Subscribe(
            topic=LAZY_TOPIC, subscription=subscription, consumer_id=1, permits=LAZY_PERMITS
        )
        sock.sendall(encode_frame(api.Command(request_id=1, subscribe=subscribe)))
        return sock

    async def writer_flood(self) -> None:
        """SetupAppends with fresh writer ids that never write, a batch every FLOOD_EVERY_S."""
        ids = itertools.count()
        while not self.stop.is_set():
            left = self.args.flood
            while left > 0:
                # A connection may hold FLOOD_PER_CONNECTION never-written sessions (the store's
                # per-connection limit is 256): the flood opens as many connections as it needs.
                count = min(left, FLOOD_PER_CONNECTION)
                left -= count
                conn = await connect(self.store)
                try:
                    futures = []
                    for _ in range(count):
                        command = api.Command()
                        command.setup_append.topic = FLOOD_TOPIC
                        command.setup_append.writer_id = f"flood-{next(ids)}"
                        futures.append(conn.request(command, 60))
                    for outcome in await asyncio.gather(*futures, return_exceptions=True):
                        if isinstance(outcome, BaseException):
                            self.failed("setup_appends_refused", outcome)
                        else:
                            self.counts["setup_appends_never_written"] += 1
                finally:
                    conn.close()
            await self.pause(FLOOD_EVERY_S)

    async def single_key_writers(self) -> None:
        """``--srk-writers`` writers (fixed ids), each committing 2 events about once a second."""
        writers = [
            await self.client.create_single_key_writer(SRK_TOPIC, f"key-{i}", 30_000, writer_id=f"srk-{i}")
            for i in range(self.args.srk_writers)
        ]
        await asyncio.gather(*(self.single_key_loop(writer) for writer in writers))

    async def single_key_loop(self, writer: SingleKeyWriter) -> None:
        while not self.stop.is_set():
            try:
                txn = writer.begin_transaction()
                txn.write(b"event-1")
                txn.write(b"event-2")
                await txn.commit()
                self.counts["single_key_commits"] += 1
            except ServiceError as exc:
                self.failed("single_key_failed", exc)
            await self.pause(1.0)

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until the run stops, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


def level(samples: list[dict[str, Any]], name: str, t_end: float, span: float) -> float:
    """The RSS level of process ``name`` at ``t_end``: the median of its samples over the ``span``
    seconds up to it (the sample itself when none other is that close)."""
    near = [float(s["rss_mb"][name]) for s in samples if t_end - span < s["t"] <= t_end]
    if near:
        return statistics.median(near)
    closest = min(samples, key=lambda s: abs(s["t"] - t_end))
    return float(closest["rss_mb"][name])


def _rate(first: dict[str, Any], last: dict[str, Any]) -> float | None:
    """Transactions per second between two samples (None: too close to tell)."""
    kinds = ("txn_with_subscription", "txn_without_subscription")
    done = sum(last.get(k, 0) - first.get(k, 0) for k in kinds)
    seconds = last["t"] - first["t"]
    return round(done / seconds, 1) if seconds > 1 else None


def judge(samples: list[dict[str, Any]], seconds: float, pods: dict[str, str]) -> dict[str, Any]:
    """Flatness and budget per process; the store's growth attributed to kept outcomes.

    Flat compares levels, not single samples: the load has bursts by design (1,000 SetupAppends in
    flight at once every 10 s, a batch of lazy consumers every minute), each a transient of a few MB
    that its limits bound and that is gone by the next sample; a level is the median RSS over the
    LEVEL_SHARE of the run before a time (a minute of an hour), so a transient sample does not decide
    flatness, while growth of the level does. Peaks are judged against the budget; the sample-by-sample
    growth is reported too (``sample_growth_pct``)."""
    mark_at = seconds * JUDGED_SHARE
    window_from = seconds - seconds * JUDGED_SHARE
    span = seconds * LEVEL_SHARE
    mark = min(samples, key=lambda s: abs(s["t"] - mark_at))
    window = [s for s in samples if s["t"] >= window_from] or samples[-1:]
    processes: dict[str, Any] = {}
    for name, role in pods.items():
        at_mark = mark["rss_mb"][name]
        top = max(s["rss_mb"][name] for s in window)
        peak = max(s["rss_mb"][name] for s in samples)
        mark_level = level(samples, name, mark["t"], span)
        top_level = max(level(samples, name, s["t"], span) for s in window)
        growth = (top_level - mark_level) / mark_level * 100
        processes[name] = {
            "role": role,
            "rss_mb_first": samples[0]["rss_mb"][name],
            "rss_mb_at_mark": at_mark,
            "rss_mb_level_at_mark": mark_level,
            "rss_mb_window_min": min(s["rss_mb"][name] for s in window),
            "rss_mb_window_max": top,
            "rss_mb_window_max_level": top_level,
            "rss_mb_last": samples[-1]["rss_mb"][name],
            "rss_mb_peak": peak,
            "growth_pct": round(growth, 2),
            "sample_growth_pct": round((top - at_mark) / at_mark * 100, 2),
            "growth_mb_per_hour": round(
                (samples[-1]["rss_mb"][name] - at_mark) / max(1.0, samples[-1]["t"] - mark["t"]) * 3600, 1
            ),
            "flat": growth <= FLAT_PCT,
            "budget_mb": BUDGET_MB[role],
            "under_budget": peak <= BUDGET_MB[role],
        }
    mark_minute = [s for s in samples if s["t"] > mark["t"] - span] or [mark]  # the mark's level
    load = {
        # The load is judged with the memory: memory follows a load that follows the machine's speed.
        "txn_per_s_before_mark": _rate(mark_minute[0], mark),
        "txn_per_s_in_window": _rate(window[0], window[-1]),
    }
    kept_at_mark = mark["store"].get("txnkeeper_topic_kept_txn_outcomes", 0.0)
    kept_last = samples[-1]["store"].get("txnkeeper_topic_kept_txn_outcomes", 0.0)
    store_names = [name for name, role in pods.items() if role == "store"]
    rss_growth = sum(samples[-1]["rss_mb"][n] - mark["rss_mb"][n] for n in store_names)
    explained = (kept_last - kept_at_mark) * OUTCOME_BYTES / 2**20
    return {
        "mark_seconds": round(mark["t"], 1),
        "window_seconds": [round(window[0]["t"], 1), round(window[-1]["t"], 1)],
        "processes": processes,
        "load": load,
        "growth": {
            "store_rss_mb_since_mark": round(rss_growth, 1),
            "kept_txn_outcomes_at_mark": int(kept_at_mark),
            "kept_txn_outcomes_last": int(kept_last),
            "kept_txn_outcomes_per_topic_last": {
                k.split(" ", 1)[1]: int(v)
                for k, v in samples[-1]["store"].items()
                if k.startswith("kept_txn")
            },
            "mb_explained_by_kept_outcomes": round(explained, 1),
            "mb_unexplained": round(rss_growth - explained, 1),
        },
        "memory_parts_mb": {
            role: {
                part: {
                    "at_mark": round(mark.get(role, {}).get(part, 0.0) / 2**20, 1),
                    "last": round(samples[-1].get(role, {}).get(part, 0.0) / 2**20, 1),
                }
                for part in PARTS
                if part in samples[-1].get(role, {})
            }
            for role in ("coordinator", "store")
        },
        "verdict": {
            "flat": all(p["flat"] for p in processes.values()),
            "under_budget": all(p["under_budget"] for p in processes.values()),
        },
    }


async def soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    coordinator = start_pod(root, "tc-0", "coordinator")
    store = start_pod(root, "pas-0", "store", ("--srk-enabled", "true"), store_config(args.retention_minutes))
    pods = {"tc-0": "coordinator", "pas-0": "store"}
    procs = {"tc-0": coordinator, "pas-0": store}
    try:
        await asyncio.gather(*(p.wait_started(START_TIMEOUT_S) for p in procs.values()))
        pids = {name: p.proc.pid for name, p in procs.items() if p.proc is not None}
        async with Client(
            coordinators=[str(coordinator.client_address)], stores=[str(store.client_address)]
        ) as client:
            load = Load(client, str(store.client_address), args)
            tasks = [
                asyncio.ensure_future(job())
                for job in (
                    load.transactions,
                    load.lazy_consumers,
                    load.writer_flood,
                    load.single_key_writers,
                )
            ]
            samples: list[dict[str, Any]] = []
            began = time.monotonic()
            try:
                while True:
                    elapsed = time.monotonic() - began
                    for task in tasks:
                        if task.done() and task.exception() is not None:
                            raise RuntimeError(f"a load generator failed: {task.exception()!r}")
                    samples.append(
                        {
                            "t": round(elapsed, 1),
                            "rss_mb": {name: round(rss_bytes(pid) / 2**20, 1) for name, pid in pids.items()},
                            "store": await asyncio.to_thread(scrape, str(store.admin_address)),
                            "coordinator": await asyncio.to_thread(scrape, str(coordinator.admin_address)),
                            **{k: v for k, v in load.counts.items()},
                        }
                    )
                    if args.progress:
                        print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                    if elapsed >= args.seconds:
                        break
                    await asyncio.sleep(min(args.interval, max(0.0, args.seconds - elapsed)))
            finally:
                load.stop.set()
                await asyncio.wait(tasks, timeout=60)
            duration = samples[-1]["t"]
            txns = load.counts["txn_with_subscription"] + load.counts["txn_without_subscription"]
            return {
                "benchmark": "memory_soak",
                "transport": "loopback TCP, 1 coordinator pod + 1 store pod, fsync on",
                "cpus": os.cpu_count(),
                "seconds": duration,
                "target_txn_per_s": args.rate,
                "achieved_txn_per_s": round(txns / duration, 1) if duration else 0.0,
                "in_flight": args.in_flight,
                "lazy_consumers_per_batch": args.lazy,
                "lazy_every_s": args.lazy_every,
                "flood_setup_appends_per_batch": args.flood,
                "single_key_writers": args.srk_writers,
                "counts": load.counts,
                "last_error": load.last_error,
                "flat_pct": FLAT_PCT,
                "budget_mb": BUDGET_MB,
                **judge(samples, duration, pods),
                "samples": samples[:: max(1, len(samples) // 120)],  # at most ~120 kept in the output
                "note": "shared machine: throughput is what it reached; RSS does not depend on speed",
            }
    finally:
        await asyncio.gather(*(p.stop() for p in procs.values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--rate", type=float, default=5000.0, help="transactions per second to aim at")
    parser.add_argument("--in-flight", type=int, default=256, help="transactions at a time")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--lazy", type=int, default=16, help="lazy consumers per batch")
    parser.add_argument("--lazy-every", type=float, default=60.0, help="seconds between lazy batches")
    parser.add_argument("--flood", type=int, default=1000, help="never-written SetupAppends per batch")
    parser.add_argument("--srk-writers", type=int, default=64, help="single-key writers committing")
    parser.add_argument(
        "--retention-minutes",
        type=int,
        default=0,
        help="a retention default (minutes, up to 1 GiB) for every topic: without it a topic without"
        " subscriptions keeps every ledger for a future subscription (0: none, the default)",
    )
    parser.add_argument("--progress", action="store_true", help="print each sample to stderr")
    process_settings.add_arguments(parser)
    args = parser.parse_args()
    if args.seconds < 6 * args.interval or args.rate <= 0 or args.in_flight <= 0:
        parser.error("--seconds must cover at least 6 samples; --rate and --in-flight must be positive")
    settings = ProcessSettings.from_args_or_exit(parser, args)
    # A soak stopped with SIGTERM (kill, a CI timeout) stops its pods too: they run in their own
    # sessions, and the default action would end this process without the cleanup that stops them.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(128 + signal.SIGTERM))
    gcpolicy.freeze_startup_state()
    with tempfile.TemporaryDirectory(prefix="txnkeeper-memory-soak-") as tmp:
        result = settings.run(soak(args, Path(tmp)))
    print(json.dumps(result, indent=2))
    return 0 if all(result["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
