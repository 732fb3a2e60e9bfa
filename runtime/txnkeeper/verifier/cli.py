"""`txnkeeper verify-invalidation`: the verifier as a command (also `python -m txnkeeper.verifier`
and `spark-submit .../txnkeeper/verifier/__main__.py`).

Exit codes: 0 safe, 1 not safe, 2 usage or infrastructure error (bad flags or inputs, Spark or the
Kubernetes API unavailable, report not writable). When the markers are known, an infrastructure error
still publishes a "not safe" report saying why, so the operator never waits on a report that will not
come.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from txnkeeper.contract import tls
from txnkeeper.verifier import k8s
from txnkeeper.verifier.decide import failure_report, report_summary
from txnkeeper.verifier.fetch import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S
from txnkeeper.verifier.inputs import (
    dedupe_endpoints,
    load_endpoints,
    load_markers,
    parse_endpoint,
    parse_markers,
)
from txnkeeper.verifier.job import verify
from txnkeeper.verifier.model import (
    PodEndpoint,
    Report,
    RolloverMarkers,
    VerifierInfraError,
    VerifierInputError,
)

COMMAND = "verify-invalidation"
EXIT_SAFE = 0
EXIT_NOT_SAFE = 1
EXIT_ERROR = 2


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """Where the report goes: stdout (`-`), a file (`PATH` or `file:PATH`), or `configmap:NAME`."""

    kind: str
    where: str

    @classmethod
    def parse(cls, text: str) -> OutputTarget:
        if text == "-":
            return cls("stdout", "-")
        if text.startswith("configmap:"):
            name = text.removeprefix("configmap:")
            if not name:
                raise VerifierInputError("--output configmap:NAME needs a ConfigMap name")
            return cls("configmap", name)
        path = text.removeprefix("file:")
        if not path:
            raise VerifierInputError("--output file:PATH needs a path")
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            # Fail before the Spark job, not after it.
            raise VerifierInputError(f"--output {text}: directory {parent} does not exist")
        return cls("file", path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("pods to check (any combination)")
    where.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="[POD=]URL",
        help="a pod's admin API base URL, e.g. pod-0=http://10.0.0.5:8080 (repeatable)",
    )
    where.add_argument(
        "--endpoints-file",
        action="append",
        default=[],
        metavar="FILE",
        help='JSON list of URLs or {"pod", "url"} objects (repeatable; - for stdin)',
    )
    where.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="LABELS",
        help="in-cluster: check every pod matching this label selector (repeatable)",
    )
    where.add_argument("--admin-port", type=int, default=k8s.DEFAULT_ADMIN_PORT, help="pods' admin port")
    markers = parser.add_argument_group("rollover markers (exactly one)")
    source = markers.add_mutually_exclusive_group()
    source.add_argument(
        "--markers", metavar="FILE", help='markers JSON file {"takenAt", "stores"} (- for stdin)'
    )
    source.add_argument("--markers-json", metavar="JSON", help="markers JSON given inline")
    source.add_argument(
        "--markers-configmap",
        metavar="NAME[/KEY]",
        help=f"in-cluster: markers from a ConfigMap key (default key {k8s.MARKERS_KEY})",
    )
    kube = parser.add_argument_group("Kubernetes")
    kube.add_argument("--namespace", help="namespace of the pods and ConfigMaps (default: the pod's own)")
    kube.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: spark-submit's when launched by it, else local[*])",
    )
    parser.add_argument(
        "--output",
        default="-",
        metavar="TARGET",
        help=f"- (stdout), PATH, file:PATH or configmap:NAME (key {k8s.REPORT_KEY})",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per pod request")
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight per Spark partition"
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="prove that no batched log entry is still live before a downgrade (Spark job)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _markers(ns: argparse.Namespace, kube: k8s.LazyKube) -> RolloverMarkers:
    if ns.markers is not None:
        return load_markers(ns.markers)
    if ns.markers_json is not None:
        return parse_markers(ns.markers_json, "--markers-json")
    if ns.markers_configmap is not None:
        name, _, key = str(ns.markers_configmap).partition("/")
        text = k8s.read_configmap_key(kube.api, kube.namespace, name, key or k8s.MARKERS_KEY)
        return parse_markers(text, f"ConfigMap {kube.namespace}/{name}")
    raise VerifierInputError("no rollover markers: give --markers, --markers-json or --markers-configmap")


def _endpoints(ns: argparse.Namespace, kube: k8s.LazyKube) -> list[PodEndpoint]:
    endpoints = [parse_endpoint(text) for text in ns.endpoint]
    for path in ns.endpoints_file:
        endpoints.extend(load_endpoints(path))
    if ns.selector:
        endpoints.extend(
            k8s.discover_pods(kube.api, kube.namespace, ns.selector, ns.admin_port, tls=_tls_on())
        )
    if not endpoints:
        raise VerifierInputError("no pods to check: give --endpoint, --endpoints-file or --selector")
    return dedupe_endpoints(endpoints)


def write_report(report: Report, target: OutputTarget, kube: k8s.LazyKube) -> None:
    text = json.dumps(report.to_dict(), indent=2) + "\n"
    if target.kind == "stdout":
        sys.stdout.write(text)
        sys.stdout.flush()
    elif target.kind == "file":
        path = Path(target.where)
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            # Write then rename: a reader (the fleet) never sees half a report.
            temporary.write_text(text, encoding="utf-8")
            temporary.replace(path)
        except OSError as exc:
            raise VerifierInfraError(f"cannot write the report to {path}: {exc.strerror or exc}") from exc
    else:
        k8s.write_configmap_key(
            kube.api,
            kube.namespace,
            target.where,
            k8s.REPORT_KEY,
            text,
            labels={"app.kubernetes.io/component": "verifier", "app.kubernetes.io/part-of": "txnkeeper"},
        )


def _say(message: str) -> None:
    print(f"{COMMAND}: {message}", file=sys.stderr)


def run(ns: argparse.Namespace) -> int:
    kube = k8s.LazyKube(ns.kubeconfig, ns.namespace)
    markers: RolloverMarkers | None = None
    started = datetime.now(UTC)
    try:
        target = OutputTarget.parse(ns.output)
        markers = _markers(ns, kube)
        endpoints = _endpoints(ns, kube)
        report = verify(
            endpoints, markers, master=ns.master, timeout_s=ns.timeout, concurrency=ns.concurrency
        )
    except (VerifierInputError, VerifierInfraError) as exc:
        _say(f"error: {exc}")
        if markers is not None:
            _publish_failure(failure_report(started, markers, str(exc)), ns, kube)
        return EXIT_ERROR
    try:
        write_report(report, target, kube)
    except (VerifierInputError, VerifierInfraError) as exc:
        _say(f"error: {exc}")
        return EXIT_ERROR
    _say(json.dumps(report_summary(report)))
    return EXIT_SAFE if report.safe else EXIT_NOT_SAFE


def _publish_failure(report: Report, ns: argparse.Namespace, kube: k8s.LazyKube) -> None:
    try:
        write_report(report, OutputTarget.parse(ns.output), kube)
    except (VerifierInputError, VerifierInfraError) as exc:
        _say(f"error: could not publish the failure report either: {exc}")


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m txnkeeper.verifier`, spark-submit): the subcommand's flags alone."""
    parser = argparse.ArgumentParser(
        prog=f"txnkeeper {COMMAND}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _tls_on() -> bool:
    """Pods are reached over https when the job has a CA to verify them (TXNKEEPER_TLS_CA_FILE, from
    the mounted Secret; contract/tls.py)."""
    return tls.TlsClientSettings.from_env() is not None
