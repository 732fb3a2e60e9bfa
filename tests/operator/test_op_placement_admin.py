"""The admin client's placement and move calls (contracts §12) against a small aiohttp server that
implements the verbs' rules over real sockets: two "pods", the target pulling the source's files by the
source URL it is given, the bearer token, 409 for a verb out of its state, the listing's shape.

The real pods' routes are built beside this (store and coordinator roles); this pins the request paths,
bodies and the answers the operator relies on, so both sides can be checked against one description.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from txnkeeper.contract.admin import (
    COORDINATOR_ROUTE,
    SHARD_ROUTE,
    AdminClient,
    AdminError,
    UnitRoute,
    parse_held,
)
from txnkeeper.contract.placement import Placement

TOKEN = "placement-token"


@dataclass
class FakePod:
    ordinal: int
    record: Placement
    files: dict[int, dict[str, bytes]] = field(default_factory=dict)  # unit -> path -> content
    markers: dict[int, tuple[str, str]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)


def _app(pod: FakePod) -> web.Application:
    def refuse(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def body_of(request: web.Request) -> dict[str, Any]:
        doc = await request.json() if request.can_read_body else None
        pod.requests.append((request.method, request.path, doc))
        return doc if isinstance(doc, dict) else {}

    def authorized(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    async def placement(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response({"ordinal": pod.ordinal, "record": pod.record.to_json(), "markers": {}})
        if not authorized(request):
            return refuse(401, "no token")
        record = Placement.from_json(await body_of(request))
        if record != pod.record and record.epoch <= pod.record.epoch:
            return refuse(409, f"epoch {record.epoch} is not newer than {pod.record.epoch}")
        pod.record = record
        return web.json_response(record.to_json())

    async def listing(request: web.Request) -> web.Response:
        route = SHARD_ROUTE if request.match_info["path"] == "shards" else COORDINATOR_ROUTE
        rows = [
            {
                route.id_key: unit,
                "owner": pod.record.owner_of(unit),
                "state": pod.markers.get(unit, ("", "serving"))[1],
                "topics": 1,
                "bytes": sum(len(b) for b in files.values()),
                "bytesInPerSecond": 10.5,
                "txnPerSecond": 2.0,
            }
            for unit, files in sorted(pod.files.items())
        ]
        return web.json_response({"epoch": pod.record.epoch, route.list_key: rows})

    async def file(request: web.Request) -> web.Response:
        unit = int(request.match_info["unit"])
        if pod.markers.get(unit) != (request.query["move"], "fenced"):
            return refuse(409, "not fenced for that move")
        content = pod.files.get(unit, {}).get(request.query["path"])
        return refuse(404, "not in the manifest") if content is None else web.Response(body=content)

    async def verb(request: web.Request) -> web.Response:
        if not authorized(request):
            return refuse(401, "no token")
        unit, name = int(request.match_info["unit"]), request.match_info["verb"]
        doc = await body_of(request)
        move = doc["move"]
        owner = pod.record.owner_of(unit) == pod.ordinal
        if name == "fence":
            if not owner:
                return refuse(409, "not the owner")
            pod.markers[unit] = (move, "fenced")
            files = [{"path": p, "size": len(b), "crc32c": zlib.crc32(b)} for p, b in pod.files[unit].items()]
            manifest = {"move": move, "epoch": pod.record.epoch, "files": files, "topics": ["t"]}
            return web.json_response({**manifest, "bytes": sum(f["size"] for f in files)})
        if name == "receive":
            manifest = await _manifest_from(doc["source"], request.match_info["path"], unit, move)
            pod.files[unit] = manifest
            pod.markers[unit] = (move, "received")
            return web.json_response({"files": len(manifest), "bytes": sum(map(len, manifest.values()))})
        if name in ("discard", "release") and owner:
            return refuse(409, "owns it")
        if name == "unfence" and not owner:
            return refuse(409, "no longer owns it")
        if name in ("discard", "release"):
            pod.files.pop(unit, None)
        pod.markers.pop(unit, None)
        return web.json_response({"move": move})

    app = web.Application()
    app.router.add_route("*", "/admin/v1/placement", placement)
    app.router.add_get("/admin/v1/{path:shards|coordinators}", listing)
    app.router.add_get("/admin/v1/{path:shards|coordinators}/{unit:\\d+}/files", file)
    app.router.add_post("/admin/v1/{path:shards|coordinators}/{unit:\\d+}/{verb}", verb)
    return app


async def _manifest_from(source: str, path: str, unit: int, move: str) -> dict[str, bytes]:
    """What a target does with the source URL it is given: fence answers were already taken by the
    operator, so it re-reads the manifest's files one by one (only while the source is fenced)."""
    out: dict[str, bytes] = {}
    async with aiohttp.ClientSession() as session:
        for name in ("ledgers/1", "cursors.json"):
            url = f"{source}/admin/v1/{path}/{unit}/files"
            async with session.get(url, params={"move": move, "path": name}) as resp:
                if resp.status == 200:
                    out[name] = await resp.read()
    return out


@pytest.fixture
async def pods() -> AsyncIterator[tuple[FakePod, FakePod, str, str]]:
    record = Placement.initial("store-shards", 2, 4)
    source = FakePod(0, record, {0: {"ledgers/1": b"entries", "cursors.json": b"{}"}, 2: {}})
    target = FakePod(1, record, {1: {}, 3: {}})
    servers = [TestServer(_app(source)), TestServer(_app(target))]
    for server in servers:
        await server.start_server()
    try:
        yield source, target, str(servers[0].make_url("")), str(servers[1].make_url(""))
    finally:
        for server in servers:
            await server.close()


@pytest.fixture
async def client() -> AsyncIterator[AdminClient]:
    async with aiohttp.ClientSession() as session:
        yield AdminClient(session, timeout_seconds=5, token=TOKEN)


async def test_a_whole_move_through_the_client(
    pods: tuple[FakePod, FakePod, str, str], client: AdminClient
) -> None:
    source, target, source_url, target_url = pods
    held = await client.list_shards(source_url)
    assert held.epoch == 1 and [(u.unit, u.state, u.bytes) for u in held.units] == [
        (0, "serving", 9),
        (2, "serving", 0),
    ]
    assert held.units[0].bytes_in_per_second == 10.5 and held.units[0].txn_per_second == 2.0

    manifest = await client.shard_fence(source_url, 0, "s0-m1")
    assert manifest["bytes"] == 9 and {f["path"] for f in manifest["files"]} == {"ledgers/1", "cursors.json"}
    assert source.requests[-1] == ("POST", "/admin/v1/shards/0/fence", {"move": "s0-m1"})
    assert (await client.list_shards(source_url)).units[0].state == "fenced"

    received = await client.shard_receive(target_url, 0, "s0-m1", source_url)
    assert received == {"files": 2, "bytes": 9}
    assert target.requests[-1] == (
        "POST",
        "/admin/v1/shards/0/receive",
        {"move": "s0-m1", "source": source_url},
    )
    assert target.files[0] == source.files[0]

    with pytest.raises(AdminError, match="409"):
        await client.shard_release(source_url, 0, "s0-m1")  # its record still names it owner

    switched = source.record.with_owner(0, 1)
    await client.put_placement(target_url, switched)
    await client.put_placement(source_url, switched)
    await client.put_placement(source_url, switched)  # the same record again is a no-op
    assert source.requests[-1] == ("PUT", "/admin/v1/placement", switched.to_json())
    assert await client.get_placement(source_url) == switched
    with pytest.raises(AdminError, match="409"):
        await client.put_placement(source_url, Placement.initial("store-shards", 2, 4))

    await client.shard_release(source_url, 0, "s0-m1")
    assert 0 not in source.files
    assert [u.unit for u in (await client.list_shards(source_url)).units] == [2]


async def test_rollback_verbs_and_the_token(
    pods: tuple[FakePod, FakePod, str, str], client: AdminClient
) -> None:
    source, target, source_url, target_url = pods
    await client.shard_fence(source_url, 2, "s2-m1")
    await client.shard_receive(target_url, 2, "s2-m1", source_url)
    await client.shard_discard(target_url, 2, "s2-m1")
    await client.shard_unfence(source_url, 2, "s2-m1")
    assert 2 not in target.files and source.markers == {}
    assert target.requests[-1] == ("POST", "/admin/v1/shards/2/discard", {"move": "s2-m1"})
    with pytest.raises(AdminError, match="409"):
        await client.shard_discard(source_url, 2, "s2-m1")  # the owner never discards
    with pytest.raises(AdminError, match="401"):
        await client.shard_fence(source_url, 2, "s2-m2", token="wrong")
    assert source.markers == {}


async def test_coordinator_ids_use_their_own_paths(
    pods: tuple[FakePod, FakePod, str, str], client: AdminClient
) -> None:
    source, _target, source_url, target_url = pods
    await client.coordinator_fence(source_url, 0, "c0-m1")
    assert source.requests[-1][1] == "/admin/v1/coordinators/0/fence"
    assert (await client.coordinator_receive(target_url, 0, "c0-m1", source_url))["files"] == 2
    await client.coordinator_discard(target_url, 0, "c0-m1")
    await client.coordinator_unfence(source_url, 0, "c0-m1")
    with pytest.raises(AdminError, match="409"):
        await client.coordinator_release(source_url, 0, "c0-m1")
    held = await client.list_coordinator_ids(source_url)
    assert [u.unit for u in held.units] == [0, 2]


def test_a_coordinator_listing_names_every_id_but_holds_only_its_own() -> None:
    """Coordinator pods list every id of the record (``elsewhere``: owned by another pod, no data
    here; ``closed``: owned, not open yet) and report no bytes."""
    doc = {
        "epoch": 3,
        "ordinal": 1,
        "coordinators": [
            {"coordinator": 0, "owner": 0, "state": "elsewhere"},
            {"coordinator": 1, "owner": 1, "state": "serving", "openTxns": 2, "txnPerSecond": 4.5},
            {"coordinator": 2, "owner": 1, "state": "closed"},
            {"coordinator": 3, "owner": 0, "state": "received", "move": "c3-m1"},
        ],
    }
    held = parse_held(COORDINATOR_ROUTE, doc)
    assert [(u.unit, u.state, u.bytes, u.txn_per_second) for u in held.units] == [
        (1, "serving", 0, 4.5),
        (2, "closed", 0, 0.0),
        (3, "received", 0, 0.0),
    ]


@pytest.mark.parametrize(
    ("route", "doc"),
    [
        (SHARD_ROUTE, {"shards": []}),
        (SHARD_ROUTE, {"epoch": 1, "shards": [{"shard": 0, "owner": 0, "state": "moving", "bytes": 1}]}),
        (SHARD_ROUTE, {"epoch": 1, "shards": [{"shard": True, "owner": 0, "state": "serving", "bytes": 1}]}),
        (COORDINATOR_ROUTE, {"epoch": 1, "coordinators": [{"shard": 0, "owner": 0, "state": "serving"}]}),
    ],
)
def test_malformed_listings_are_errors_not_empty_pods(route: UnitRoute, doc: dict[str, Any]) -> None:
    with pytest.raises(AdminError, match="malformed"):
        parse_held(route, doc)
