"""The placement and shard-move routes of the pod admin API (docs/contracts.md §12): the HTTP shapes
only; the pod's ``ShardAdminView`` judges and acts.

Why a module of its own: the move verbs share one set of checks (a shard number, a move id, a source
URL) and one provider, apart from the topic and store routes in app.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from txnkeeper.admin.auth import check_bearer
from txnkeeper.admin.views import AdminRefusal, ShardAdminView

ShardProvider = Callable[[], ShardAdminView | None]
SHARDS_KEY: web.AppKey[ShardProvider] = web.AppKey("shards", ShardProvider)  # type: ignore[arg-type]
MAX_SHARD_DIGITS = 4  # shards are 1..4096 (contract/placement.py MAX_SHARDS)
MAX_MOVE_ID = 128
MAX_URL = 512
BodyReader = Callable[[web.Request], Awaitable[dict[str, Any]]]
QueryReader = Callable[[web.Request], dict[str, str]]


def _view(request: web.Request) -> ShardAdminView:
    view = request.app[SHARDS_KEY]()
    if view is None:
        raise AdminRefusal(
            404,
            "this pod serves no store shards (placement and shard moves are served by store pods once"
            " their stores are open)",
        )
    return view


def _shard(request: web.Request) -> int:
    raw = request.match_info["shard"]
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= MAX_SHARD_DIGITS):
        raise AdminRefusal(
            400,
            f"shard must be a non-negative integer of at most {MAX_SHARD_DIGITS} digits 0-9,"
            f" got {raw[:40]!r}",
        )
    return int(raw)


def _move(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_MOVE_ID or not value.isprintable():
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise AdminRefusal(
            400, f"'move' must be a move id of 1..{MAX_MOVE_ID} printable characters, got {shown!r}"
        )
    return value


def _source(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_URL or not value.isprintable():
        raise AdminRefusal(
            400, "'source' must be the source pod's admin base URL, e.g. http://pas-0.pas:8080"
        )
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AdminRefusal(
            400, f"'source' must be an http(s) URL of the source pod's admin API, got {value[:80]!r}"
        )
    return value


def _keys(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise AdminRefusal(400, f"unknown key(s) {unknown}; expected {sorted(allowed)}")


def add_shard_routes(
    app: web.Application,
    provider: ShardProvider,
    *,
    token: str | None,
    read_body: BodyReader,
    read_query: QueryReader,
) -> None:
    """``read_body``/``read_query``: app.py's checked JSON body and strict UTF-8 query readers;
    ``token``: the admin token, which the file verb asks for too (it serves the topics' data)."""
    app[SHARDS_KEY] = provider

    async def get_placement(request: web.Request) -> web.Response:
        return web.json_response(_view(request).placement_doc())

    async def put_placement(request: web.Request) -> web.Response:
        view = _view(request)
        return web.json_response(await view.put_placement(await read_body(request)))

    async def list_shards(request: web.Request) -> web.Response:
        return web.json_response(await _view(request).shards_doc())

    async def verb(request: web.Request) -> web.Response:
        view = _view(request)
        shard = _shard(request)
        name = request.match_info["verb"]
        body = await read_body(request)
        if name == "receive":
            _keys(body, {"move", "source"})
            return web.json_response(
                await view.receive(shard, _move(body.get("move")), _source(body.get("source")))
            )
        if name == "precopy":
            _keys(body, {"move", "source", "maxBytesPerSecond"})
            rate = body.get("maxBytesPerSecond")
            if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or rate < 1):
                raise AdminRefusal(400, f"'maxBytesPerSecond' must be a positive integer, got {rate!r}")
            move = _move(body.get("move"))
            return web.json_response(await view.precopy(shard, move, _source(body.get("source")), rate))
        _keys(body, {"move"})
        move = _move(body.get("move"))
        actions = {
            "fence": view.fence,
            "unfence": view.unfence,
            "discard": view.discard,
            "release": view.release,
            "closed": view.closed_files,
        }
        return web.json_response(await actions[name](shard, move))

    async def shard_file(request: web.Request) -> web.StreamResponse:
        refusal = check_bearer(request.headers.get("Authorization"), token)
        if refusal is not None:
            raise AdminRefusal(401, refusal)
        view = _view(request)
        shard = _shard(request)
        query = read_query(request)
        move = _move(query.get("move"))
        path = query.get("path", "")
        if not path or len(path) > 4096:
            raise AdminRefusal(400, "query parameter 'path' (a file of the move's manifest) is required")
        return web.FileResponse(await view.shard_file(shard, move, path), chunk_size=1 << 20)

    app.router.add_get("/admin/v1/placement", get_placement)
    app.router.add_put("/admin/v1/placement", put_placement)
    app.router.add_get("/admin/v1/shards", list_shards)
    app.router.add_post(
        "/admin/v1/shards/{shard}/{verb:fence|unfence|receive|discard|release|precopy|closed}", verb
    )
    app.router.add_get("/admin/v1/shards/{shard}/files", shard_file)
