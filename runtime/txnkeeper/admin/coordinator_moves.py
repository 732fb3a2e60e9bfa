"""The admin API's coordinator-id move verbs (docs/contracts.md §12), the same steps and bodies as the
shard verbs, under ``/admin/v1/coordinators``:

- ``GET  /admin/v1/coordinators``: per id of the record: owner, state, open txns, txn/s (last minute)
- ``POST /admin/v1/coordinators/{c}/fence {"move": ID}``: the manifest
- ``GET  /admin/v1/coordinators/{c}/files?move=ID[&path=P]``: without a path the manifest, else one file
- ``POST /admin/v1/coordinators/{c}/receive {"move": ID, "source": "http://source-admin"}``
- ``POST /admin/v1/coordinators/{c}/unfence|discard|release {"move": ID}``

and, on a coordinator pod when no other module serves them, ``GET|PUT /admin/v1/placement``.

Why a module of its own: it is added to the app beside the rest (the pod calls ``add_coordinator_routes``
after ``build_admin_app``), so the shard verbs and these can grow apart without touching each other.
Every POST and the file download need the admin token (the files are the coordinator's whole log).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from txnkeeper.admin.app import TOKEN_KEY, BadRequest, _json_object, _utf8_query
from txnkeeper.admin.auth import check_bearer
from txnkeeper.admin.views import AdminRefusal

_MAX_ID_DIGITS = 4  # coordinator ids are below 4096
_MAX_MOVE = 128


class CoordinatorMoveView(Protocol):
    """What a coordinator pod that places its ids by a record offers (server/coordinator_moves.py)."""

    async def fence(self, c: int, move: str) -> dict[str, Any]: ...

    def manifest(self, c: int, move: str) -> dict[str, Any]: ...

    def file(self, c: int, move: str, path: str) -> Path: ...

    async def receive(self, c: int, move: str, source: str) -> dict[str, Any]: ...

    async def unfence(self, c: int, move: str) -> dict[str, Any]: ...

    async def discard(self, c: int, move: str) -> dict[str, Any]: ...

    async def release(self, c: int, move: str) -> dict[str, Any]: ...

    def listing(self) -> dict[str, Any]: ...

    def placement_json(self) -> dict[str, Any]: ...

    def put_placement(self, raw: object) -> dict[str, Any]: ...


MoveProvider = Callable[[], CoordinatorMoveView | None]
MOVES_KEY: web.AppKey[MoveProvider] = web.AppKey("coordinator-moves", MoveProvider)  # type: ignore[arg-type]


def _moves(request: web.Request) -> CoordinatorMoveView:
    moves = request.app[MOVES_KEY]()
    if moves is None:
        raise AdminRefusal(
            404,
            "this pod does not place coordinator ids by a record (a store pod, or coordinator ids given "
            "as a list): coordinator ids move only between pods started with --coordinator-ids auto",
        )
    return moves


def _id(request: web.Request) -> int:
    text = request.match_info["c"]
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_ID_DIGITS):
        raise BadRequest(
            f"coordinator id must be 0-{10**_MAX_ID_DIGITS - 1} in plain digits, not {text[:20]!r}"
        )
    return int(text)


def _move(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_MOVE or not value.isprintable():
        raise BadRequest(f'"move" must be the move id, 1..{_MAX_MOVE} printable characters')
    return value


async def _body(request: web.Request, keys: set[str]) -> dict[str, Any]:
    body = await _json_object(request)
    unknown = set(body) - keys
    if unknown:
        raise BadRequest(f"unknown keys {sorted(unknown)}; this verb takes {sorted(keys)}")
    return body


async def list_coordinators(request: web.Request) -> web.Response:
    return web.json_response(_moves(request).listing())


async def fence(request: web.Request) -> web.Response:
    body = await _body(request, {"move"})
    return web.json_response(await _moves(request).fence(_id(request), _move(body.get("move"))))


async def files(request: web.Request) -> web.StreamResponse:
    refusal = check_bearer(request.headers.get("Authorization"), request.app[TOKEN_KEY])
    if refusal is not None:
        raise AdminRefusal(401, refusal)
    query = _utf8_query(request)
    moves = _moves(request)
    c, move = _id(request), _move(query.get("move"))
    path = query.get("path")
    if path is None:
        return web.json_response(moves.manifest(c, move))
    return web.FileResponse(moves.file(c, move, path))


async def receive(request: web.Request) -> web.Response:
    body = await _body(request, {"move", "source"})
    source = body.get("source")
    if not isinstance(source, str):
        raise BadRequest('"source" must be the source pod\'s admin URL')
    return web.json_response(await _moves(request).receive(_id(request), _move(body.get("move")), source))


Verb = Callable[[int, str], Awaitable[dict[str, Any]]]


def _verb(pick: Callable[[CoordinatorMoveView], Verb]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        body = await _body(request, {"move"})
        verb = pick(_moves(request))
        return web.json_response(await verb(_id(request), _move(body.get("move"))))

    return handle


async def get_placement(request: web.Request) -> web.Response:
    return web.json_response(_moves(request).placement_json())


async def put_placement(request: web.Request) -> web.Response:
    body = await _json_object(request)
    return web.json_response(_moves(request).put_placement(body))


def add_coordinator_routes(app: web.Application, moves: MoveProvider) -> None:
    """Add the coordinator move verbs (and ``/admin/v1/placement`` unless already served) to ``app``."""
    app[MOVES_KEY] = moves
    app.router.add_get("/admin/v1/coordinators", list_coordinators)
    app.router.add_post("/admin/v1/coordinators/{c}/fence", fence)
    app.router.add_get("/admin/v1/coordinators/{c}/files", files)
    app.router.add_post("/admin/v1/coordinators/{c}/receive", receive)
    app.router.add_post("/admin/v1/coordinators/{c}/unfence", _verb(lambda moves: moves.unfence))
    app.router.add_post("/admin/v1/coordinators/{c}/discard", _verb(lambda moves: moves.discard))
    app.router.add_post("/admin/v1/coordinators/{c}/release", _verb(lambda moves: moves.release))
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    if ("GET", "/admin/v1/placement") not in served:
        app.router.add_get("/admin/v1/placement", get_placement)
    if ("PUT", "/admin/v1/placement") not in served:
        app.router.add_route("PUT", "/admin/v1/placement", put_placement)
