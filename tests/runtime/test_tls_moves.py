"""Moves between pods that serve TLS (issue 28): the target pulls the source's files over https with
its own certificate (mutual TLS: the admin ports require a client certificate), and the mover (the
CLI, or the operator's admin client) reaches both over https.

A shard move to a target whose certificate the source does not trust is refused at the handshake
with the sentence contract/tls.py gives, and rolled back: the source serves the shard again, nothing
lost. Once the target's certificate is replaced by one of the trusted CA (re-read, no restart) the
same move succeeds. A coordinator id moves between two TLS coordinator pods with a transaction open
on it, which then commits through the new owner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pulsar_wire import free_port
from runtime_pods import TOKEN, ServePod
from runtime_waits import wait_until
from test_shard_moves import _topic_in
from tls_pods import https_metrics, start_tls_pod

from txnkeeper.admin.https import AdminHttps
from txnkeeper.client import Client
from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.placement import Member, Placement
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.protocol.rpc import StaticClientTls

pytestmark = pytest.mark.timeout(240)

NOW = dt.datetime.now(dt.UTC)
YEAR = dt.timedelta(days=365)
HOSTS = ("127.0.0.1", "localhost")


class TlsPod(ServePod):
    """A pod whose admin API is reached over https."""

    def admin_url(self) -> str:
        return f"https://{self.admin}"


class Material:
    """Two CAs: ``trusted`` (every pod's bundle), ``other`` (a target's leaf the sources refuse)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.trusted = pki.new_ca("txnkeeper moves CA", now=NOW, validity=YEAR)
        self.other = pki.new_ca("some other CA", now=NOW, validity=YEAR)
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = directory / "ca.crt"
        self.ca_file.write_bytes(pki.bundle_pem([self.trusted.cert]))
        # The mover trusts both (it must reach the target whatever CA issued its certificate).
        self.mover_ca = directory / "mover-ca.crt"
        self.mover_ca.write_bytes(pki.bundle_pem([self.trusted.cert, self.other.cert]))
        client = pki.issue(self.trusted, "mover", hosts=(), now=NOW, validity=YEAR, server=False)
        self.client_cert, self.client_key = self.write("mover", client)

    def write(self, name: str, issued: pki.Issued) -> tuple[Path, Path]:
        directory = self.directory / name
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / "tls.crt", directory / "tls.key"
        key.touch(mode=0o600)
        # The key first, then the certificate, each in one rename: the pod's reload sees a
        # half-written pair at most once and keeps what it serves.
        for path, data in ((key, issued.key_pem), (cert, issued.cert_pem)):
            tmp = path.with_name(path.name + ".new")
            tmp.write_bytes(data)
            tmp.chmod(0o600)
            tmp.replace(path)
        return cert, key

    def leaf(self, name: str, ca: pki.Issued | None = None, *, bundle: Path | None = None) -> list[str]:
        """Issue ``name``'s leaf (of ``ca``, default the trusted one); the pod's TLS flags."""
        cert, key = self.write(name, pki.issue(ca or self.trusted, name, hosts=HOSTS, now=NOW, validity=YEAR))
        return [
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-file",
            str(bundle or self.ca_file),
            "--tls-client-auth",
            "require",
            "--tls-admin-client-auth",
            "require",
            "--tls-reload-interval",
            "0.2",
        ]

    def client(self) -> TlsClientSettings:
        return TlsClientSettings(str(self.mover_ca), str(self.client_cert), str(self.client_key))


@pytest.fixture
def material(tmp_path: Path) -> Material:
    return Material(tmp_path / "pki")


@pytest.fixture
def tls_pods(tmp_path: Path, material: Material) -> Iterator[Callable[..., TlsPod]]:
    started: list[TlsPod] = []

    def make(name: str, role: str, extra: list[str]) -> TlsPod:
        pod = TlsPod(tmp_path, name, role, extra=extra)
        started.append(pod)
        start_tls_pod(pod, material.client())
        return pod

    yield make
    for pod in started:
        pod.stop()


def _cli(material: Material, pod: ServePod, *args: str, verb: str = "shards") -> tuple[int, str, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "admin",
            "--url",
            pod.admin_url(),
            "--token-file",
            str(pod.token_file),
            verb,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # The CLI's TLS settings from the environment, as in a pod with the Secret mounted.
        env={
            "PATH": "/usr/bin:/bin",
            "TXNKEEPER_TLS_CA_FILE": str(material.mover_ca),
            "TXNKEEPER_TLS_CERT_FILE": str(material.client_cert),
            "TXNKEEPER_TLS_KEY_FILE": str(material.client_key),
        },
    )
    return done.returncode, done.stdout, done.stderr


def _reloads(pod: ServePod, settings: TlsClientSettings) -> float:
    text = https_metrics(pod, settings)
    found = re.search(r"^txnkeeper_tls_reloads_total ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_a_shard_moves_between_tls_pods_and_an_untrusted_target_is_refused_and_rolled_back(
    material: Material, tls_pods: Callable[..., TlsPod]
) -> None:
    ports = [free_port(), free_port()]
    urls = ",".join(f"pulsar://127.0.0.1:{p}" for p in ports)
    placed = ["--replicas", "2", "--shards", "2", "--pulsar-urls", urls]
    tc = tls_pods("tc-0", "coordinator", material.leaf("tc-0"))
    source = tls_pods(
        "pas-0", "store", [*material.leaf("pas-0"), *placed, "--listen", f"127.0.0.1:{ports[0]}"]
    )
    # The target's certificate is of a CA the source does not trust (its own bundle trusts both).
    both = material.mover_ca
    target = tls_pods(
        "pas-1",
        "store",
        [*material.leaf("pas-1", material.other, bundle=both), *placed, "--listen", f"127.0.0.1:{ports[1]}"],
    )
    topic = _topic_in(0, "tls-move")
    settings = material.client()
    async with Client(coordinators=[tc.listen], stores=[source.listen], tls=settings) as client:
        consumer = await client.subscribe(topic, "s")
        producer = await client.create_producer(topic)
        txn = await client.new_transaction()
        await producer.send(b"committed-before", txn=txn)
        await txn.commit()
        await consumer.close()

        move = ["move", "--shard", "0", "--from", source.admin_url(), "--to", target.admin_url()]
        code, out, err = await asyncio.to_thread(_cli, material, source, *move)
        assert code == 1, out
        assert "the server does not trust our client certificate" in err, err
        assert "rolled back" in err, err
        assert f"127.0.0.1:{source.admin.rsplit(':', 1)[1]}" in err, err
        # Rolled back: the source serves the shard again, the message is still there.
        await producer.send(b"after-refusal")
        consumer = await client.subscribe(topic, "s")
        got = [(await consumer.receive(timeout=20)).data for _ in range(2)]
        assert got == [b"committed-before", b"after-refusal"]
        await consumer.close()

    async with aiohttp.ClientSession() as session:
        admin = AdminClient(session, tls=settings)
        held = await admin.list_shards(source.admin_url())
        assert {u.unit: u.state for u in held.units}[0] == "serving"
        assert not (await admin.list_shards(target.admin_url())).units or all(
            u.unit != 0 for u in (await admin.list_shards(target.admin_url())).units
        )

    # Under TLS 1.3 the refusal may reach aiohttp only as a failed write: it is then found by a probe.
    untrusted = StaticClientTls(
        TlsClientSettings(
            str(both),
            str(material.directory / "pas-1" / "tls.crt"),
            str(material.directory / "pas-1" / "tls.key"),
        )
    )
    failed_write = aiohttp.ClientOSError(None, "Can not write request body")
    why = await AdminHttps(untrusted).explain(failed_write, f"{source.admin_url()}/admin/v1/shards/0/fence")
    assert why.endswith("the server does not trust our client certificate (TLSV1_ALERT_UNKNOWN_CA)"), why

    # The target gets a certificate of the trusted CA: re-read while it runs, then the move succeeds.
    before = await asyncio.to_thread(_reloads, target, settings)
    material.write("pas-1", pki.issue(material.trusted, "pas-1", hosts=HOSTS, now=NOW, validity=YEAR))

    async def reloaded() -> bool:
        return await asyncio.to_thread(_reloads, target, settings) > before

    await wait_until(reloaded, 30, "the target to take its new certificate")
    code, out, err = await asyncio.to_thread(_cli, material, source, *move)
    assert code == 0, err
    report = json.loads(out)
    assert report["steps"] == ["precopy", "fence", "receive", "placement", "release"] and report["files"] > 0
    async with Client(coordinators=[tc.listen], stores=[target.listen], tls=settings) as client:
        consumer = await client.subscribe(topic, "s")  # nothing was acknowledged: both again
        got = [(await consumer.receive(timeout=20)).data for _ in range(2)]
        assert got == [b"committed-before", b"after-refusal"]
    for pod in (source, target):
        assert "Traceback" not in pod.log()


def _coordinator_record(epoch: int, owners: list[int], tcs: list[TlsPod]) -> Placement:
    members = {i: Member(tc.listen, f"pulsar://{tc.listen}", tc.admin_url()) for i, tc in enumerate(tcs)}
    record = Placement.initial("coordinator-ids", 2, 2, members)
    doc: dict[str, Any] = {**record.to_json(), "epoch": epoch, "owners": owners}
    return Placement.from_json(doc, "test record")


async def test_a_coordinator_id_moves_between_tls_pods_with_its_open_transaction(
    material: Material, tls_pods: Callable[..., TlsPod]
) -> None:
    placed = ["--coordinators", "2", "--coordinator-ids", "auto", "--replicas", "2"]
    store = tls_pods("pas-0", "store", material.leaf("pas-0"))
    tcs = [tls_pods(f"tc-{i}", "coordinator", [*material.leaf(f"tc-{i}"), *placed]) for i in range(2)]
    tc0, tc1 = tcs
    settings = material.client()
    topic = "persistent://t/ns/tls-coordinator-move"
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(session, timeout_seconds=60, token=TOKEN, tls=settings)
        for tc in tcs:
            await admin.put_placement(tc.admin_url(), _coordinator_record(2, [0, 1], tcs))
        coordinators = [tc.listen for tc in tcs]
        async with Client(coordinators=coordinators, stores=[store.listen], tls=settings) as client:
            verify = await client.subscribe(topic, "verify")
            producer = await client.create_producer(topic)
            txn = await client.new_transaction(timeout_ms=60_000)
            while txn.txn_id.most != 1:
                await txn.abort()
                txn = await client.new_transaction(timeout_ms=60_000)
            await producer.send(b"moved-with-its-coordinator", txn=txn)

            # The CLI moves it (fence, receive: tc-0 pulls from tc-1 over mutual TLS, flip, release).
            move = ["move", "--coordinator", "1", "--from", tc1.admin_url(), "--to", tc0.admin_url()]
            code, out, err = await asyncio.to_thread(_cli, material, tc1, *move, verb="coordinators")
            assert code == 0, err
            report = json.loads(out)
            assert report["coordinator"] == 1 and report["files"] > 0 and report["epoch"] == 3, report
            assert report["steps"] == ["fence", "receive", "placement", "release"]

            await txn.commit()
            assert txn.coordinator_address == tc0.listen
            message = await verify.receive(timeout=20)
            assert message.data == b"moved-with-its-coordinator"
        held = await admin.list_coordinator_ids(tc0.admin_url())
        assert {u.unit: u.state for u in held.units}[1] == "serving"
    assert not (tc1.data_dir / "coordinator" / "1.sequence").exists()
