"""The aiohttp application of the pod admin API: routes, JSON shapes and error mapping (contracts §5)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from txnkeeper.admin.auth import check_bearer
from txnkeeper.admin.views import FormatLevelRefusal, PodView
from txnkeeper.bufferedwriter.config import InvalidBatchedWriteConfigError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
POD_KEY: web.AppKey[PodView] = web.AppKey("pod", PodView)
TOKEN_KEY: web.AppKey[str | None] = web.AppKey("token", str | None)  # type: ignore[arg-type]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        refusal = check_bearer(request.headers.get("Authorization"), request.app[TOKEN_KEY])
        if refusal is not None:
            return _error(401, refusal)
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("admin request %s %s failed", request.method, request.path)
        return _error(500, f"{type(exc).__name__}: {exc}")


def _pod(request: web.Request) -> PodView:
    return request.app[POD_KEY]


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    reason = _pod(request).readiness()
    if reason is None:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "not ready", "reason": reason}, status=503)


async def info(request: web.Request) -> web.Response:
    pod = _pod(request)
    return web.json_response(
        {"pod": pod.pod_name, "role": pod.role, "release": pod.release, "formatLevel": pod.format_level}
    )


async def coordinator_stats(request: web.Request) -> web.Response:
    return web.json_response({"coordinatorArray": _pod(request).coordinator_array()})


async def pending_ack_stats(request: web.Request) -> web.Response:
    return web.json_response({"subscriptionArray": _pod(request).subscription_array()})


async def get_batch_log(request: web.Request) -> web.Response:
    pod = _pod(request)
    txnlog, pending = pod.batch_log_configs()
    return web.json_response(
        {
            "coordinator": txnlog.to_stat(),
            "pendingAck": pending.to_stat(),
            "coordinatorArray": pod.coordinator_array(),
            "subscriptionArray": pod.subscription_array(),
        }
    )


async def set_batch_log(request: web.Request) -> web.Response:
    pod = _pod(request)
    body = await _json_object(request)
    unknown = sorted(set(body) - {"coordinator", "pendingAck"})
    if unknown:
        return _error(400, f"unknown key(s) {unknown}; expected 'coordinator' and/or 'pendingAck'")
    txnlog, pending = pod.batch_log_configs()
    try:
        new_txnlog = txnlog.with_stat(_partial(body, "coordinator"))
        new_pending = pending.with_stat(_partial(body, "pendingAck"))
    except (InvalidBatchedWriteConfigError, TypeError) as exc:
        return _error(400, str(exc))
    try:
        await pod.set_batch_log(new_txnlog, new_pending)
    except FormatLevelRefusal as exc:
        return _error(409, str(exc))
    return web.json_response(
        {"coordinatorArray": pod.coordinator_array(), "subscriptionArray": pod.subscription_array()}
    )


async def coordinator_internal_stats(request: web.Request) -> web.Response:
    raw = request.match_info["coordinator_id"]
    if not raw.isdigit():
        return _error(400, f"coordinator id must be a non-negative integer, got {raw!r}")
    store = _pod(request).coordinator_log(int(raw))
    if store is None:
        return _error(404, f"coordinator {raw} is not hosted on this pod")
    return web.json_response({"transactionLogStats": store.internal_stats()})


async def pending_ack_internal_stats(request: web.Request) -> web.Response:
    topic = request.query.get("topic", "")
    subscription = request.query.get("subscription", "")
    if not topic or not subscription:
        return _error(400, "query parameters 'topic' and 'subscription' are required")
    store = _pod(request).pending_ack_log(topic, subscription)
    if store is None:
        return _error(404, f"no pending-ack store for {topic} / {subscription} on this pod")
    return web.json_response({"pendingAckLogStats": store.internal_stats()})


async def list_stores(request: web.Request) -> web.Response:
    return web.json_response({"stores": [s.ref() for s in _pod(request).stores()]})


async def rollover(request: web.Request) -> web.Response:
    result = []
    for store in _pod(request).stores():
        last = await store.rollover()
        result.append({"name": store.name, "kind": store.kind, "lastBatchedLedger": last})
    return web.json_response({"stores": result})


async def store_ledgers(request: web.Request) -> web.Response:
    pod = _pod(request)
    reports = [await s.ledger_report() for s in pod.stores()]
    return web.json_response(
        {"pod": pod.pod_name, "release": pod.release, "formatLevel": pod.format_level, "stores": reports}
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=_pod(request).metrics_text(), content_type="text/plain", charset="utf-8")


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"body is not JSON: {exc}"}), content_type="application/json"
        ) from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "body must be a JSON object"}), content_type="application/json"
        )
    return body


def _partial(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise TypeError(f"'{key}' must be an object of TxnBufferedWriterStat fields")
    return value


def build_admin_app(pod: PodView, token: str | None) -> web.Application:
    app = web.Application(middlewares=[_errors_and_auth])
    app[POD_KEY] = pod
    app[TOKEN_KEY] = token
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/admin/v1/info", info)
    app.router.add_get("/admin/v3/transactions/coordinatorStats", coordinator_stats)
    app.router.add_get("/admin/v3/transactions/pendingAckStats", pending_ack_stats)
    app.router.add_get("/admin/v1/batch-log", get_batch_log)
    app.router.add_post("/admin/v1/batch-log", set_batch_log)
    app.router.add_get(
        "/admin/v3/transactions/coordinatorInternalStats/{coordinator_id}", coordinator_internal_stats
    )
    app.router.add_get("/admin/v3/transactions/pendingAckInternalStats", pending_ack_internal_stats)
    app.router.add_get("/admin/v1/stores", list_stores)
    app.router.add_post("/admin/v1/stores/rollover", rollover)
    app.router.add_get("/admin/v1/stores/ledgers", store_ledgers)
    app.router.add_get("/metrics", metrics)
    return app
