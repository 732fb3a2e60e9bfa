"""Reading the verifier's inputs outside Kubernetes: endpoint lists and rollover markers as JSON.

Formats (contracts §7):
- endpoint: `URL` or `POD=URL`; an endpoints file is a JSON list of such strings or of
  `{"pod": str, "url": str}` objects, or an object `{"endpoints": [...]}`.
- markers: `{"takenAt": RFC3339, "stores": {storeName: lastBatchedLedger}}`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from txnkeeper.verifier.model import PodEndpoint, RolloverMarkers, VerifierInputError


def parse_endpoint(text: str) -> PodEndpoint:
    """`http://host:port` or `pod-name=http://host:port`."""
    pod: str | None = None
    url = text.strip()
    head, sep, tail = url.partition("=")
    if sep and "://" not in head:
        pod, url = head.strip() or None, tail.strip()
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise VerifierInputError(f"endpoint {text!r} is not [POD=]http://host:port")
    return PodEndpoint(pod=pod, url=url)


def _endpoint_from_json(item: object, where: str) -> PodEndpoint:
    if isinstance(item, str):
        return parse_endpoint(item)
    if isinstance(item, Mapping):
        url = item.get("url")
        pod = item.get("pod")
        if not isinstance(url, str) or (pod is not None and not isinstance(pod, str)):
            raise VerifierInputError(f"{where}: expected {{'pod': str, 'url': str}}, got {item!r}")
        parsed = parse_endpoint(url)
        return PodEndpoint(pod=pod, url=parsed.url)
    raise VerifierInputError(f"{where}: expected a URL string or an object, got {type(item).__name__}")


def load_endpoints(path: str) -> list[PodEndpoint]:
    document = _load_json(path, "endpoints file")
    if isinstance(document, Mapping):
        document = document.get("endpoints")
    if not isinstance(document, list):
        raise VerifierInputError(f"endpoints file {path}: expected a list or {{'endpoints': [...]}}")
    return [_endpoint_from_json(item, f"endpoints file {path}[{i}]") for i, item in enumerate(document)]


def _load_json(path: str, what: str) -> object:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise VerifierInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    return parse_json(text, f"{what} {path}")


def parse_json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerifierInputError(f"{what} is not valid JSON: {exc}") from exc


def load_markers(path: str) -> RolloverMarkers:
    return RolloverMarkers.from_dict(_load_json(path, "markers file"))


def parse_markers(text: str, what: str = "markers") -> RolloverMarkers:
    return RolloverMarkers.from_dict(parse_json(text, what))


def dedupe_endpoints(endpoints: list[PodEndpoint]) -> list[PodEndpoint]:
    """The same pod given twice (flag and file) is asked once."""
    seen: set[tuple[str | None, str | None]] = set()
    unique: list[PodEndpoint] = []
    for endpoint in endpoints:
        key = (endpoint.pod, endpoint.url)
        if key not in seen:
            seen.add(key)
            unique.append(endpoint)
    return unique
