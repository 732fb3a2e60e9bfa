"""The aiohttp application of the pod admin API: routes, JSON shapes and error mapping (contracts §5).

Every bad request (a body that is not UTF-8 or not JSON, nested too deeply, a number out of range, an
id that is not plain ASCII digits, an unknown key) is a 400 ``{"error": ...}`` saying what was wrong;
an unexpected failure is a 500 with a generic message, the traceback going only to the pod's log.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from txnkeeper.admin import entry_query
from txnkeeper.admin.auth import check_bearer
from txnkeeper.admin.shard_routes import ShardProvider, add_shard_routes
from txnkeeper.admin.views import (
    AdminRefusal,
    FormatLevelRefusal,
    PodView,
    TopicOffloadView,
    TopicPolicyView,
    TopicReadView,
    TopicRefusal,
)
from txnkeeper.bufferedwriter.config import BatchedWriteConfig, InvalidBatchedWriteConfigError
from txnkeeper.contract import entry_frames
from txnkeeper.contract.admin import PodTls
from txnkeeper.errors import NotServedHereError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The largest admin request is a batch-log POST of two small objects; anything bigger is a mistake.
MAX_BODY_BYTES = 64 * 1024
# {"coordinator": {"batchEnabled": true}} nests 2 deep; a deeper body is refused before it is walked.
MAX_JSON_DEPTH = 4
# Coordinator ids are below the CRD's 4096 coordinators; 9 digits stays far from any int-parsing limit.
_MAX_ID_DIGITS = 9
# A transaction's sequence (TxnID.least) is an unsigned 64-bit number.
_MAX_SEQUENCE = 2**64 - 1
_INTERNAL_ERROR = "internal error in the admin API; the pod's log has the details"
POD_KEY: web.AppKey[PodView] = web.AppKey("pod", PodView)
TOKEN_KEY: web.AppKey[str | None] = web.AppKey("token", str | None)  # type: ignore[arg-type]
OffloadProvider = Callable[[], TopicOffloadView | None]
OFFLOAD_KEY: web.AppKey[OffloadProvider] = web.AppKey("offload", OffloadProvider)  # type: ignore[arg-type]
PolicyProvider = Callable[[], TopicPolicyView | None]
POLICY_KEY: web.AppKey[PolicyProvider] = web.AppKey("policies", PolicyProvider)  # type: ignore[arg-type]
ReadProvider = Callable[[], TopicReadView | None]
READ_KEY: web.AppKey[ReadProvider] = web.AppKey("reads", ReadProvider)  # type: ignore[arg-type]
TlsProvider = Callable[[], PodTls]
TLS_KEY: web.AppKey[TlsProvider] = web.AppKey("tls", TlsProvider)  # type: ignore[arg-type]
# GET /admin/v1/topics/entries: at most this many entries and payload bytes per request (the default
# when the query does not say, and the most it may ask for).
ENTRIES_DEFAULT = (1_000, 4 * 1024 * 1024)
ENTRIES_MAX = (10_000, 16 * 1024 * 1024)


class HttpServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log (``AppRunner(..., logger=HttpServerLog())``) without alarms for bad input.

    aiohttp answers a request its parser refuses (a request line or header over 8190 bytes, a
    malformed line) with a 400 itself and logs it through ``logger.exception``: an ERROR with a
    traceback for what is the client's mistake. Those are logged here at WARNING, one line, naming
    the peer; every other server error keeps its ERROR and traceback.
    """

    def __init__(self) -> None:
        super().__init__(logging.getLogger("txnkeeper.admin.http"), {})

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            peer = args[0] if args else "?"
            self.warning(
                "admin API refused a malformed HTTP request from %s (answered %s): %s",
                peer,
                exc_info.code,
                str(exc_info.message)[:200],
            )
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class BadRequest(Exception):
    """The request is malformed; the message (HTTP 400) says what was wrong and what to send instead."""


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def _errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        refusal = check_bearer(request.headers.get("Authorization"), request.app[TOKEN_KEY])
        if refusal is not None:
            return _error(401, refusal)
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(400, str(exc))
    except AdminRefusal as exc:
        return _error(exc.status, str(exc))
    except NotServedHereError as exc:
        # A topic of a shard this pod does not serve (docs/contracts.md §12): the owner is named.
        return web.json_response(
            {"error": str(exc), "ownerAddress": exc.owner_address, "placementEpoch": exc.placement_epoch},
            status=409,
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own refusals (404, 405, 413) answer text/plain; contracts §5 promises JSON errors.
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return _error(exc.status, _http_refusal(request, exc), allow)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path)
        return _error(500, _INTERNAL_ERROR)


def _http_refusal(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no admin API resource at {request.path}; see docs/contracts.md §5 for the paths"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path} (allowed: {exc.headers.get('Allow', '')})"
    if exc.status == 413:
        return f"request body is larger than {MAX_BODY_BYTES} bytes; admin requests are small JSON objects"
    return exc.reason


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


async def tls_report(request: web.Request) -> web.Response:
    """GET /admin/v1/tls: what the pod's TLS files loaded right now hold (no token: read-only, and the
    operator's certificate engine waits on it)."""
    return web.json_response(request.app[TLS_KEY]().to_json())


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
        raise BadRequest(f"unknown key(s) {unknown}; expected 'coordinator' and/or 'pendingAck'")
    txnlog, pending = pod.batch_log_configs()
    new_txnlog = _apply(txnlog, body, "coordinator")
    new_pending = _apply(pending, body, "pendingAck")
    try:
        await pod.set_batch_log(new_txnlog, new_pending)
    except FormatLevelRefusal as exc:
        return _error(409, str(exc))
    return web.json_response(
        {"coordinatorArray": pod.coordinator_array(), "subscriptionArray": pod.subscription_array()}
    )


async def coordinator_internal_stats(request: web.Request) -> web.Response:
    raw = request.match_info["coordinator_id"]
    # str.isdigit() and int() accept non-ASCII digits ("\u0661", "\u00b2"); an id is plain 0-9.
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= _MAX_ID_DIGITS):
        raise BadRequest(
            f"coordinator id must be a non-negative integer of at most {_MAX_ID_DIGITS} digits 0-9,"
            f" got {_cut(raw)!r}"
        )
    store = _pod(request).coordinator_log(int(raw))
    if store is None:
        return _error(404, f"coordinator {raw} is not hosted on this pod")
    return web.json_response({"transactionLogStats": store.internal_stats()})


async def abort_transaction(request: web.Request) -> web.Response:
    """Pulsar's abortTransaction admin verb: abort an open transaction (no owner token needed)."""
    most = request.match_info["most"]
    least = request.match_info["least"]
    if not _ascii_digits(most, _MAX_ID_DIGITS):
        raise BadRequest(
            f"coordinator id must be a non-negative integer of at most {_MAX_ID_DIGITS} digits 0-9,"
            f" got {_cut(most)!r}"
        )
    if not _ascii_digits(least, 20) or int(least) > _MAX_SEQUENCE:
        raise BadRequest(
            f"transaction sequence must be an integer in 0..{_MAX_SEQUENCE} written with digits 0-9,"
            f" got {_cut(least)!r}"
        )
    status, body = await _pod(request).abort_transaction(int(most), int(least))
    return web.json_response(body, status=status)


def _ascii_digits(text: str, most: int) -> bool:
    # str.isdigit() and int() accept non-ASCII digits ("\u0661", "\u00b2"): ids are plain 0-9.
    return text.isascii() and text.isdecimal() and len(text) <= most


async def pending_ack_internal_stats(request: web.Request) -> web.Response:
    query = _utf8_query(request)
    topic = query.get("topic", "")
    subscription = query.get("subscription", "")
    if not topic or not subscription:
        raise BadRequest("query parameters 'topic' and 'subscription' are required")
    store = _pod(request).pending_ack_log(topic, subscription)
    if store is None:
        return _error(404, f"no pending-ack store for {_cut(topic)} / {_cut(subscription)} on this pod")
    return web.json_response({"pendingAckLogStats": store.internal_stats()})


async def topic_writers(request: web.Request) -> web.Response:
    topic = _utf8_query(request).get("topic", "")
    if not topic:
        raise BadRequest("query parameter 'topic' is required")
    writers = await _pod(request).topic_writers(topic)
    if writers is None:
        return _error(404, f"topic {_cut(topic)} is not served by this pod (no store role or no such topic)")
    return web.json_response(writers)


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
    summary = await pod.offload_summary()
    offload = {k: summary[k] for k in ("tierOnlyLedgers", "maxMetadataVersion")}
    return web.json_response(
        {
            "pod": pod.pod_name,
            "release": pod.release,
            "formatLevel": pod.format_level,
            "stores": reports,
            "offload": offload,
        }
    )


async def offload_summary(request: web.Request) -> web.Response:
    return web.json_response(await _pod(request).offload_summary())


async def offload_restore(request: web.Request) -> web.Response:
    body = await _json_object(request)
    unknown = sorted(set(body) - {"offload"})
    if unknown or not isinstance(body.get("offload"), dict):
        raise BadRequest(
            f"expected {{'offload': {{...}}}} with the blob store's settings (Pulsar key names, e.g. "
            f"managedLedgerOffloadDriver, fileSystemURI); unknown key(s): {unknown}"
        )
    pod = _pod(request)
    try:
        await pod.request_offload_restore(body["offload"])
    except FormatLevelRefusal as exc:
        return _error(409, str(exc))
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    return web.json_response(
        {"pod": pod.pod_name, "restoreRequested": True, "restartRequired": True}, status=202
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=_pod(request).metrics_text(), content_type="text/plain", charset="utf-8")


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest naming what is wrong with it."""
    raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge (413)
    if not raw.strip():
        raise BadRequest("body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"body is not UTF-8: invalid byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        ) from exc
    try:
        body: object = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:  # an integer beyond Python's int-from-text limit, NaN, Infinity
        raise BadRequest(f"body has a number no setting accepts: {exc}") from exc
    if _too_deep(body, MAX_JSON_DEPTH):
        raise BadRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    return body


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep(value: object, limit: int) -> bool:
    # Iterative: a body json.loads accepted can still nest deeper than Python lets a function recurse.
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _utf8_query(request: web.Request) -> dict[str, str]:
    # aiohttp turns invalid percent-encoded UTF-8 into U+FFFD, which would name a store that never exists.
    try:
        pairs = urllib.parse.parse_qsl(
            request.rel_url.raw_query_string, keep_blank_values=True, encoding="utf-8", errors="strict"
        )
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"query string is not UTF-8 once percent-decoded: {exc.reason} at byte {exc.start}"
        ) from exc
    return dict(pairs)


def _apply(config: BatchedWriteConfig, body: dict[str, Any], key: str) -> BatchedWriteConfig:
    partial = body.get(key, {})
    if not isinstance(partial, dict):
        raise BadRequest(f"'{key}' must be an object of TxnBufferedWriterStat fields, got {_cut(partial)}")
    try:
        return config.with_stat(partial)
    except InvalidBatchedWriteConfigError as exc:
        raise BadRequest(f"{key}: {exc}") from exc


# --- topic offload (PIP-76; store pods only) ----------------------------------------------------------


def _offload(request: web.Request) -> tuple[TopicOffloadView, str]:
    view = request.app[OFFLOAD_KEY]()
    if view is None:
        raise TopicRefusal(404, "this pod holds no topics (offload verbs are served by store pods)")
    topic = _utf8_query(request).get("topic", "")
    if not topic:
        raise BadRequest("query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)")
    return view, topic


async def topic_offload(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(await view.offload(topic))


async def topic_offload_status(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(await view.status(topic))


async def topic_offload_segments(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(await view.segments(topic))


async def topic_internal_stats(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(await view.internal_stats(topic))


async def get_offload_policies(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(view.policies(topic))


async def set_offload_policies(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    body = await _json_object(request)
    return web.json_response(await view.set_policies(topic, body))


async def remove_offload_policies(request: web.Request) -> web.Response:
    view, topic = _offload(request)
    return web.json_response(await view.remove_policies(topic))


# --- topic policies (retention, message TTL, backlog quota; store pods only) ----------------------------


def _policies(request: web.Request) -> tuple[TopicPolicyView, str, str]:
    view = request.app[POLICY_KEY]()
    if view is None:
        raise TopicRefusal(404, "this pod holds no topics (topic policy verbs are served by store pods)")
    topic = _utf8_query(request).get("topic", "")
    if not topic:
        raise BadRequest("query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)")
    return view, request.match_info["verb"], topic


async def get_topic_policy(request: web.Request) -> web.Response:
    view, verb, topic = _policies(request)
    return web.json_response(view.get(verb, topic))


async def set_topic_policy(request: web.Request) -> web.Response:
    view, verb, topic = _policies(request)
    view.get(verb, topic)  # 404 for a topic the pod does not hold, before the body is looked at
    body = await _json_object(request)
    return web.json_response(await view.set(verb, topic, body))


async def remove_topic_policy(request: web.Request) -> web.Response:
    view, verb, topic = _policies(request)
    return web.json_response(await view.remove(verb, topic))


# --- bulk reads of a topic (the Spark data source; store pods only) -------------------------------------


def _reads(request: web.Request) -> TopicReadView:
    view = request.app[READ_KEY]()
    if view is None:
        raise TopicRefusal(404, "this pod holds no topics (topic reads are served by store pods)")
    return view


async def topic_read_state(request: web.Request) -> web.Response:
    view = _reads(request)
    topic = _utf8_query(request).get("topic", "")
    if not topic:
        raise BadRequest("query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)")
    return web.json_response(await view.read_state(topic))


async def topic_entries(request: web.Request) -> web.Response:
    view = _reads(request)
    try:
        query = entry_query.parse(
            request.rel_url.raw_query_string,
            max_entries=ENTRIES_MAX[0],
            max_bytes=ENTRIES_MAX[1],
            defaults=ENTRIES_DEFAULT,
        )
    except entry_query.QueryError as exc:
        raise BadRequest(str(exc)) from exc
    durable, entries = await view.read_entries(query.topic, query.start, query.max_entries, query.max_bytes)
    body = entry_frames.encode(query.start.ledger_id, query.start.entry_id, durable, entries)
    return web.Response(body=body, content_type=entry_frames.CONTENT_TYPE)


def _cut(value: object, limit: int = 40) -> str:
    text = value if isinstance(value, str) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_admin_app(
    pod: PodView,
    token: str | None,
    offload: OffloadProvider | None = None,
    policies: PolicyProvider | None = None,
    reads: ReadProvider | None = None,
    *,
    shards: ShardProvider | None = None,
    tls: TlsProvider | None = None,
) -> web.Application:
    """``offload``, ``policies``, ``reads`` and ``shards`` return the pod's topic offload, topic
    policy, topic read and placement views once its stores are up (None: no topics); without
    ``shards`` the placement and shard routes are not added (a coordinator pod adds its own);
    ``tls``: the pod's TLS report (None: the pod serves no TLS)."""
    app = web.Application(middlewares=[_errors_and_auth], client_max_size=MAX_BODY_BYTES)
    app[POD_KEY] = pod
    app[TOKEN_KEY] = token
    app[OFFLOAD_KEY] = offload or (lambda: None)
    app[POLICY_KEY] = policies or (lambda: None)
    app[READ_KEY] = reads or (lambda: None)
    app[TLS_KEY] = tls or (lambda: PodTls(False))
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/admin/v1/info", info)
    app.router.add_get("/admin/v1/tls", tls_report)
    app.router.add_get("/admin/v3/transactions/coordinatorStats", coordinator_stats)
    app.router.add_get("/admin/v3/transactions/pendingAckStats", pending_ack_stats)
    app.router.add_get("/admin/v1/batch-log", get_batch_log)
    app.router.add_post("/admin/v1/batch-log", set_batch_log)
    app.router.add_get(
        "/admin/v3/transactions/coordinatorInternalStats/{coordinator_id}", coordinator_internal_stats
    )
    app.router.add_get("/admin/v3/transactions/pendingAckInternalStats", pending_ack_internal_stats)
    app.router.add_post("/admin/v3/transactions/abortTransaction/{most}/{least}", abort_transaction)
    app.router.add_get("/admin/v1/stores", list_stores)
    app.router.add_post("/admin/v1/stores/rollover", rollover)
    app.router.add_get("/admin/v1/stores/ledgers", store_ledgers)
    app.router.add_get("/admin/v1/topics/writers", topic_writers)
    app.router.add_get("/admin/v1/offload/summary", offload_summary)
    app.router.add_post("/admin/v1/offload/restore", offload_restore)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/v1/topics/offload", topic_offload)
    app.router.add_get("/admin/v1/topics/offload-status", topic_offload_status)
    app.router.add_get("/admin/v1/topics/offload-segments", topic_offload_segments)
    app.router.add_get("/admin/v1/topics/internal-stats", topic_internal_stats)
    app.router.add_get("/admin/v1/topics/offload-policies", get_offload_policies)
    app.router.add_post("/admin/v1/topics/offload-policies", set_offload_policies)
    app.router.add_delete("/admin/v1/topics/offload-policies", remove_offload_policies)
    app.router.add_get("/admin/v1/topics/read-state", topic_read_state)
    app.router.add_get("/admin/v1/topics/entries", topic_entries)
    verbs = "{verb:retention|message-ttl|backlog-quota}"
    app.router.add_get(f"/admin/v1/topics/{verbs}", get_topic_policy)
    app.router.add_post(f"/admin/v1/topics/{verbs}", set_topic_policy)
    app.router.add_delete(f"/admin/v1/topics/{verbs}", remove_topic_policy)
    if shards is not None:  # store pods (a coordinator pod's placement routes are its own)
        add_shard_routes(app, shards, token=token, read_body=_json_object, read_query=_utf8_query)
    return app
