"""`txnkeeper verify-offload`: audit the tier against what the pods' metadata says it holds (Spark).

Why: offload deletes local files once a segment is recorded Offloaded, so from then on the blob store
is the only copy. This job reads the objects directly from the blob store (not through a pod) and
checks, for every Offloaded segment any store pod's metadata records: both objects exist, the index
decodes and its lengths match the data object, and a sample of blocks read back with their CRCs and
structure intact; then it lists the store and reports orphans (objects no segment of any pod names).
Segments are spread over Spark partitions; each partition opens its own blob-store client.

Then, for a sample of the Offloaded segments (``--compare-segments``), it compares what the topic data
source (``txnkeeper.spark``) reads from the tier with what the pod serves for the same positions
(``GET /admin/v1/topics/entries``, from its local files while it keeps them): an entry that differs is
a ``mismatch`` finding naming pod, topic, segment and position. A pod without that verb (an older
release) or no longer holding the ledger is listed under ``comparisonsSkipped``, not a finding.

Input: the pods (``--endpoint``/``--endpoints-file`` as for verify-invalidation, or in-cluster
``--selector`` discovery, which is how the operator's CronJob finds them; each pod's
GET /admin/v1/offload/summary lists its segments) and the blob store's settings (``--offload-config``
FILE or ``--offload-json`` JSON: Pulsar key names, as in the pods' config file). Output: a JSON report
(``--output``: stdout, a file or ``configmap:NAME``, key report.json, which the operator reads into
``status.offloadAudit``); exit 0 when nothing was found, 1 on findings, 2 on a usage or infrastructure
error (with a ConfigMap target, an ``ok: false`` report carrying the ``error`` is still published, so
the status never keeps claiming a clean tier the last run could not check).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from txnkeeper.contract import tls
from txnkeeper.ledger.offload.blobstore import BlobStore
from txnkeeper.ledger.offload.config import OffloadConfig
from txnkeeper.ledger.offload.errors import BlobNotFound, OffloadError
from txnkeeper.ledger.offload.offloader import open_blob_store
from txnkeeper.ledger.offload.reader import SegmentReader
from txnkeeper.ledger.offload.writer import INDEX_SUFFIX
from txnkeeper.spark import store_http
from txnkeeper.spark.entries import PartReadError, tier_entries
from txnkeeper.spark.plan import ReadOptions, TierPart, TopicView
from txnkeeper.verifier import k8s
from txnkeeper.verifier.executors import ExecutorRef, current_executor, tally
from txnkeeper.verifier.inputs import dedupe_endpoints, load_endpoints, parse_endpoint
from txnkeeper.verifier.model import PodEndpoint, VerifierInfraError, VerifierInputError
from txnkeeper.verifier.registration import await_executors
from txnkeeper.verifier.shipping import ship_executor_code

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COMMAND = "verify-offload"
SUMMARY_PATH = "/admin/v1/offload/summary"
DEFAULT_SAMPLE_BLOCKS = 4
DEFAULT_COMPARE_SEGMENTS = 2
MAX_COMPARE_ENTRIES = 2_000  # per compared segment: its first entries, in position order


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """No proxy (pods are reached directly); https:// admin URLs (the job mounts its resource's TLS
    Secret) verified against TXNKEEPER_TLS_CA_FILE, presenting the job's certificate (contract/tls.py)."""
    return tls.url_opener(tls.TlsClientSettings.from_env())


@dataclass(frozen=True, slots=True)
class SegmentRef:
    pod: str
    store: str
    uuid: str
    status: str
    url: str | None = None  # the pod's admin API (where its entries are read for a comparison)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong: ``kind`` is missing-object, corrupt, orphan, pod-unreadable or mismatch."""

    kind: str
    detail: str
    pod: str | None = None
    store: str | None = None
    uuid: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class SegmentResult:
    ref: SegmentRef
    blocks: int
    sampled: int
    findings: tuple[Finding, ...]
    compared: int = 0  # entries compared between the tier and the pod
    skipped: str | None = None  # why a comparison asked for did not happen


def store_config(properties: Mapping[str, Any]) -> OffloadConfig:
    """The blob-store part of an offload section (policy keys ignored); VerifierInputError if bad."""
    known = {f.name for f in fields(OffloadConfig)}
    try:
        return OffloadConfig.from_properties({k: str(v) for k, v in properties.items() if k in known})
    except (OffloadError, ValueError) as exc:
        raise VerifierInputError(f"bad offload settings: {exc}") from exc


# ---- collecting the segments the pods record -------------------------------------------------------


def fetch_segments(
    endpoints: Sequence[PodEndpoint], timeout_s: float
) -> tuple[list[SegmentRef], list[Finding]]:
    refs: list[SegmentRef] = []
    problems: list[Finding] = []
    for endpoint in endpoints:
        pod = endpoint.pod or endpoint.label
        if endpoint.url is None:
            problems.append(Finding("pod-unreadable", "no address", pod=pod))
            continue
        url = endpoint.url.rstrip("/") + SUMMARY_PATH
        try:
            with _opener().open(url, timeout=timeout_s) as response:
                doc = json.loads(response.read())
            for store in doc["stores"]:
                for seg in store.get("segmentList", []):
                    refs.append(
                        SegmentRef(
                            pod, str(store["name"]), str(seg["uuid"]), str(seg["status"]), endpoint.url
                        )
                    )
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as exc:
            # Without this pod's segments its objects would look like orphans: the audit cannot pass.
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            described = tls.describe_url_error(reason, url, tls.TlsClientSettings.from_env())
            detail = described or f"{type(exc).__name__}: {exc}"
            problems.append(Finding("pod-unreadable", f"{url}: {detail}", pod=pod))
    return refs, problems


# ---- checking one segment (runs on the executors) --------------------------------------------------


async def _check_segment(store: BlobStore, ref: SegmentRef, sample: int) -> SegmentResult:
    reader = SegmentReader(store, ref.uuid)

    def found(kind: str, detail: str, key: str | None = None) -> SegmentResult:
        finding = Finding(kind, detail, ref.pod, ref.store, ref.uuid, key)
        return SegmentResult(ref, 0, 0, (finding,))

    try:
        index = await reader.index()
    except BlobNotFound as exc:
        return found("missing-object", str(exc), ref.uuid + INDEX_SUFFIX)
    except OffloadError as exc:
        return found("corrupt", str(exc), getattr(exc, "key", None))
    blocks = [(led, i) for led in index.ledgers for i in range(len(led.entries))]
    rng = random.Random(ref.uuid)  # the same blocks every run: findings are reproducible
    chosen = rng.sample(blocks, min(sample, len(blocks)))
    findings: list[Finding] = []
    for led, i in chosen:
        first = led.entries[i].first_entry_id
        last = led.entries[i + 1].first_entry_id - 1 if i + 1 < len(led.entries) else led.info.last_entry_id
        if last is None:
            continue
        try:
            await reader.read_entries(led.info.ledger_id, first, last)
        except OffloadError as exc:
            findings.append(
                Finding("corrupt", str(exc), ref.pod, ref.store, ref.uuid, getattr(exc, "key", None))
            )
    return SegmentResult(ref, len(blocks), len(chosen), tuple(findings))


def check_segments(
    refs: Iterable[SegmentRef],
    properties: Mapping[str, Any],
    sample: int,
    compare: frozenset[str] = frozenset(),
) -> Iterator[SegmentResult]:
    """Check a group of segments (one Spark partition) with one blob-store client; compare those whose
    uuid is in ``compare`` (and that checked out) with what their pod serves."""
    batch = list(refs)

    async def run() -> list[tuple[SegmentResult, list[tuple[int, int, int]]]]:
        store = open_blob_store(store_config(properties))
        try:
            out = []
            for ref in batch:
                result = await _check_segment(store, ref, sample)
                ranges = []
                if ref.uuid in compare and not result.findings:
                    ranges = _ranges(await SegmentReader(store, ref.uuid).index())
                out.append((result, ranges))
            return out
        finally:
            await store.close()

    for result, ranges in asyncio.run(run()) if batch else []:
        yield compare_segment(result, ranges, properties) if ranges else result


def _ranges(index: Any) -> list[tuple[int, int, int]]:
    """(ledger, first, last) of the segment's entries, cut to the first MAX_COMPARE_ENTRIES."""
    out: list[tuple[int, int, int]] = []
    budget = MAX_COMPARE_ENTRIES
    for led in index.ledgers:
        first, last = led.entries[0].first_entry_id, led.info.last_entry_id
        if last is None or budget <= 0:
            continue
        last = min(last, first + budget - 1)
        out.append((led.info.ledger_id, first, last))
        budget -= last - first + 1
    return out


def compare_segment(
    result: SegmentResult, ranges: list[tuple[int, int, int]], properties: Mapping[str, Any]
) -> SegmentResult:
    """What the data source reads from the tier against what the pod serves, entry by entry."""
    ref = result.ref
    if ref.url is None:
        return replace(result, skipped="the pod has no address")
    view = TopicView(ref.store, ref.url, frozenset(), frozenset(), None, None)
    options = ReadOptions(topics=(ref.store,), admin_urls=(ref.url,), offload=dict(properties))
    tier = tier_entries(TierPart(view, ref.uuid, tuple(ranges)), options)
    pod = _pod_entries(ref, ranges, options)
    compared = 0
    try:
        for item, served in zip_longest(tier, pod):
            if item is None or served is None:
                what = "more entries than" if item is None else f"no entry {item[0]}:{item[1]}, unlike"
                detail = (
                    f"segment {ref.uuid} of {ref.store}: after {compared} equal entries the pod serves "
                    f"{what} the tier"
                )
                finding = Finding("mismatch", detail, ref.pod, ref.store, ref.uuid)
                return replace(result, compared=compared, findings=(*result.findings, finding))
            ledger_id, entry_id, stored = item
            if stored != served:
                detail = (
                    f"entry {ledger_id}:{entry_id} of {ref.store}: the tier holds {len(stored)} bytes "
                    f"(CRC-32 {zlib.crc32(stored):08x}), the pod serves {len(served)} bytes (CRC-32 "
                    f"{zlib.crc32(served):08x}); find out which copy is right before the pod deletes its own"
                )
                finding = Finding("mismatch", detail, ref.pod, ref.store, ref.uuid)
                return replace(result, compared=compared + 1, findings=(*result.findings, finding))
            compared += 1
    except store_http.TopicNotHere as exc:
        return replace(result, compared=compared, skipped=str(exc))
    except (PartReadError, store_http.StoreReadError, ValueError) as exc:
        finding = Finding(
            "pod-unreadable", f"comparing segment {ref.uuid}: {exc}", ref.pod, ref.store, ref.uuid
        )
        return replace(result, compared=compared, findings=(*result.findings, finding))
    finally:
        tier.close()  # closes its blob-store client and event loop when the comparison stopped early
    return replace(result, compared=compared)


def _pod_entries(
    ref: SegmentRef, ranges: list[tuple[int, int, int]], options: ReadOptions
) -> Iterator[bytes]:
    assert ref.url is not None
    for ledger_id, first, last in ranges:
        entry = first
        while entry <= last:
            limits = (min(1_000, last - entry + 1), 4 * 1024 * 1024)
            got = store_http.read_entries(ref.url, ref.store, (ledger_id, entry), limits, options.timeout_s)
            if not got.entries:
                raise store_http.TopicNotHere(
                    f"the pod holds {got.durable_entries} entries of ledger {ledger_id}, not {entry}..{last}"
                )
            yield from got.entries[: last - entry + 1]
            entry += len(got.entries)


def check_partition(
    refs: Iterable[SegmentRef],
    properties: Mapping[str, Any],
    sample: int,
    compare: frozenset[str] = frozenset(),
) -> Iterator[tuple[ExecutorRef, list[SegmentResult]]]:
    """One Spark task: its executor, and its segments' results."""
    yield current_executor(), list(check_segments(refs, properties, sample, compare))


def find_orphans(keys: Iterable[str], referenced: set[str]) -> list[Finding]:
    """Objects whose segment uuid no pod's metadata names (any status: Assigned is still uploading)."""
    out = []
    for key in keys:
        uuid = key[: -len(INDEX_SUFFIX)] if key.endswith(INDEX_SUFFIX) else key
        if uuid not in referenced:
            out.append(Finding("orphan", "no segment of any pod names this object", uuid=uuid, key=key))
    return out


# ---- the job ---------------------------------------------------------------------------------------


def audit(
    endpoints: Sequence[PodEndpoint],
    properties: Mapping[str, Any],
    *,
    spark: SparkSession,
    sample_blocks: int = DEFAULT_SAMPLE_BLOCKS,
    timeout_s: float = 10.0,
    compare_segments: int = DEFAULT_COMPARE_SEGMENTS,
) -> dict[str, Any]:
    """The audit report (module docstring); ``ok`` is false when anything was found."""
    if not endpoints:
        raise VerifierInputError("no pod endpoints: the tier cannot be audited against nothing")
    store_config(properties)  # refuse bad settings before Spark starts anything
    generated_at = datetime.now(UTC)
    props = dict(properties)

    async def listing() -> list[str]:
        store = open_blob_store(store_config(props))
        try:
            return await store.list("")
        finally:
            await store.close()

    # List before asking the pods: every object listed then belongs to a segment some pod's metadata
    # already names (Assigned before its first upload), so a segment started during the audit cannot
    # look like an orphan.
    try:
        keys = asyncio.run(listing())
    except OffloadError as exc:
        raise VerifierInfraError(f"cannot list the blob store: {exc}") from exc
    refs, findings = fetch_segments(endpoints, timeout_s)
    offloaded = [r for r in refs if r.status == "Offloaded"]
    candidates = sorted(r.uuid for r in offloaded if r.url is not None)
    # The same segments every run over the same tier: findings are reproducible.
    rng = random.Random(len(candidates))
    compare = frozenset(rng.sample(candidates, min(max(compare_segments, 0), len(candidates))))
    context = spark.sparkContext
    ship_executor_code(context)
    await_executors(context)
    partitions = max(1, min(len(offloaded), int(context.defaultParallelism) * 2))
    try:
        tasks = (
            context.parallelize(offloaded, partitions)
            .mapPartitions(lambda part: check_partition(part, props, sample_blocks, compare))
            .collect()
        )
    except Exception as exc:
        raise VerifierInfraError(f"Spark job failed: {type(exc).__name__}: {exc}") from exc
    results = [result for _, batch in tasks for result in batch]
    for result in results:
        findings.extend(result.findings)

    if not any(f.kind == "pod-unreadable" for f in findings):  # else every object of that pod is "orphan"
        findings.extend(find_orphans(keys, {r.uuid for r in refs}))
    return {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "OffloadAuditReport",
        "generatedAt": generated_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ok": not findings,
        "pods": len(endpoints),
        "segments": len(refs),
        "segmentsChecked": len(results),
        "blocksSampled": sum(r.sampled for r in results),
        "segmentsCompared": sum(
            1 for r in results if r.ref.uuid in compare and r.skipped is None and r.compared
        ),
        "entriesCompared": sum(r.compared for r in results),
        "comparisonsSkipped": [
            {"pod": r.ref.pod, "uuid": r.ref.uuid, "reason": r.skipped} for r in results if r.skipped
        ],
        "objects": len(keys),
        "findings": [{k: v for k, v in asdict(f).items() if v is not None} for f in findings],
        "executors": [row.to_dict() for row in tally(ref for ref, _ in tasks)],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint", action="append", default=[], help="[POD=]URL of a store pod's admin API"
    )
    parser.add_argument("--endpoints-file", help="JSON list of {pod, url}")
    parser.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="LABELS",
        help="in-cluster: audit against every pod matching this label selector (repeatable)",
    )
    parser.add_argument("--admin-port", type=int, default=k8s.DEFAULT_ADMIN_PORT, help="pods' admin port")
    parser.add_argument("--namespace", help="namespace of the pods and ConfigMap (default: the pod's own)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    settings = parser.add_mutually_exclusive_group(required=True)
    settings.add_argument("--offload-config", help="JSON file: the offload section (Pulsar key names)")
    settings.add_argument("--offload-json", help="the offload section as JSON text")
    parser.add_argument(
        "--sample-blocks", type=int, default=DEFAULT_SAMPLE_BLOCKS, help="blocks read per segment"
    )
    parser.add_argument(
        "--compare-segments",
        type=int,
        default=DEFAULT_COMPARE_SEGMENTS,
        help="segments whose entries are compared between the tier and their pod",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master URL")
    parser.add_argument(
        "--output",
        default="-",
        help=f"- (stdout), a report file, or configmap:NAME (key {k8s.REPORT_KEY})",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per pod request")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="audit offloaded segments in the blob store against the pods' metadata (Spark job)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _endpoints(ns: argparse.Namespace, kube: k8s.LazyKube) -> list[PodEndpoint]:
    endpoints = [parse_endpoint(text) for text in ns.endpoint]
    if ns.endpoints_file:
        endpoints += load_endpoints(ns.endpoints_file)
    if ns.selector:
        endpoints += k8s.discover_pods(kube.api, kube.namespace, ns.selector, ns.admin_port, tls=_tls_on())
    if not endpoints:
        raise VerifierInputError("no pods to audit against: give --endpoint, --endpoints-file or --selector")
    return dedupe_endpoints(endpoints)


def _configmap_target(output: str) -> str | None:
    if not output.startswith("configmap:"):
        return None
    name = output.removeprefix("configmap:")
    if not name:
        raise VerifierInputError("--output configmap:NAME needs a ConfigMap name")
    return name


def _publish(text: str, output: str, kube: k8s.LazyKube) -> None:
    configmap = _configmap_target(output)
    if configmap is not None:
        labels = {"app.kubernetes.io/component": "offload-audit", "app.kubernetes.io/part-of": "txnkeeper"}
        k8s.write_configmap_key(kube.api, kube.namespace, configmap, k8s.REPORT_KEY, text, labels=labels)
    elif output == "-":
        print(text)
    else:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")


def failure_report(error: str) -> dict[str, Any]:
    """What a run that could not audit publishes: not ok, saying why (no findings were looked for)."""
    return {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "OffloadAuditReport",
        "generatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ok": False,
        "error": error,
        "findings": [],
    }


def run(ns: argparse.Namespace) -> int:
    from txnkeeper.verifier.job import spark_running, spark_session

    kube = k8s.LazyKube(ns.kubeconfig, ns.namespace)
    try:
        _configmap_target(ns.output)  # a bad target is a usage error before anything runs
        endpoints = _endpoints(ns, kube)
        if ns.sample_blocks < 0:
            raise VerifierInputError(f"--sample-blocks must be >= 0, got {ns.sample_blocks}")
        if ns.compare_segments < 0:
            raise VerifierInputError(f"--compare-segments must be >= 0, got {ns.compare_segments}")
        text = ns.offload_json
        if ns.offload_config:
            with open(ns.offload_config, encoding="utf-8") as handle:
                text = handle.read()
        properties = json.loads(text)
        if not isinstance(properties, dict):
            raise VerifierInputError("the offload settings must be a JSON object of Pulsar keys")
        if not properties:
            raise VerifierInputError(
                "no offload settings (an empty object): the resource has no offload its release can use,"
                " so there is no tier to audit; set spec.offload (release 3.x) first"
            )
        owned = not spark_running()  # a session the caller runs (tests, the fleet) is left running
        spark = spark_session(ns.master)
        try:
            report = audit(
                endpoints,
                properties,
                spark=spark,
                sample_blocks=ns.sample_blocks,
                timeout_s=ns.timeout,
                compare_segments=ns.compare_segments,
            )
        finally:
            if owned:
                spark.stop()
    except (VerifierInputError, VerifierInfraError, OSError, ValueError) as exc:
        print(f"txnkeeper {COMMAND}: {exc}", file=sys.stderr)
        if _is_configmap(ns.output):
            try:
                _publish(json.dumps(failure_report(str(exc)), indent=2, sort_keys=True), ns.output, kube)
            except (VerifierInputError, VerifierInfraError) as again:
                print(f"txnkeeper {COMMAND}: could not publish the failure report: {again}", file=sys.stderr)
        return 2
    try:
        _publish(json.dumps(report, indent=2, sort_keys=True), ns.output, kube)
    except (VerifierInputError, VerifierInfraError, OSError) as exc:
        print(f"txnkeeper {COMMAND}: cannot write the report: {exc}", file=sys.stderr)
        return 2
    return 0 if report["ok"] else 1


def _is_configmap(output: str) -> bool:
    return output.startswith("configmap:") and output != "configmap:"


def _tls_on() -> bool:
    """Pods are reached over https when the job has a CA to verify them (TXNKEEPER_TLS_CA_FILE, from
    the mounted Secret; contract/tls.py)."""
    return tls.TlsClientSettings.from_env() is not None
