"""Parsing endpoints and markers given on the command line or in files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper.verifier.inputs import (
    dedupe_endpoints,
    load_endpoints,
    load_markers,
    parse_endpoint,
    parse_markers,
)
from txnkeeper.verifier.model import PodEndpoint, VerifierInputError


def test_parse_endpoint_forms() -> None:
    assert parse_endpoint("http://10.0.0.1:8080") == PodEndpoint(pod=None, url="http://10.0.0.1:8080")
    assert parse_endpoint("tc-0=http://10.0.0.1:8080") == PodEndpoint(pod="tc-0", url="http://10.0.0.1:8080")
    # An '=' inside the URL (query) is not a pod name.
    assert parse_endpoint("http://h:1/?a=b").pod is None
    with pytest.raises(VerifierInputError, match="is not \\[POD=\\]http://host:port"):
        parse_endpoint("tc-0=10.0.0.1:8080")


def test_endpoints_file_forms(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"endpoints": ["http://a:1", {"pod": "b", "url": "http://b:1"}]}))
    assert load_endpoints(str(path)) == [PodEndpoint(None, "http://a:1"), PodEndpoint("b", "http://b:1")]
    path.write_text(json.dumps([{"pod": "b"}]))
    with pytest.raises(VerifierInputError, match=r"endpoints\.json\[0\]"):
        load_endpoints(str(path))
    with pytest.raises(VerifierInputError, match="cannot read endpoints file"):
        load_endpoints(str(tmp_path / "absent.json"))


def test_markers_need_a_timestamp_and_ledger_ids(tmp_path: Path) -> None:
    markers = parse_markers('{"takenAt": "2026-11-21T20:00:00Z", "stores": {"log0": 7}}')
    assert markers.ledgers == {"log0": 7}
    with pytest.raises(VerifierInputError, match="no takenAt"):
        parse_markers('{"stores": {"log0": 7}}')
    with pytest.raises(VerifierInputError, match="has no timezone"):
        parse_markers('{"takenAt": "2026-11-21T20:00:00", "stores": {}}')
    with pytest.raises(VerifierInputError, match="must be a ledger id"):
        parse_markers('{"takenAt": "2026-11-21T20:00:00Z", "stores": {"log0": "7"}}')
    with pytest.raises(VerifierInputError, match="not valid JSON"):
        parse_markers("{")
    path = tmp_path / "markers.json"
    path.write_text(json.dumps(markers.to_dict()))
    assert load_markers(str(path)) == markers


def test_dedupe_keeps_first_occurrence() -> None:
    a, b = PodEndpoint("a", "http://a:1"), PodEndpoint("b", "http://b:1")
    assert dedupe_endpoints([a, b, a]) == [a, b]
