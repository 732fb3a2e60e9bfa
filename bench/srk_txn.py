"""Single-routing-key transactions (PDP-44) against their baselines, in the same run: 4 x 100 B events.

Three ways to write 4 events of 100 bytes to one topic, at 1 and 256 in flight (one worker per
in-flight unit, each looping):
  - ``single_key``: a ``SingleKeyWriter`` per worker; begin, write 4, commit (one block, one round trip);
  - ``full_txn``: begin a transaction with the coordinator, produce 4 in it (gathered), commit;
  - ``plain``: 4 plain sends gathered (no atomicity: the throughput ceiling).
Starts one coordinator pod and one store pod (real ``txnkeeper serve`` processes, fsync on). Prints
JSON: transactions/s and events/s per mode and level, p50/p99 commit latency, CPU ms per transaction
per process role, and the issue-14 ratios (single_key / full_txn at 1 in flight, single_key / plain
and single_key / full_txn in events/s at 256).

    .venv/bin/python bench/srk_txn.py [--seconds 3] [--levels 1,256] [--rounds 3]

Numbers on a shared 2-core machine are noisy; compare modes within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from txn_e2e import cpu_seconds, start_pod  # the same pods and CPU accounting as the e2e bench

from txnkeeper import gcpolicy, process_settings
from txnkeeper.client import Client
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper.process_settings import ProcessSettings

START_TIMEOUT_S = 60.0
TOPIC = "persistent://bench/ns/srk"
EVENTS_PER_TXN = 4
EVENT = b"e" * 100
MODES = ("single_key", "full_txn", "plain")

Step = Callable[[], Awaitable[None]]


async def make_steps(client: Client, mode: str, workers: int, topic: str) -> list[Step]:
    """One step function per worker: one transaction (or the plain sends' equivalent) each call."""
    steps: list[Step] = []
    if mode == "single_key":
        for worker in range(workers):
            writer = await client.create_single_key_writer(topic, f"key-{worker}", txn_timeout_ms=60_000)

            async def single_key(writer: Any = writer) -> None:
                txn = writer.begin_transaction()
                for _ in range(EVENTS_PER_TXN):
                    txn.write(EVENT)
                await txn.commit()

            steps.append(single_key)
        return steps
    producer = await client.create_producer(topic)
    if mode == "full_txn":

        async def full_txn() -> None:
            txn = await client.new_transaction(timeout_ms=60_000)
            await asyncio.gather(*(producer.send(EVENT, key="k", txn=txn) for _ in range(EVENTS_PER_TXN)))
            await txn.commit()

        return [full_txn] * workers

    async def plain() -> None:
        await asyncio.gather(*(producer.send(EVENT, key="k") for _ in range(EVENTS_PER_TXN)))

    return [plain] * workers


async def run_level(steps: list[Step], seconds: float, pids: dict[str, list[int]]) -> dict[str, Any]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def worker(step: Step) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await step()
            latencies.append(time.perf_counter() - started)

    def role_cpu() -> dict[str, float]:
        return {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}

    cpu_before = role_cpu()
    began = time.perf_counter()
    await asyncio.gather(*(worker(step) for step in steps))
    elapsed = time.perf_counter() - began
    cpu_after = role_cpu()
    done = len(latencies)
    latencies.sort()
    return {
        "in_flight": len(steps),
        "transactions": done,
        "seconds": round(elapsed, 3),
        "txn_per_s": round(done / elapsed, 1),
        "events_per_s": round(done * EVENTS_PER_TXN / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[min(done - 1, int(done * 0.99))] * 1000, 3),
        "cpu_ms_per_txn": {
            name: round((cpu_after[name] - cpu_before[name]) * 1000 / max(done, 1), 3) for name in pids
        },
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["txn_per_s"])
    return {**ordered[len(ordered) // 2], "all_txn_per_s": [r["txn_per_s"] for r in runs]}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


async def bench(
    levels: list[int], seconds: float, rounds: int, root: Path, modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    procs: list[RuntimeProcess] = []
    pids: dict[str, list[int]] = {"coordinator": [], "store": [], "client": [os.getpid()]}
    try:
        procs.append(start_pod(root, "tc-0", "coordinator", ("--coordinator-ids", "0")))
        srk_flags = ("--srk-enabled", "true") if "single_key" in modes else ()
        # single-key transactions need a 3.x release (a 2.x serve refuses --srk-enabled)
        procs.append(start_pod(root, "pas-0", "store", srk_flags, release="3.0.0"))
        await asyncio.gather(*(p.wait_started(START_TIMEOUT_S) for p in procs))
        tc, store = procs
        for name, proc in (("coordinator", tc), ("store", store)):
            pids[name] = [proc.proc.pid] if proc.proc is not None else []
        async with Client(
            coordinators=[str(tc.client_address)], stores=[str(store.client_address)]
        ) as client:
            runs: dict[str, dict[int, list[dict[str, Any]]]] = {mode: {} for mode in modes}
            for workers in levels:
                # Modes alternate round by round: the shared machine's load drifts, and interleaving
                # spreads that drift over every mode instead of favouring one.
                for round_no in range(rounds):
                    for mode in modes:
                        topic = f"{TOPIC}-{mode}-{workers}-{round_no}"
                        steps = await make_steps(client, mode, workers, topic)
                        result = await run_level(steps, seconds, pids)
                        runs[mode].setdefault(workers, []).append(result)
                        print(json.dumps({"mode": mode, "round": round_no, **result}), file=sys.stderr)
    finally:
        await asyncio.gather(*(p.stop() for p in procs))
    results = {mode: {str(w): _median(by_level[w]) for w in levels} for mode, by_level in runs.items()}
    ratios: dict[str, Any] = {}
    for w in levels if modes == MODES else []:
        srk, full, plain = (results[m][str(w)] for m in MODES)
        ratios[str(w)] = {
            "single_key_vs_full_txn_txn_per_s": _ratio(srk["txn_per_s"], full["txn_per_s"]),
            "single_key_vs_plain_events_per_s": _ratio(srk["events_per_s"], plain["events_per_s"]),
            "single_key_vs_full_txn_events_per_s": _ratio(srk["events_per_s"], full["events_per_s"]),
        }
    targets: dict[str, Any] = {}
    if 1 in levels and ratios:
        targets["at_1_single_key_vs_full_txn >= 4"] = ratios["1"]["single_key_vs_full_txn_txn_per_s"]
    if 256 in levels and ratios:
        targets["at_256_single_key_vs_plain_events >= 0.8"] = ratios["256"][
            "single_key_vs_plain_events_per_s"
        ]
        targets["at_256_single_key_vs_full_txn_events >= 2"] = ratios["256"][
            "single_key_vs_full_txn_events_per_s"
        ]
    return {
        "benchmark": "srk_txn",
        "operation": f"{EVENTS_PER_TXN} x {len(EVENT)} B events per transaction",
        "transport": "loopback TCP, 1 coordinator pod + 1 store pod, fsync on",
        "cpus": os.cpu_count(),
        "seconds_per_run": seconds,
        "rounds": rounds,
        "figures": "per mode and level, the median run (by txn/s)",
        **results,
        "ratios": ratios,
        "targets": targets,
        "note": "shared machine; figures are noisy",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--levels", default="1,256")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode and level (alternating)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    process_settings.add_arguments(parser)
    ns = parser.parse_args()
    try:
        levels = [int(x) for x in ns.levels.split(",")]
    except ValueError:
        parser.error(f"--levels {ns.levels!r}: give comma-separated positive counts, e.g. 1,256")
    modes = tuple(m for m in MODES if m in ns.modes.split(","))
    if set(ns.modes.split(",")) - set(MODES) or not modes:
        parser.error(f"--modes {ns.modes!r}: choose from {','.join(MODES)}")
    if not levels or min(levels) < 1 or ns.rounds < 1 or ns.seconds <= 0:
        parser.error("--levels must be positive counts, --rounds >= 1 and --seconds > 0")
    settings = ProcessSettings.from_args_or_exit(parser, ns)
    gcpolicy.freeze_startup_state()
    with tempfile.TemporaryDirectory(prefix="srk-txn-") as tmp:
        result = settings.run(bench(levels, ns.seconds, ns.rounds, Path(tmp), modes))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
