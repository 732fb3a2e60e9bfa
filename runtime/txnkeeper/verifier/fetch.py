"""Fetching pods' ledgers documents over HTTP, with bounded time and size, many at once.

Runs inside Spark executors (plain threads, stdlib only, so nothing but txnkeeper itself has to be
importable there). Every failure becomes a one-line error naming what went wrong; nothing raises.
"""

from __future__ import annotations

import functools
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from txnkeeper.contract import tls
from txnkeeper.verifier.model import PodEndpoint

LEDGERS_PATH = "/admin/v1/stores/ledgers"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONCURRENCY = 16
# A pod with thousands of stores answers a few MiB; anything far larger is not a ledgers document.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
_CHUNK = 256 * 1024


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """Pod IPs are reached directly: a proxy from the environment (http_proxy) must never sit in
    between. https:// admin URLs are verified against TXNKEEPER_TLS_CA_FILE (contract/tls.py), with
    TXNKEEPER_TLS_CERT_FILE/_KEY_FILE presented where pods require a client certificate."""
    return tls.url_opener(tls.TlsClientSettings.from_env())


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Either a decoded JSON document or an error saying why there is none."""

    endpoint: PodEndpoint
    document: object | None
    error: str | None


def ledgers_url(base_url: str) -> str:
    return base_url.rstrip("/") + LEDGERS_PATH


def _read_bounded(response: object, deadline: float, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("deadline passed while reading the body")
        chunk: bytes = response.read(_CHUNK)  # type: ignore[attr-defined]
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise OverflowError(f"document larger than {max_bytes} bytes")
        chunks.append(chunk)


def _http_error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(4096)
        message = json.loads(body).get("error")
        return f": {message}" if isinstance(message, str) else ""
    except (OSError, ValueError, AttributeError):
        return ""


def fetch_ledgers(
    endpoint: PodEndpoint,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> FetchResult:
    """GET {url}/admin/v1/stores/ledgers within `timeout_s` in total; never raises."""
    if endpoint.url is None:
        return FetchResult(endpoint, None, f"unreachable: no address ({endpoint.note or 'no pod IP'})")
    url = ledgers_url(endpoint.url)
    deadline = time.monotonic() + timeout_s
    try:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with _opener().open(request, timeout=timeout_s) as response:
            body = _read_bounded(response, deadline, max_bytes)
    except urllib.error.HTTPError as exc:
        return FetchResult(endpoint, None, f"HTTP {exc.code} from {url}{_http_error_detail(exc)}")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError | socket.timeout):
            return FetchResult(endpoint, None, f"unreachable: timed out after {timeout_s:g} s ({url})")
        described = tls.describe_url_error(reason, url, tls.TlsClientSettings.from_env())
        return FetchResult(endpoint, None, f"unreachable: {described or reason} ({url})")
    except tls.TlsSettingsError as exc:
        return FetchResult(endpoint, None, f"unreachable: TLS settings: {exc} ({url})")
    except TimeoutError:
        return FetchResult(endpoint, None, f"unreachable: timed out after {timeout_s:g} s ({url})")
    except OverflowError as exc:
        return FetchResult(endpoint, None, f"malformed document: {exc} ({url})")
    except ssl.SSLError as exc:
        # TLS 1.3 sends "certificate required" after the handshake: it surfaces on the first read.
        described = tls.describe_url_error(exc, url, tls.TlsClientSettings.from_env())
        return FetchResult(endpoint, None, f"unreachable: {described or exc} ({url})")
    except (OSError, ValueError) as exc:
        # Connection reset mid-body, invalid HTTP, bad URL: the pod's answer cannot be trusted.
        return FetchResult(endpoint, None, f"unreachable: {type(exc).__name__}: {exc} ({url})")
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return FetchResult(endpoint, None, f"malformed document: not JSON ({exc}) ({url})")
    return FetchResult(endpoint, document, None)


def fetch_all(
    endpoints: Iterable[PodEndpoint],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Iterator[FetchResult]:
    """Fetch every endpoint with up to `concurrency` requests in flight; results in input order."""
    batch = list(endpoints)
    if not batch:
        return
    workers = max(1, min(concurrency, len(batch)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txnkeeper-fetch") as pool:
        yield from pool.map(lambda endpoint: fetch_ledgers(endpoint, timeout_s), batch)
