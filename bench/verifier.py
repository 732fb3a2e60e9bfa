"""Benchmark: verify 10,000 stores (100 synthetic pods x 100 stores) on local[2]; prints JSON.

Figures: wall time including the Spark session start (the target is <= 60 s), the job alone, a second
(warm) run, and a baseline in the same run: the same fetch-and-judge code on the driver alone, without
Spark. The pods are real aiohttp endpoints on 127.0.0.1 serving synthetic ledgers documents; one store
in the middle holds a live batched entry, and the run fails if the verifier does not single it out.

    .venv/bin/python bench/verifier.py [--pods 100] [--stores-per-pod 100] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta

from txnkeeper.verifier import RolloverMarkers, verify
from txnkeeper.verifier.decide import finalize
from txnkeeper.verifier.job import FetchSettings, check_pods, spark_session
from txnkeeper.verifier.model import PodEndpoint
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry

TARGET_SECONDS = 60.0


def build_fleet(
    pods: SyntheticPods, pod_count: int, per_pod: int
) -> tuple[list[PodEndpoint], dict[str, int], str]:
    endpoints: list[PodEndpoint] = []
    markers: dict[str, int] = {}
    culprit = ""
    for p in range(pod_count):
        stores = []
        for s in range(per_pod):
            name = f"persistent://bench/ns/topic-{p}-{s}-sub__transaction_pending_ack"
            markers[name] = 7
            batched = 1 if (p, s) == (pod_count // 2, per_pod // 2) else 0
            if batched:
                culprit = name
            stores.append(
                store_entry(name, [8 + s % 4, 40], kind="pendingack", batched=batched, unbatched=50)
            )
        endpoints.append(pods.add_pod(f"store-{p}", PodAnswer.document(pod_document(f"store-{p}", stores))))
    return endpoints, markers, culprit


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--stores-per-pod", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    with SyntheticPods() as pods:
        endpoints, ledgers, culprit = build_fleet(pods, args.pods, args.stores_per_pod)
        markers = RolloverMarkers(datetime.now(UTC) - timedelta(seconds=1), ledgers)
        stores = len(ledgers)

        started = time.perf_counter()
        spark = spark_session(args.master)
        session_ready = time.perf_counter()
        spark.sparkContext.setLogLevel("ERROR")
        report = verify(endpoints, markers, spark=spark)
        first_done = time.perf_counter()
        warm = verify(endpoints, markers, spark=spark)
        warm_done = time.perf_counter()
        spark.stop()

        baseline_started = time.perf_counter()
        results = list(check_pods(endpoints, markers.ledgers, FetchSettings()))
        baseline = finalize(
            datetime.now(UTC), markers, [o for o, _ in results], [v for _, vs in results for v in vs]
        )
        baseline_done = time.perf_counter()

    correct = all(
        [r.store for r in candidate.blocking()] == [culprit] and len(candidate.stores) == stores
        for candidate in (report, warm, baseline)
    )
    wall = first_done - started
    figures = {
        "benchmark": "verifier",
        "master": args.master,
        "pods": args.pods,
        "stores": stores,
        "sessionStartSeconds": round(session_ready - started, 3),
        "jobSeconds": round(first_done - session_ready, 3),
        "wallSecondsIncludingSessionStart": round(wall, 3),
        "storesPerSecond": round(stores / wall, 1),
        "warmRunSeconds": round(warm_done - first_done, 3),
        "warmStoresPerSecond": round(stores / (warm_done - first_done), 1),
        "baselineDriverOnlySeconds": round(baseline_done - baseline_started, 3),
        "targetSeconds": TARGET_SECONDS,
        "withinTarget": wall <= TARGET_SECONDS,
        "verdictCorrect": correct,
    }
    print(json.dumps(figures))
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
