"""The admin API answers every bad input with a 400 saying what was wrong, changes nothing, and turns an
unexpected failure into a generic 500 (traceback only in the log); the admin token file must be private.

Hostile requests go to a real ``txnkeeper serve`` process over a socket; the 500 path needs a pod that
fails, so it runs the real aiohttp application on a real socket in front of a pod view that raises.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.admin.app import MAX_BODY_BYTES, MAX_JSON_DEPTH, build_admin_app
from txnkeeper.admin.auth import load_admin_token
from txnkeeper.admin.views import PodView, StoreView
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.protocol.auth import ClusterSecretError, load_cluster_secret


def _raw(method: str, url: str, data: bytes | None, token: str | None = TOKEN) -> tuple[int, str, Any]:
    """(status, content type, decoded JSON) of one request whose body bytes are sent as given."""
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, ctype, raw = response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as exc:
        status, ctype, raw = exc.code, exc.headers.get_content_type(), exc.read()
    return status, ctype, json.loads(raw)


def _post(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _stat(**fields: Any) -> bytes:
    return _post({"coordinator": fields})


# (body bytes, a fragment the 400's message must contain)
HOSTILE_BODIES: list[tuple[bytes, str]] = [
    (b'{"coordinator": {"batchEnabled": tru\xff}}', "not UTF-8: invalid byte 0xff at offset 36"),
    (b"\xef\xbb\xbf{}", "not JSON"),  # a BOM is not JSON
    (b"", "body is empty"),
    (b"batchEnabled=true", "not JSON"),
    (b"[1, 2]", "must be a JSON object, got list"),
    (b'"text"', "must be a JSON object, got str"),
    (b"[" * 30_000 + b"]" * 30_000, f"nests deeper than {MAX_JSON_DEPTH} levels"),
    # Within json's recursion limit but past what a recursive walk of the result could take.
    (b"[" * 900 + b"]" * 900, f"nests deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"coordinator": {"batchedWriteMaxRecords": ' + b"[" * 900 + b"]" * 900 + b"}}", "nests deeper"),
    (_post({"coordinator": {"a": {"b": {"c": {"d": 1}}}}}), f"nests deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"coordinator": {"batchedWriteMaxRecords": ' + b"9" * 5000 + b"}}", "number no setting accepts"),
    (_stat(batchedWriteMaxRecords=10**300), "maxRecords must be an integer from 1"),
    (_stat(batchedWriteMaxRecords=65537), "to 65536, got 65537"),
    (_stat(batchedWriteMaxRecords=2.5), "maxRecords"),
    (_stat(batchedWriteMaxRecords="512"), "maxRecords"),
    (_stat(batchedWriteMaxRecords=True), "maxRecords"),
    (_stat(batchedWriteMaxSize=64 * 1024 * 1024), "to 16777216 (16 MiB)"),
    (_stat(batchedWriteMaxSize=1e300), "maxSizeBytes"),
    (_stat(batchedWriteMaxDelayInMillis=10**12), "maxDelayMillis must be a number of milliseconds from 0"),
    (_stat(batchedWriteMaxDelayInMillis=False), "maxDelayMillis"),
    (_stat(batchedWriteMaxDelayInMillis=-1), "maxDelayMillis"),
    (b'{"coordinator": {"batchedWriteMaxDelayInMillis": NaN}}', "NaN is not a JSON number"),
    (b'{"coordinator": {"batchedWriteMaxDelayInMillis": Infinity}}', "Infinity is not a JSON number"),
    (b'{"coordinator": {"batchedWriteMaxDelayInMillis": 1e999}}', "maxDelayMillis"),
    (_stat(batchEnabled=1), "enabled must be true or false"),
    (_stat(batchEnabled="true"), "enabled must be true or false"),
    (_stat(maxRecords=4), "unknown batched-write setting(s) ['maxRecords']"),
    (_post({"coordinator": [1]}), "'coordinator' must be an object"),
    (_post({"pendingAck": None}), "'pendingAck' must be an object"),
    (_post({"coordinators": {}}), "unknown key(s) ['coordinators']"),
]


def test_hostile_bodies_get_400_with_a_clear_message_and_change_nothing(
    pods: Callable[..., ServePod],
) -> None:
    tc = pods("tc-0", "coordinator", config={"enabled": True, "maxRecords": 64})
    url = f"{tc.admin_url()}/admin/v1/batch-log"
    status, before = http("GET", url)
    assert status == 200
    failures = []
    for body, fragment in HOSTILE_BODIES:
        status, ctype, answer = _raw("POST", url, body)
        if status != 400 or ctype != "application/json" or fragment not in answer.get("error", ""):
            failures.append((body[:60], status, answer))
        assert len(answer["error"]) < 400, answer  # a huge input is not echoed back
    assert failures == [], "\n".join(map(str, failures))
    assert http("GET", url) == (200, before)
    # The same body, valid, is applied: the 400s were about the inputs, not a broken endpoint.
    status, _ctype, _answer = _raw("POST", url, _stat(batchedWriteMaxRecords=65536))
    assert status == 200
    assert http("GET", url)[1]["coordinator"]["batchedWriteMaxRecords"] == 65536


def test_hostile_paths_and_methods_get_json_errors(pods: Callable[..., ServePod]) -> None:
    tc = pods("tc-0", "coordinator")
    base = f"{tc.admin_url()}/admin/v3/transactions/coordinatorInternalStats/"
    # int() accepts every one of these but the first; isdigit() is true for all of them.
    for raw_id in ("\u00b2", "\u0660", "\uff10", "1" * 5000, "-1", "0x0"):
        quoted = urllib.parse.quote(raw_id)
        status, ctype, answer = _raw("GET", base + quoted, None)
        assert (status, ctype) == (400, "application/json"), (raw_id, answer)
        assert "digits 0-9" in answer["error"] and len(answer["error"]) < 200
    assert _raw("GET", base + "0", None)[0] == 200
    status, _ctype, answer = _raw("GET", base + "99", None)
    assert status == 404 and "not hosted" in answer["error"]
    status, ctype, answer = _raw("GET", f"{tc.admin_url()}/admin/v1/nothing", None)
    assert (status, ctype) == (404, "application/json") and "no admin API resource" in answer["error"]
    status, ctype, answer = _raw("DELETE", f"{tc.admin_url()}/admin/v1/batch-log", None)
    assert (status, ctype) == (405, "application/json") and "allowed: " in answer["error"]
    big = b'{"coordinator": {"batchEnabled": true}, "x": "' + b"a" * MAX_BODY_BYTES + b'"}'
    status, ctype, answer = _raw("POST", f"{tc.admin_url()}/admin/v1/batch-log", big)
    assert (status, ctype) == (413, "application/json") and f"{MAX_BODY_BYTES} bytes" in answer["error"]
    status, _ctype, answer = _raw(
        "GET", f"{tc.admin_url()}/admin/v3/transactions/pendingAckInternalStats", None
    )
    assert status == 400 and "'topic' and 'subscription' are required" in answer["error"]
    query = "?topic=persistent%3A%2F%2Ft%2Fns%2F%FF%FE&subscription=s"
    status, _ctype, answer = _raw(
        "GET", f"{tc.admin_url()}/admin/v3/transactions/pendingAckInternalStats{query}", None
    )
    assert status == 400 and "query string is not UTF-8" in answer["error"]


class _FailingPod:
    """A pod view whose every call fails as a bug would: what reaches the client must be generic."""

    pod_name = "tc-0"
    role = "coordinator"
    release = "2.0.0"
    format_level = 2

    def _fail(self) -> Any:
        raise KeyError("secret internal detail /var/lib/txnkeeper")

    def readiness(self) -> str | None:
        return None

    def stores(self) -> list[StoreView]:
        return self._fail()  # type: ignore[no-any-return]

    def coordinator_array(self) -> list[dict[str, Any]]:
        return self._fail()  # type: ignore[no-any-return]

    def subscription_array(self) -> list[dict[str, Any]]:
        return self._fail()  # type: ignore[no-any-return]

    def batch_log_configs(self) -> tuple[BatchedWriteConfig, BatchedWriteConfig]:
        return self._fail()  # type: ignore[no-any-return]

    async def set_batch_log(self, txnlog: BatchedWriteConfig, pending_ack: BatchedWriteConfig) -> None:
        self._fail()

    def coordinator_log(self, coordinator_id: int) -> StoreView | None:
        return self._fail()  # type: ignore[no-any-return]

    def pending_ack_log(self, topic: str, subscription: str) -> StoreView | None:
        return self._fail()  # type: ignore[no-any-return]

    def metrics_text(self) -> bytes:
        return self._fail()  # type: ignore[no-any-return]

    async def topic_writers(self, topic: str) -> dict[str, Any] | None:
        return self._fail()  # type: ignore[no-any-return]

    async def offload_summary(self) -> dict[str, Any]:
        return self._fail()  # type: ignore[no-any-return]

    async def request_offload_restore(self, properties: dict[str, Any]) -> None:
        self._fail()

    async def abort_transaction(self, most: int, least: int) -> tuple[int, dict[str, Any]]:
        return self._fail()  # type: ignore[no-any-return]


async def test_unexpected_failure_is_a_generic_500_with_the_traceback_only_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod: PodView = _FailingPod()
    runner = web.AppRunner(build_admin_app(pod, TOKEN))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/admin/v1/batch-log") as response:
                status, answer = response.status, await response.json()
            abort = f"http://127.0.0.1:{port}/admin/v3/transactions/abortTransaction/0/1"
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(abort, headers=headers) as response:
                abort_status, abort_answer = response.status, await response.json()
            async with session.get(f"http://127.0.0.1:{port}/health") as response:
                health = response.status
    finally:
        await runner.cleanup()
    assert status == 500
    assert answer == {"error": "internal error in the admin API; the pod's log has the details"}
    assert (abort_status, abort_answer) == (status, answer)
    assert health == 200
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert logged and "secret internal detail" in str(logged[0].exc_info[1])  # type: ignore[index]


# ---- the admin token file ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640, 0o440])
def test_private_token_files_are_accepted(tmp_path: Path, mode: int) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(mode)
    assert load_admin_token(str(token)) == "s3cret"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o660, 0o666, 0o601])
def test_token_files_others_can_read_or_group_can_change_are_refused(tmp_path: Path, mode: int) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(mode)
    with pytest.raises(ValueError, match=rf"has mode 0{mode:o}: .*chmod 600 {token}"):
        load_admin_token(str(token))


def test_serve_refuses_to_start_with_a_world_readable_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNKEEPER_")}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "txnkeeper.cli", "serve", "--role", "coordinator"),
            *("--data-dir", str(tmp_path / "data"), "--admin-listen", "127.0.0.1:0"),
            *("--listen", "127.0.0.1:0", "--admin-token-file", str(token)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"admin token file {token} has mode 0644" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()  # refused before touching the data directory


def test_token_symlink_is_judged_by_its_target(tmp_path: Path) -> None:
    """A Kubernetes Secret volume's file is a symlink (..data/token); the symlink's own mode is 0777."""
    target = tmp_path / "..data" / "token"
    target.parent.mkdir()
    target.write_text("s3cret")
    target.chmod(0o440)
    (tmp_path / "token").symlink_to(target)
    assert load_admin_token(str(tmp_path / "token")) == "s3cret"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620])
def test_cluster_secret_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    """The cluster secret is held to the admin token's rule: it signs every txn ticket and owner token."""
    secret = tmp_path / "cluster-secret"
    secret.write_text("a-cluster-secret-of-enough-bytes")
    secret.chmod(mode)
    with pytest.raises(ClusterSecretError, match=rf"has mode 0{mode:o}: .*chmod 600 {secret}"):
        load_cluster_secret(secret)
    secret.chmod(0o440)
    loaded = load_cluster_secret(secret)
    assert loaded is not None
