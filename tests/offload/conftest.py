"""Fixtures of the offload tests: a blob store of each driver, the S3 one on a real MinIO.

MinIO is built by ``make minio`` from the Go module proxy into $CACHE_DIR/bin (tests only; it is never
shipped). One MinIO process serves the whole session on a free 127.0.0.1 port with a temporary
directory; each test gets its own bucket, so listings never see another test's objects.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.ledger.offload import BlobStore, FileSystemBlobStore, OffloadConfig

ACCESS_KEY = "txnkeeper-test"
SECRET_KEY = "txnkeeper-test-secret"


def minio_binary() -> str | None:
    explicit = os.environ.get("MINIO")
    if explicit and Path(explicit).exists():
        return explicit
    cache = Path(os.environ.get("CACHE_DIR", Path.home() / ".cache" / "txnkeeper"))
    candidate = cache / "bin" / "minio"
    return str(candidate) if candidate.exists() else shutil.which("minio")


MINIO_MISSING = (
    "MinIO not found: run `make minio` (needs Go; builds it from the Go module proxy into $CACHE_DIR/bin)"
)


@dataclass(frozen=True)
class MinioServer:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch_minio(binary: str, root: Path, port: int | None = None) -> MinioServer:
    """A MinIO process serving ``root/data`` on 127.0.0.1 (``port``: reuse one, e.g. to restart it)."""
    log = root / "minio.log"
    port, console = port or _free_port(), _free_port()
    env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY}
    env["MINIO_BROWSER"] = "off"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                binary,
                "server",
                str(root / "data"),
                "--address",
                f"127.0.0.1:{port}",
                "--console-address",
                f"127.0.0.1:{console}",
                "--quiet",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a cold start on a loaded 2-core machine can be slow
    ready = False
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2) as resp:
                ready = resp.status == 200
        except (urllib.error.URLError, OSError):
            ready = False
        if ready:
            break
        time.sleep(0.2)  # polling interval of a readiness condition with a deadline, not a synchronisation
    if not ready:
        proc.kill()
        proc.wait()
        pytest.fail(f"MinIO did not become ready within 120s; its log:\n{log.read_text(errors='replace')}")
    return MinioServer(endpoint, proc, log)


def launch_own_minio(root: Path) -> tuple[str, MinioServer]:
    """A MinIO of the test's own under ``root`` (a test that stops its server can't share the session's),
    and the binary to start it again with; skips when MinIO was not built."""
    binary = minio_binary()
    if binary is None:
        pytest.skip(MINIO_MISSING)
    root.mkdir()
    return binary, launch_minio(binary, root)


def stop_minio(server: MinioServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    binary = minio_binary()
    if binary is None:
        pytest.skip(MINIO_MISSING)
    server = launch_minio(binary, tmp_path_factory.mktemp("minio"))
    try:
        yield server
    finally:
        stop_minio(server)


def s3_client(server: MinioServer) -> Any:
    """A boto3 S3 client of the test MinIO (the caller closes it)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )


def make_bucket(server: MinioServer) -> str:
    name = f"t-{uuid.uuid4().hex[:20]}"
    client = s3_client(server)
    client.create_bucket(Bucket=name)
    client.close()
    return name


class Clock:
    """An offloader's wall clock that stands still until the test advances it (to make the open
    segment due to close, or a deletion lag pass, without waiting)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def stoppable_s3_tier(
    bucket: str, endpoint: str
) -> tuple[OffloadConfig, Callable[[OffloadConfig], BlobStore]]:
    """An S3 tier on a test MinIO with 1 KiB blocks and short timeouts, for tests that stop the server
    under the offloader (a default timeout would make every failed attempt take minutes)."""
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    config = OffloadConfig(
        managedLedgerOffloadDriver="S3",
        managedLedgerOffloadBucket=bucket,
        managedLedgerOffloadServiceEndpoint=endpoint,
        managedLedgerOffloadMaxBlockSizeInBytes=1024,
    )

    def s3(c: OffloadConfig) -> BlobStore:
        return S3BlobStore(
            bucket,
            endpoint=c.managedLedgerOffloadServiceEndpoint,
            region="us-east-1",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            connect_timeout=2.0,
            read_timeout=10.0,
        )

    return config, s3


@pytest.fixture(params=["filesystem", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BlobStore]:
    """The same conformance tests run against both drivers."""
    if request.param == "filesystem":
        (tmp_path / "blobs-root").mkdir()
        yield FileSystemBlobStore(tmp_path / "blobs-root")
        return
    server: MinioServer = request.getfixturevalue("minio")
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    s3 = S3BlobStore(
        make_bucket(server),
        endpoint=server.endpoint,
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )
    try:
        yield s3
    finally:
        await s3.close()


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[Path], ManagedLedgerFactory]]:
    """Factories closed at teardown even when a test fails (their offloader tasks stop with them)."""
    made: list[ManagedLedgerFactory] = []

    def make(root: Path) -> ManagedLedgerFactory:
        made.append(ManagedLedgerFactory(root))
        return made[-1]

    yield make
    for factory in made:
        await factory.close()


async def wait_for(check: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Poll ``check`` until it holds (a background offload pass has run), failing after ``limit`` s."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
