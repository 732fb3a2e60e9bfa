"""End-to-end transaction throughput over loopback: (begin, produce 1, ack 1, commit) per transaction.

Starts one coordinator pod and one store pod (``--pods C,S`` for more; real ``txnkeeper serve``
processes, fsync on), pre-fills an input topic, then runs N concurrent workers, each looping: begin,
receive one input message, produce one output message in the transaction, ack the input in the
transaction, commit. Measured at 1, 16 and 256 concurrent transactions with the PIP-160 batch log on
and off (toggled through the admin API on every pod, in the same run; ``--flush-mode delay`` for
Pulsar's flush, default adaptive). Prints JSON: transactions/s, p50/p99 commit latency, CPU ms per
transaction per process role, and the on/off ratio per level. Each transaction names its output
partition and input subscription in NewTxn (registered with the begin, one round trip less;
``--register-at-begin no`` for begin then AddToTxn).

    .venv/bin/python bench/txn_e2e.py [--seconds 3] [--levels 1,16,256] [--rounds 3] [--pods 1,1]

``--tls`` compares TLS on vs off instead (issue 28: txn/s and CPU ms per transaction at 1, 16 and 256 in
flight; a plaintext pair of pods and a pair serving TLS on the client port and between them, mutual).

Numbers on a shared 2-core machine are noisy; compare on/off within one run only.
The client process (the application) runs as ``txnkeeper serve`` does: under the runtime's
garbage-collector policy (``txnkeeper.gcpolicy``; ``--gc-threshold default`` shows CPython's, whose
collections were a fifth of the client's CPU per transaction at 256 in flight) and on uvloop when
installed (``--event-loop asyncio`` for the standard loop).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tls_material import write_material

from txnkeeper import gcpolicy, process_settings
from txnkeeper.client import Client, Consumer, Producer
from txnkeeper.fleet.process import RuntimeProcess, write_admin_token
from txnkeeper.process_settings import ProcessSettings

TOKEN = "bench-token"
IN_TOPIC = "persistent://bench/ns/in"
OUT_TOPIC = "persistent://bench/ns/out"
START_TIMEOUT_S = 60.0
# Input messages pre-filled per second of a run: well above what each level reaches on this machine
# (1 in flight did ~450 txn/s on a quiet one), so the workers never wait for input. A run that still
# outpaces it stops with an error naming this constant instead of waiting out the receive timeout.
PREFILL_PER_S = {1: 2_000}
PREFILL_PER_S_DEFAULT = 12_000


def start_pod(
    root: Path,
    name: str,
    role: str,
    extra: tuple[str, ...] = (),
    release: str = "2.0.0",
    *,
    config: dict[str, Any] | None = None,
) -> RuntimeProcess:
    """A ``txnkeeper serve`` process with default batch settings (or ``config``: its --config
    document), started (the fleet's launcher)."""
    token = write_admin_token(root / "token", TOKEN)
    pod = RuntimeProcess.in_work_dir(
        root, name, role, token_file=token, release=release, extra_args=extra, config=config
    )
    pod.start()
    return pod


def set_batching(admin: str, enabled: bool, flush_mode: str) -> None:
    stat = {"batchEnabled": enabled, "batchedWriteFlushMode": flush_mode}
    body = json.dumps({"coordinator": stat, "pendingAck": stat}).encode()
    request = urllib.request.Request(f"http://{admin}/admin/v1/batch-log", data=body, method="POST")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


async def prefill(producer: Producer, count: int) -> None:
    window = 2000
    for start in range(0, count, window):
        await asyncio.gather(*(producer.send(b"input") for _ in range(min(window, count - start))))


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process (Linux /proc), to report CPU per transaction: unlike
    throughput on a shared machine, it barely depends on what else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over a process's live threads (Linux /proc).

    A voluntary switch is a thread going to sleep to wait (for a socket, a queue, a futex): per
    transaction, the count of cross-thread and cross-process hand-offs, each costing a wake-up.
    """
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread exited meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


async def run_level(
    client: Client,
    consumer: Consumer,
    producer: Producer,
    workers: int,
    seconds: float,
    *,
    prefilled: int,
    pids: dict[str, list[int]],
    register_at_begin: bool = True,
) -> dict[str, Any]:
    latencies: list[float] = []
    subscription = (consumer.topic, consumer.subscription)
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            # Receive, then begin (the input is prefetched, so receiving rarely waits); the send and
            # the ack overlap, pipelined on their connections: both are sent at the call, so awaiting
            # them in turn waits for the slower one (no gather needed).
            try:
                message = await consumer.receive(timeout=30)
            except TimeoutError:
                raise RuntimeError(
                    f"{workers} in flight consumed all {prefilled} pre-filled input messages before "
                    f"the run ended; raise PREFILL_PER_S in {__file__}"
                ) from None
            if register_at_begin:
                # NewTxn names the output partition and the input subscription: one request and one
                # log write instead of a begin and an AddToTxn (contracts §6).
                txn = await client.new_transaction(
                    timeout_ms=60_000, topics=[producer.topic], subscriptions=[subscription]
                )
            else:
                txn = await client.new_transaction(timeout_ms=60_000)
            sent = producer.send(b"output", txn=txn)
            acked = consumer.acknowledge(message, txn=txn)
            await sent
            await acked
            started = time.perf_counter()
            await txn.commit()
            latencies.append(time.perf_counter() - started)
            done += 1

    def role_cpu() -> dict[str, float]:
        return {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}

    def role_switches() -> dict[str, tuple[int, int]]:
        counts = {name: [context_switches(pid) for pid in group] for name, group in pids.items()}
        return {name: (sum(c[0] for c in cs), sum(c[1] for c in cs)) for name, cs in counts.items()}

    cpu_before = role_cpu()
    switches_before = role_switches()
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - began
    cpu_after = role_cpu()
    switches_after = role_switches()
    cpu_ms = {name: (cpu_after[name] - cpu_before[name]) * 1000 / max(done, 1) for name in pids}
    per_txn = max(done, 1)
    switches = {
        name: [
            round((switches_after[name][0] - switches_before[name][0]) / per_txn, 2),
            round((switches_after[name][1] - switches_before[name][1]) / per_txn, 2),
        ]
        for name in pids
    }
    latencies.sort()
    return {
        "concurrency": workers,
        "transactions": done,
        "seconds": round(elapsed, 3),
        "txn_per_s": round(done / elapsed, 1),
        "commit_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "commit_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3),
        "cpu_ms_per_txn": {name: round(ms, 3) for name, ms in cpu_ms.items()},
        # [voluntary, involuntary] per transaction, all threads of each role's processes
        "context_switches_per_txn": switches,
    }


def _median_run(level_runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(level_runs, key=lambda r: r["txn_per_s"])
    return {**ordered[len(ordered) // 2], "all_txn_per_s": [r["txn_per_s"] for r in level_runs]}


async def bench(
    levels: list[int],
    seconds: float,
    rounds: int,
    root: Path,
    *,
    loop: str,
    pods: tuple[int, int],
    flush_mode: str,
    register_at_begin: bool = True,
    tls: str | None = None,
) -> dict[str, Any]:
    if tls is not None:
        return await bench_tls(
            levels, seconds, rounds, root, loop=loop, flush_mode=flush_mode, client_auth=tls
        )
    # One coordinator per coordinator pod (ids by ordinal); the client begins transactions round-robin
    # over them and places topics on the store pods by hash, as with the CRs.
    procs: list[RuntimeProcess] = []
    pids: dict[str, list[int]] = {"coordinators": [], "stores": [], "client": [os.getpid()]}
    try:
        for ordinal in range(pods[0]):
            procs.append(start_pod(root, f"tc-{ordinal}", "coordinator", ("--coordinator-ids", str(ordinal))))
        for ordinal in range(pods[1]):
            procs.append(start_pod(root, f"pas-{ordinal}", "store"))
        await asyncio.gather(*(p.wait_started(START_TIMEOUT_S) for p in procs))
        coordinators = [p for p in procs if p.role == "coordinator"]
        stores = [p for p in procs if p.role == "store"]
        for group, members in (("coordinators", coordinators), ("stores", stores)):
            pids[group] = [p.proc.pid for p in members if p.proc is not None]
        async with Client(
            coordinators=[str(p.client_address) for p in coordinators],
            stores=[str(p.client_address) for p in stores],
        ) as client:
            producer_out = await client.create_producer(OUT_TOPIC)
            runs: dict[str, dict[int, list[dict[str, Any]]]] = {"batching_on": {}, "batching_off": {}}
            for workers in levels:
                # Alternate the modes round by round: the shared machine's load drifts, and
                # interleaving spreads that drift over both modes instead of favouring one.
                for round_no in range(rounds):
                    for mode in ("batching_off", "batching_on"):
                        for pod in procs:
                            set_batching(str(pod.admin_address), mode == "batching_on", flush_mode)
                        topic = f"{IN_TOPIC}-{mode}-{workers}-{round_no}"
                        producer_in = await client.create_producer(topic)
                        prefilled = int(seconds * PREFILL_PER_S.get(workers, PREFILL_PER_S_DEFAULT))
                        await prefill(producer_in, prefilled)
                        consumer = await client.subscribe(topic, "bench", receiver_queue_size=2000)
                        result = await run_level(
                            client,
                            consumer,
                            producer_out,
                            workers,
                            seconds,
                            prefilled=prefilled,
                            pids=pids,
                            register_at_begin=register_at_begin,
                        )
                        await consumer.close()
                        runs[mode].setdefault(workers, []).append(result)
                        print(json.dumps({"mode": mode, "round": round_no, **result}), file=sys.stderr)
            results = {mode: [_median_run(by_level[w]) for w in levels] for mode, by_level in runs.items()}
            best_on = max(r["txn_per_s"] for r in results["batching_on"])
            best_off = max(r["txn_per_s"] for r in results["batching_off"])
            # Issue 12's goal: on/off >= 0.95 at every level (median runs compared).
            per_level = [
                {
                    "in_flight": w,
                    "on_vs_off": round(on["txn_per_s"] / off["txn_per_s"], 2) if off["txn_per_s"] else None,
                    "cpu_ms_per_txn_on": on["cpu_ms_per_txn"],
                    "cpu_ms_per_txn_off": off["cpu_ms_per_txn"],
                    "context_switches_per_txn_on": on["context_switches_per_txn"],
                    "context_switches_per_txn_off": off["context_switches_per_txn"],
                }
                for w, on, off in zip(levels, results["batching_on"], results["batching_off"], strict=True)
            ]
            return {
                "benchmark": "txn_e2e",
                "operation": "begin + produce 1 + ack 1 + commit",
                "transport": f"loopback TCP, {pods[0]} coordinator pod(s) + {pods[1]} store pod(s), fsync on",
                "cpus": os.cpu_count(),
                "seconds_per_run": seconds,
                "client_gc_thresholds": list(gc.get_threshold()),
                "client_event_loop": loop,
                "rounds": rounds,
                "flush_mode": flush_mode,
                "register_at_begin": register_at_begin,
                "figures": "per level, the median run of each mode (by txn/s)",
                **results,
                "best_txn_per_s": {"batching_on": best_on, "batching_off": best_off},
                "speedup_on_vs_off": round(best_on / best_off, 2) if best_off else None,
                "on_vs_off_per_level": per_level,
                "note": "shared machine; figures are noisy",
            }
    finally:
        await asyncio.gather(*(p.stop() for p in procs))


async def bench_tls(
    levels: list[int],
    seconds: float,
    rounds: int,
    root: Path,
    *,
    loop: str,
    flush_mode: str,
    client_auth: str,
) -> dict[str, Any]:
    """TLS on vs off (``--tls``): two coordinator + store pairs, one plaintext and one serving TLS on its
    client port and between its pods (mutual TLS: the client presents a certificate too), both with
    the batch log on; rounds alternate between them as the batching comparison does."""
    flags, settings = write_material(root / "tls", client_auth)
    procs: dict[str, list[RuntimeProcess]] = {"tls_off": [], "tls_on": []}
    try:
        for mode, extra in (("tls_off", ()), ("tls_on", tuple(flags))):
            (root / mode).mkdir()
            procs[mode] = [
                start_pod(root / mode, "tc-0", "coordinator", extra),
                start_pod(root / mode, "pas-0", "store", extra),
            ]
        await asyncio.gather(*(p.wait_started(START_TIMEOUT_S) for ps in procs.values() for p in ps))
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {"tls_off": {}, "tls_on": {}}
        clients: dict[str, Client] = {}
        for mode, (coordinator, store) in procs.items():
            set_batching(str(coordinator.admin_address), True, flush_mode)
            set_batching(str(store.admin_address), True, flush_mode)
            clients[mode] = Client(
                coordinators=[str(coordinator.client_address)],
                stores=[str(store.client_address)],
                tls=settings if mode == "tls_on" else None,
            )
        try:
            for workers in levels:
                for round_no in range(rounds):
                    for mode in ("tls_off", "tls_on"):
                        client = clients[mode]
                        coordinator, store = procs[mode]
                        pids = {
                            "coordinators": [coordinator.proc.pid] if coordinator.proc else [],
                            "stores": [store.proc.pid] if store.proc else [],
                            "client": [os.getpid()],
                        }
                        topic = f"{IN_TOPIC}-{mode}-{workers}-{round_no}"
                        producer_in = await client.create_producer(topic)
                        producer_out = await client.create_producer(OUT_TOPIC)
                        prefilled = int(seconds * PREFILL_PER_S.get(workers, PREFILL_PER_S_DEFAULT))
                        await prefill(producer_in, prefilled)
                        consumer = await client.subscribe(topic, "bench", receiver_queue_size=2000)
                        result = await run_level(
                            client, consumer, producer_out, workers, seconds, prefilled=prefilled, pids=pids
                        )
                        await consumer.close()
                        runs[mode].setdefault(workers, []).append(result)
                        print(json.dumps({"mode": mode, "round": round_no, **result}), file=sys.stderr)
        finally:
            for client in clients.values():
                await client.close()
        results = {mode: [_median_run(by_level[w]) for w in levels] for mode, by_level in runs.items()}
        per_level = [
            {
                "in_flight": w,
                "throughput_on_vs_off": round(on["txn_per_s"] / off["txn_per_s"], 2)
                if off["txn_per_s"]
                else None,
                "commit_p99_ms_on_vs_off": (
                    round(on["commit_p99_ms"] / off["commit_p99_ms"], 2) if off["commit_p99_ms"] else None
                ),
                "cpu_ms_per_txn_on": on["cpu_ms_per_txn"],
                "cpu_ms_per_txn_off": off["cpu_ms_per_txn"],
            }
            for w, on, off in zip(levels, results["tls_on"], results["tls_off"], strict=True)
        ]
        return {
            "benchmark": "txn_e2e --tls",
            "operation": "begin + produce 1 + ack 1 + commit",
            "transport": "loopback TCP, 1 coordinator pod + 1 store pod per mode, fsync on, batch log on",
            "tls": "TLS 1.3, P-256 certificates; client port and pod to pod",
            "client_auth": client_auth,
            "cpus": os.cpu_count(),
            "seconds_per_run": seconds,
            "client_event_loop": loop,
            "rounds": rounds,
            "figures": "per level, the median run of each mode (by txn/s)",
            **results,
            "tls_on_vs_off_per_level": per_level,
            "goal": "throughput_on_vs_off >= 0.85 at 256 in flight; commit p99 ratio <= 1.10 at 1",
            "note": "shared machine; figures are noisy",
        }
    finally:
        await asyncio.gather(*(p.stop() for ps in procs.values() for p in ps))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--levels", default="1,16,256")
    parser.add_argument("--rounds", type=int, default=3, help="alternating off/on runs per level")
    parser.add_argument(
        "--flush-mode",
        choices=("adaptive", "delay"),
        default="adaptive",
        help="batch flush mode while batching is on (delay = Pulsar's)",
    )
    parser.add_argument(
        "--register-at-begin",
        choices=("yes", "no"),
        default="yes",
        help="name the output partition and input subscription in NewTxn (no: begin, then AddToTxn)",
    )
    parser.add_argument(
        "--pods",
        default="1,1",
        help="coordinator pods,store pods (one coordinator each); the CRs' default shape is 3,3",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="compare TLS on vs off (client port and pod to pod) instead of batching on vs off",
    )
    parser.add_argument(
        "--tls-client-auth",
        choices=("none", "request", "require"),
        default="require",
        help="with --tls: the pods' client-port client certificate mode (require: mutual TLS everywhere)",
    )
    process_settings.add_arguments(parser)
    ns = parser.parse_args()
    try:
        pods = tuple(int(x) for x in ns.pods.split(","))
    except ValueError:
        pods = ()
    if len(pods) != 2 or min(pods) < 1:
        parser.error(
            f"--pods {ns.pods!r}: give two positive counts, coordinator pods and store pods, e.g. 3,3"
        )
    settings = ProcessSettings.from_args_or_exit(parser, ns)
    gcpolicy.freeze_startup_state()
    levels = [int(x) for x in ns.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="txn-e2e-") as tmp:
        result = settings.run(
            bench(
                levels,
                ns.seconds,
                ns.rounds,
                Path(tmp),
                loop=settings.event_loop,
                pods=(pods[0], pods[1]),
                flush_mode=ns.flush_mode,
                register_at_begin=ns.register_at_begin == "yes",
                tls=ns.tls_client_auth if ns.tls else None,
            )
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
