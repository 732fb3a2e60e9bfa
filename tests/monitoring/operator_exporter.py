"""The operator's real metrics endpoint (txnkeeper_operator.metrics) with two resources' reconcile
outcomes recorded, for the Prometheus scrape test: no API server runs there, so nothing reconciles;
what is served is the operator's own exposition code. Prints its port, then serves until killed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from txnkeeper_operator import metrics
from txnkeeper_operator.engine import Phase


def main() -> None:
    now = datetime.now(UTC)
    metrics.RESOURCES.record(
        ("test", "PendingAckStore", "pas"),
        metrics.ResourceRecord(
            phase=Phase.DOWNGRADE_BLOCKED, verifier_scheduled=True, report_generated_at=now, report_safe=False
        ),
    )
    metrics.RESOURCES.record(
        ("test", "TransactionCoordinator", "tc"),
        metrics.ResourceRecord(
            phase=Phase.READY, verifier_scheduled=False, report_generated_at=None, report_safe=None
        ),
    )
    metrics.RESOURCES.failed(("test", "TransactionCoordinator", "tc"))
    port = metrics.serve(0, address="127.0.0.1")
    print(port, flush=True)
    threading.Event().wait()  # serve until the test kills this process


if __name__ == "__main__":
    main()
