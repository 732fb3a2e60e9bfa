"""spec.scaling.precopyMiBPerSecond: the bound on a store shard's pre-copy reaches the target pod's
precopy verb as ``maxBytesPerSecond`` (bench/rebalance.py: a bound keeps the clients' throughput during a
move where pods share a disk): 25 MiB/s when the spec says nothing, absent when it says 0."""

from __future__ import annotations

from typing import Any

import pytest

from txnkeeper.contract.admin import SHARD_ROUTE, AdminClient, PlacementCalls
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.scaling import precopy_bytes_per_second


def _cr(scaling: dict[str, Any]) -> Resource:
    return Resource.from_body(
        {
            "kind": "PendingAckStore",
            "metadata": {"name": "pas", "namespace": "ns", "uid": "u"},
            "spec": {"version": "2.0.0", "scaling": scaling},
        }
    )


@pytest.mark.parametrize(
    ("scaling", "expected"),
    [({}, 10 << 20), ({"precopyMiBPerSecond": 100}, 100 << 20), ({"precopyMiBPerSecond": 0}, None)],
)
def test_the_bound_in_bytes(scaling: dict[str, Any], expected: int | None) -> None:
    assert precopy_bytes_per_second(_cr(scaling)) == expected


class _Recorder(AdminClient):
    def __init__(self) -> None:  # no session: verb is the only call made
        self.bodies: list[dict[str, Any]] = []

    async def verb(self, method: str, url: str, token: str | None = None, body: Any = None) -> Any:
        assert (method, url) == ("POST", "https://pas-1.pas.ns.svc:8080/admin/v1/shards/3/precopy")
        self.bodies.append(body)
        return {"files": 2, "bytes": 10}


async def test_the_precopy_verb_carries_the_bound_only_when_set() -> None:
    admin = _Recorder()
    calls = PlacementCalls(admin, SHARD_ROUTE)
    base, source = "https://pas-1.pas.ns.svc:8080", "https://pas-0.pas.ns.svc:8080"
    await calls.precopy(base, 3, "m1", source, "t")
    await calls.precopy(base, 3, "m1", source, "t", max_bytes_per_second=40 << 20)
    assert admin.bodies == [
        {"move": "m1", "source": source},
        {"move": "m1", "source": source, "maxBytesPerSecond": 40 << 20},
    ]
