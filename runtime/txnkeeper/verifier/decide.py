"""The verifier's decision: pod documents + rollover markers -> per-store verdicts -> overall report.

Pure functions only (no Spark, no I/O) so every rule that can block or allow a downgrade is unit-tested
directly. The Spark job runs `judge_pod` on executors and `finalize` on the driver.

The rule (PIP-160's downgrade check plus our data scan): a store is safe iff its oldest existing ledger
is newer than its LastBatchedLedger AND the pod's scan found no live entry carrying the batched magic.
Everything the verifier could not see for itself (unreachable pod, malformed answer, store expected but
not reported, store without a marker) is "not safe" with a reason naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from txnkeeper.verifier.model import (
    STORE_KINDS,
    PodEndpoint,
    PodOutcome,
    Report,
    RolloverMarkers,
    StoreVerdict,
)

# How many blocking stores / failed pods the one-line summary names before "and N more".
SUMMARY_LIMIT = 5
# How many live batched positions a reason quotes (the pod sends at most 20).
POSITIONS_QUOTED = 3


class MalformedDocument(ValueError):
    """A pod's ledgers document does not follow contracts §5."""


@dataclass(frozen=True, slots=True)
class StoreObservation:
    """One store as a pod reported it, after validation."""

    name: str
    kind: str
    ledgers: tuple[int, ...]
    oldest_live_ledger: int | None
    current_ledger: int
    live_batched: int
    live_unbatched: int
    live_batched_positions: tuple[str, ...]

    @property
    def oldest_ledger(self) -> int | None:
        """The oldest ledger that still exists: PIP-160 compares this, not the oldest with live data."""
        return min(self.ledgers) if self.ledgers else self.oldest_live_ledger


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ledger_id(value: object, field: str) -> int:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise MalformedDocument(f"{field} must be a non-negative integer, got {value!r}")
    return value  # type: ignore[return-value]


def parse_store(entry: object) -> StoreObservation:
    """Validate one element of the document's `stores` array (raises MalformedDocument)."""
    if not isinstance(entry, Mapping):
        raise MalformedDocument(f"store entry must be an object, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedDocument(f"store entry has no name: {entry.get('name')!r}")
    kind = entry.get("kind")
    if kind not in STORE_KINDS:
        raise MalformedDocument(f"kind must be one of {sorted(STORE_KINDS)}, got {kind!r}")
    raw_ledgers = entry.get("ledgers")
    if not isinstance(raw_ledgers, list):
        raise MalformedDocument(f"ledgers must be a list, got {type(raw_ledgers).__name__}")
    ledgers = tuple(_ledger_id(ledger, "ledgers[]") for ledger in raw_ledgers)
    if "oldestLiveLedger" not in entry:
        raise MalformedDocument("oldestLiveLedger is missing")
    raw_oldest = entry["oldestLiveLedger"]
    oldest = None if raw_oldest is None else _ledger_id(raw_oldest, "oldestLiveLedger")
    if oldest is not None and oldest not in ledgers:
        raise MalformedDocument(f"oldestLiveLedger {oldest} is not among the ledgers {list(ledgers)}")
    current = _ledger_id(entry.get("currentLedger"), "currentLedger")
    live = entry.get("liveEntries")
    if not isinstance(live, Mapping):
        raise MalformedDocument("liveEntries must be an object {batched, unbatched}")
    batched = live.get("batched")
    unbatched = live.get("unbatched")
    if not _is_int(batched) or batched < 0:  # type: ignore[operator]
        raise MalformedDocument(f"liveEntries.batched must be a non-negative integer, got {batched!r}")
    if not _is_int(unbatched) or unbatched < 0:  # type: ignore[operator]
        raise MalformedDocument(f"liveEntries.unbatched must be a non-negative integer, got {unbatched!r}")
    raw_positions = entry.get("liveBatchedPositions", [])
    if not isinstance(raw_positions, list) or not all(isinstance(p, str) for p in raw_positions):
        raise MalformedDocument("liveBatchedPositions must be a list of 'ledger:entry' strings")
    if raw_positions and batched == 0:
        raise MalformedDocument(
            f"liveBatchedPositions lists {len(raw_positions)} positions but liveEntries.batched is 0"
        )
    return StoreObservation(
        name=name,
        kind=str(kind),
        ledgers=ledgers,
        oldest_live_ledger=oldest,
        current_ledger=current,
        live_batched=int(batched),  # type: ignore[arg-type]
        live_unbatched=int(unbatched),  # type: ignore[arg-type]
        live_batched_positions=tuple(raw_positions),
    )


def judge_store(pod: str, observation: StoreObservation, last_batched: int | None) -> StoreVerdict:
    """Both checks for one store; the reason always says what was compared."""
    oldest = observation.oldest_ledger
    problems: list[str] = []
    if last_batched is None:
        problems.append("no rollover marker (LastBatchedLedger unknown): roll the store over first")
    elif oldest is not None and oldest <= last_batched:
        problems.append(
            f"oldest ledger {oldest} <= LastBatchedLedger {last_batched}: "
            "ledgers that may hold batched entries still exist"
        )
    if observation.live_batched > 0:
        quoted = ", ".join(observation.live_batched_positions[:POSITIONS_QUOTED])
        at = (
            f" (at {quoted}{', ...' if observation.live_batched > POSITIONS_QUOTED else ''})"
            if quoted
            else ""
        )
        problems.append(f"{observation.live_batched} live entries carry the batched magic{at}")
    if problems:
        reason = "; ".join(problems)
    elif oldest is None:
        reason = "store has no ledgers and no live batched entries"
    else:
        reason = f"oldest ledger {oldest} > LastBatchedLedger {last_batched}; no live batched entries"
    return StoreVerdict(
        pod=pod,
        store=observation.name,
        kind=observation.kind,
        last_batched_ledger=last_batched,
        oldest_live_ledger=oldest,
        live_batched_entries=observation.live_batched,
        safe=not problems,
        reason=reason,
    )


def _malformed_store(pod: str, name: str, kind: object, last_batched: int | None, why: str) -> StoreVerdict:
    return StoreVerdict(
        pod=pod,
        store=name,
        kind=kind if isinstance(kind, str) else None,
        last_batched_ledger=last_batched,
        oldest_live_ledger=None,
        live_batched_entries=None,
        safe=False,
        reason=f"malformed store entry from pod {pod}: {why}",
    )


def judge_document(
    endpoint: PodEndpoint, document: object, markers: Mapping[str, int]
) -> tuple[PodOutcome, list[StoreVerdict]]:
    """Validate a pod's `GET /admin/v1/stores/ledgers` answer and judge every store in it.

    A document that is broken as a whole fails the pod (its stores then show up as missing); a broken
    store entry that still has a name fails only that store.
    """
    if not isinstance(document, Mapping):
        return judge_failure(
            endpoint, f"malformed document: expected a JSON object, got {type(document).__name__}"
        )
    reported_pod = document.get("pod")
    if reported_pod is not None and not isinstance(reported_pod, str):
        return judge_failure(endpoint, f"malformed document: pod must be a string, got {reported_pod!r}")
    if endpoint.pod is not None and reported_pod is not None and reported_pod != endpoint.pod:
        return judge_failure(
            endpoint, f"endpoint answered as pod {reported_pod!r}, not {endpoint.pod!r}: wrong address"
        )
    stores = document.get("stores")
    if not isinstance(stores, list):
        return judge_failure(endpoint, "malformed document: 'stores' must be a list")
    pod = endpoint.pod or reported_pod or endpoint.label
    verdicts: list[StoreVerdict] = []
    seen: set[str] = set()
    for index, entry in enumerate(stores):
        try:
            observation = parse_store(entry)
        except MalformedDocument as exc:
            named = entry if isinstance(entry, Mapping) else {}
            raw_name = named.get("name")
            if not isinstance(raw_name, str) or not raw_name:
                return judge_failure(endpoint, f"malformed document: stores[{index}]: {exc}")
            seen.add(raw_name)
            verdicts.append(
                _malformed_store(pod, raw_name, named.get("kind"), markers.get(raw_name), str(exc))
            )
            continue
        if observation.name in seen:
            verdicts.append(
                _malformed_store(
                    pod,
                    observation.name,
                    observation.kind,
                    markers.get(observation.name),
                    "store reported twice in one document",
                )
            )
            continue
        seen.add(observation.name)
        verdicts.append(judge_store(pod, observation, markers.get(observation.name)))
    offload = document.get("offload")
    tier_only: int | None = None
    version: int | None = None
    if offload is not None:
        if not isinstance(offload, Mapping):
            return judge_failure(endpoint, "malformed document: 'offload' must be an object")
        tier_only, version = offload.get("tierOnlyLedgers"), offload.get("maxMetadataVersion")
        if not _count(tier_only) or not _count(version):
            return judge_failure(
                endpoint,
                "malformed document: offload.tierOnlyLedgers/maxMetadataVersion must be integers >= 0",
            )
    outcome = PodOutcome(
        pod=pod,
        endpoint=endpoint.url,
        ok=True,
        store_count=len(verdicts),
        error=None,
        tier_only_ledgers=tier_only,
        max_metadata_version=version,
    )
    return outcome, verdicts


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def judge_failure(endpoint: PodEndpoint, error: str) -> tuple[PodOutcome, list[StoreVerdict]]:
    """A pod whose document could not be obtained or understood: nothing it holds can be vouched for."""
    pod = endpoint.pod or endpoint.label
    return PodOutcome(pod=pod, endpoint=endpoint.url, ok=False, store_count=0, error=error), []


def _name_some(items: Sequence[str]) -> str:
    shown = "; ".join(items[:SUMMARY_LIMIT])
    more = len(items) - SUMMARY_LIMIT
    return shown + (f"; and {more} more" if more > 0 else "")


def finalize(
    generated_at: datetime,
    markers: RolloverMarkers,
    outcomes: Iterable[PodOutcome],
    verdicts: Iterable[StoreVerdict],
) -> Report:
    """Add the stores the markers expect but nobody reported, then decide overall.

    Safe overall only if at least one pod was asked, every pod answered with a valid document, every
    store is safe, and collection began after the markers were taken. Pods that all answered and host
    no store at all (and none is expected) hold no batched data: that is safe.
    """
    pods = sorted(outcomes, key=lambda outcome: (outcome.pod, outcome.endpoint or ""))
    judged = list(verdicts)
    failed = [outcome for outcome in pods if not outcome.ok]
    failed_text = _name_some([f"{outcome.pod}: {outcome.error}" for outcome in failed])
    reported = {verdict.store for verdict in judged}
    for name, last_batched in sorted(markers.ledgers.items()):
        if name in reported:
            continue
        reason = "expected by the rollover markers but not reported by any pod"
        if failed:
            reason += f" (pods that could not be checked: {failed_text})"
        judged.append(
            StoreVerdict(
                pod=None,
                store=name,
                kind=None,
                last_batched_ledger=last_batched,
                oldest_live_ledger=None,
                live_batched_entries=None,
                safe=False,
                reason=reason,
            )
        )
    judged.sort(key=lambda verdict: (verdict.safe, verdict.store, verdict.pod or ""))
    blocking = [verdict for verdict in judged if not verdict.safe]
    problems: list[str] = []
    if not pods:
        problems.append("no pods were checked")
    if failed:
        problems.append(f"{len(failed)} of {len(pods)} pods could not be checked: {failed_text}")
    if blocking:
        named = [f"{verdict.store}@{verdict.pod or '?'}: {verdict.reason}" for verdict in blocking]
        problems.append(f"{len(blocking)} of {len(judged)} stores not safe: {_name_some(named)}")
    offloaded = [outcome for outcome in pods if outcome.ok and not outcome.offload_clean]
    if offloaded:
        named = [
            f"{o.pod}: {o.tier_only_ledgers or 0} tier-only ledger(s), "
            f"metadata version {o.max_metadata_version}"
            for o in offloaded
        ]
        problems.append(
            f"{len(offloaded)} pod(s) hold offloaded data a downgrade cannot read (restore it first): "
            + _name_some(named)
        )
    if generated_at < markers.taken_at:
        problems.append(
            "collection began before the rollover markers were taken (clock skew or reused markers)"
        )
    if problems:
        reason = "NOT SAFE: " + " | ".join(problems)
    elif not judged:
        reason = f"safe: the {len(pods)} pods host no store, so no batched data can be live"
    else:
        reason = (
            f"safe: all {len(judged)} stores on {len(pods)} pods have their oldest ledger past "
            "LastBatchedLedger and no live batched entries"
        )
    return Report(
        generated_at=generated_at,
        markers=markers,
        safe=not problems,
        reason=reason,
        stores=tuple(judged),
        pods=tuple(pods),
    )


def failure_report(generated_at: datetime, markers: RolloverMarkers, error: str) -> Report:
    """What to publish when the verifier itself could not run: not safe, saying why."""
    return Report(
        generated_at=generated_at,
        markers=markers,
        safe=False,
        reason=f"NOT SAFE: verifier could not run: {error}",
        stores=(),
        pods=(),
    )


def report_summary(report: Report) -> dict[str, Any]:
    """Counts for humans and logs (the CLI prints this to stderr)."""
    return {
        "safe": report.safe,
        "stores": len(report.stores),
        "blocking": len(report.blocking()),
        "pods": len(report.pods),
        "podsFailed": sum(1 for outcome in report.pods if not outcome.ok),
        "reason": report.reason,
    }
