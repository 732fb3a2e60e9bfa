"""Value types shared by the verifier's parts, and their JSON form (contracts §7).

They live apart from the Spark job and the HTTP code so the pure decision logic, the report I/O and
the operator-facing helpers can all agree on one shape without importing Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

API_VERSION = "txnkeeper.io/v1"
REPORT_KIND = "VerifierReport"
MARKERS_KIND = "RolloverMarkers"
STORE_KINDS = frozenset({"txnlog", "pendingack"})


class VerifierInputError(ValueError):
    """A caller-supplied input (markers, endpoints, report) is unusable; the CLI maps it to exit 2."""


class VerifierInfraError(RuntimeError):
    """The verifier itself could not run (Spark, Kubernetes API, output); the CLI maps it to exit 2."""


def format_time(moment: datetime) -> str:
    """RFC3339 in UTC with a `Z` suffix; microseconds kept so two instants never collide."""
    if moment.tzinfo is None:
        raise VerifierInputError("timestamps must carry a timezone")
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: object, what: str) -> datetime:
    if not isinstance(text, str):
        raise VerifierInputError(f"{what} must be an RFC3339 string, got {type(text).__name__}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise VerifierInputError(f"{what} is not an RFC3339 timestamp: {text!r}") from exc
    if moment.tzinfo is None:
        raise VerifierInputError(f"{what} has no timezone: {text!r}")
    return moment.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """One pod's admin API.

    `pod` is the name the caller expects (checked against the document's `pod` field when given);
    `url` is None when the pod has no address yet, and `note` then says why.
    """

    pod: str | None
    url: str | None
    note: str | None = None

    def __post_init__(self) -> None:
        if self.pod is None and self.url is None:
            raise VerifierInputError("an endpoint needs a pod name or a URL")

    @property
    def label(self) -> str:
        """How reasons name this endpoint: `pod (url)`, or whichever of the two is known."""
        if self.pod is not None and self.url is not None:
            return f"{self.pod} ({self.url})"
        return self.pod if self.pod is not None else str(self.url)


@dataclass(frozen=True)
class RolloverMarkers:
    """LastBatchedLedger per store, and the instant the rollover that produced them was taken.

    A report only counts for the markers it was computed against (see `freshness`): a later rollover
    means new markers and a new verification.
    """

    taken_at: datetime
    ledgers: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.taken_at.tzinfo is None:
            raise VerifierInputError("markers takenAt must carry a timezone")
        for name, ledger in self.ledgers.items():
            if not isinstance(name, str) or not name:
                raise VerifierInputError(f"marker store name must be a non-empty string, got {name!r}")
            if isinstance(ledger, bool) or not isinstance(ledger, int) or ledger < -1:
                raise VerifierInputError(f"marker for store {name!r} must be a ledger id, got {ledger!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": MARKERS_KIND,
            "takenAt": format_time(self.taken_at),
            "stores": dict(sorted(self.ledgers.items())),
        }

    @classmethod
    def from_dict(cls, doc: object) -> RolloverMarkers:
        if not isinstance(doc, Mapping):
            raise VerifierInputError("markers must be a JSON object with takenAt and stores")
        if "takenAt" not in doc:
            raise VerifierInputError("markers have no takenAt: a report cannot be tied to them")
        stores = doc.get("stores")
        if not isinstance(stores, Mapping):
            raise VerifierInputError("markers.stores must be an object {storeName: lastBatchedLedger}")
        return cls(taken_at=parse_time(doc["takenAt"], "markers.takenAt"), ledgers=dict(stores))


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    """The decision for one store as reported by one pod (or expected by the markers and not found)."""

    pod: str | None
    store: str
    kind: str | None
    last_batched_ledger: int | None
    oldest_live_ledger: int | None
    live_batched_entries: int | None
    safe: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "store": self.store,
            "kind": self.kind,
            "lastBatchedLedger": self.last_batched_ledger,
            "oldestLiveLedger": self.oldest_live_ledger,
            "liveBatchedEntries": self.live_batched_entries,
            "safe": self.safe,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StoreVerdict:
        return cls(
            pod=doc["pod"],
            store=doc["store"],
            kind=doc["kind"],
            last_batched_ledger=doc["lastBatchedLedger"],
            oldest_live_ledger=doc["oldestLiveLedger"],
            live_batched_entries=doc["liveBatchedEntries"],
            safe=bool(doc["safe"]),
            reason=doc["reason"],
        )


@dataclass(frozen=True, slots=True)
class PodOutcome:
    """How collecting one pod's document went: `error` names what failed (unreachable, malformed...)."""

    pod: str
    endpoint: str | None
    ok: bool
    store_count: int
    error: str | None
    # The pod's offload state (its ledgers document's "offload"); None: it reported none (a release
    # without offload). A downgrade is safe only with no tier-only ledger and metadata version 1.
    tier_only_ledgers: int | None = None
    max_metadata_version: int | None = None

    @property
    def offload_clean(self) -> bool:
        return not self.tier_only_ledgers and (self.max_metadata_version or 1) <= 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "endpoint": self.endpoint,
            "ok": self.ok,
            "storeCount": self.store_count,
            "error": self.error,
            "tierOnlyLedgers": self.tier_only_ledgers,
            "maxMetadataVersion": self.max_metadata_version,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PodOutcome:
        tier = doc.get("tierOnlyLedgers")
        version = doc.get("maxMetadataVersion")
        return cls(
            pod=doc["pod"],
            endpoint=doc["endpoint"],
            ok=bool(doc["ok"]),
            store_count=int(doc["storeCount"]),
            error=doc["error"],
            tier_only_ledgers=None if tier is None else int(tier),
            max_metadata_version=None if version is None else int(version),
        )


@dataclass(frozen=True, slots=True)
class ExecutorTasks:
    """How many of a job's tasks (Spark partitions) one executor ran, and on which host.

    `executor` is Spark's executor id ("0", "1", ...; "driver" in local mode, where the driver's JVM
    runs the tasks); it shows that, and how evenly, a distributed run spread the work.
    """

    executor: str
    host: str
    tasks: int

    def to_dict(self) -> dict[str, Any]:
        return {"executor": self.executor, "host": self.host, "tasks": self.tasks}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ExecutorTasks:
        return cls(executor=str(doc["executor"]), host=str(doc["host"]), tasks=int(doc["tasks"]))


@dataclass(frozen=True)
class Report:
    """The verifier's output (contracts §7).

    `generated_at` is the instant collection began: every pod document behind this report was fetched
    after it, which is what lets a reader compare it with the markers' instant.
    """

    generated_at: datetime
    markers: RolloverMarkers
    safe: bool
    reason: str
    stores: tuple[StoreVerdict, ...]
    pods: tuple[PodOutcome, ...]
    # Where the Spark tasks ran. Empty when no task ran, and when read from a report of a verifier that
    # predates the field (the key is optional for readers).
    executors: tuple[ExecutorTasks, ...] = ()

    def blocking(self) -> list[StoreVerdict]:
        return [verdict for verdict in self.stores if not verdict.safe]

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": REPORT_KIND,
            "generatedAt": format_time(self.generated_at),
            "markersTakenAt": format_time(self.markers.taken_at),
            "markers": dict(sorted(self.markers.ledgers.items())),
            "safe": self.safe,
            "reason": self.reason,
            "stores": [verdict.to_dict() for verdict in self.stores],
            "pods": [outcome.to_dict() for outcome in self.pods],
            "executors": [row.to_dict() for row in self.executors],
        }

    @classmethod
    def from_dict(cls, doc: object) -> Report:
        if not isinstance(doc, Mapping) or doc.get("kind") != REPORT_KIND:
            raise VerifierInputError(f"not a {REPORT_KIND} document")
        try:
            markers = RolloverMarkers(
                taken_at=parse_time(doc["markersTakenAt"], "report.markersTakenAt"),
                ledgers=dict(doc["markers"]),
            )
            return cls(
                generated_at=parse_time(doc["generatedAt"], "report.generatedAt"),
                markers=markers,
                safe=bool(doc["safe"]),
                reason=str(doc["reason"]),
                stores=tuple(StoreVerdict.from_dict(row) for row in doc["stores"]),
                pods=tuple(PodOutcome.from_dict(row) for row in doc["pods"]),
                executors=tuple(ExecutorTasks.from_dict(row) for row in doc.get("executors") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, VerifierInputError):
                raise
            raise VerifierInputError(f"malformed {REPORT_KIND}: {exc!r}") from exc
