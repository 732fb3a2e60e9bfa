"""Certificate rotation under transactional load (issue 28 item 1): the server certificate is replaced
(same CA), then the CA (bundle old + new, a certificate of the new CA, then the new CA alone), while a
client runs transactions in a loop. No transaction fails, new connections are served the new
certificate, the pods are never restarted; a half-written pair is refused once and counted."""

from __future__ import annotations

import asyncio
import re
from functools import partial
from pathlib import Path

import pytest
from runtime_pods import ServePod
from runtime_waits import wait_until
from tls_certs import Issued, issue, make_ca, replace_atomically, write_bundle
from tls_pods import TlsFiles, https_metrics, served_serial, start_tls_pod

from txnkeeper.client import Client, TlsClientSettings, TlsHandshakeError
from txnkeeper.contract.tls import TlsServerSettings, TlsSettingsError
from txnkeeper.server.tls_reload import TlsReloader

WITHIN = 20.0


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


class Load:
    """Transactions in a loop on one client (its connections stay open across the rotations)."""

    def __init__(self, client: Client, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.committed = 0
        self.failures: list[BaseException] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        producer = await self.client.create_producer(self.topic)
        while not self.stop.is_set():
            try:
                txn = await self.client.new_transaction()
                await producer.send(b"x", txn=txn)
                await txn.commit()
                self.committed += 1
            except Exception as exc:  # counted, asserted empty at the end
                self.failures.append(exc)
            await asyncio.sleep(0)

    async def more(self, count: int) -> None:
        target = self.committed + count

        async def reached() -> bool:
            return self.committed >= target or bool(self.failures)

        await wait_until(reached, WITHIN, f"{count} more transactions")


async def test_rotating_the_certificate_and_then_the_ca_under_load_fails_no_transaction(
    tmp_path: Path,
) -> None:
    tls = TlsFiles.create(tmp_path / "secret")
    old_ca = tls.ca
    flags = tls.flags("--tls-client-auth", "request", "--tls-reload-interval", "0.2")
    coordinator = ServePod(tmp_path, "tc-0", "coordinator", extra=flags)
    store = ServePod(tmp_path, "pas-0", "store", extra=flags)
    pods = (coordinator, store)
    # What the test's probes trust: both CAs (they check which certificate a new connection gets).
    probe = TlsClientSettings(str(tmp_path / "probe-ca.crt"))
    try:
        for pod in pods:
            start_tls_pod(pod, tls.client_settings())
        pids = [pod.process.pid for pod in pods if pod.process is not None]
        client = Client(coordinators=[coordinator.listen], stores=[store.listen], tls=tls.client_settings())
        load = Load(client, "persistent://t/ns/rotation")
        task = asyncio.create_task(load.run())
        await load.more(20)

        async def serves(pod: ServePod, issued: Issued) -> bool:
            return await asyncio.to_thread(served_serial, pod.listen, probe) == issued.serial

        async def metric(pod: ServePod, name: str) -> float:
            return _metric(await asyncio.to_thread(https_metrics, pod, probe), name)

        write_bundle(Path(probe.ca_file), old_ca)
        # 1. a new server certificate of the same CA; its key lands first (a half-written pair)
        renewed = issue(old_ca, "pod-renewed")
        replace_atomically(tls.key_file, renewed.key_pem)

        async def half_pair_refused() -> bool:
            return all([await metric(pod, "txnkeeper_tls_reload_errors_total") >= 1 for pod in pods])

        await wait_until(half_pair_refused, WITHIN, "the half-written pair refused")
        assert all([await metric(pod, "txnkeeper_tls_reload_failing") == 1 for pod in pods])
        await load.more(10)  # the certificate in use stayed
        replace_atomically(tls.cert_file, renewed.cert_pem)
        for pod in pods:
            await wait_until(partial(serves, pod, renewed), WITHIN, f"{pod.name} serving the renewed one")
            assert await metric(pod, "txnkeeper_tls_reload_errors_total") == 1  # once per content
        await load.more(20)

        # 2. the CA: old + new trusted, a certificate of the new CA, then the new CA alone
        new_ca = make_ca("txnkeeper test CA 2")
        write_bundle(Path(probe.ca_file), old_ca, new_ca)
        write_bundle(tls.ca_file, old_ca, new_ca)
        for pod in pods:
            await wait_until(
                partial(_reloads_at_least, pod, probe, 2), WITHIN, f"{pod.name} trusting both CAs"
            )
        of_new_ca = issue(new_ca, "pod-new-ca")
        tls.serve_pair(of_new_ca)
        for pod in pods:
            await wait_until(partial(serves, pod, of_new_ca), WITHIN, f"{pod.name} serving the new CA's")
        await load.more(20)
        write_bundle(tls.ca_file, new_ca)
        for pod in pods:
            await wait_until(
                partial(_reloads_at_least, pod, probe, 4),
                WITHIN,
                f"{pod.name} trusting the new CA only",
            )
        await load.more(20)
        load.stop.set()
        await task
        await client.close()
        assert load.failures == []
        assert [
            pod.process.pid for pod in pods if pod.process is not None and pod.process.poll() is None
        ] == pids

        # New connections: a client of the new CA works end to end; one trusting only the old CA is refused.
        new_client_files = issue(new_ca, "client-2").write(tmp_path / "client-2", "client")
        fresh = TlsClientSettings(str(tls.ca_file), str(new_client_files[0]), str(new_client_files[1]))
        async with Client(coordinators=[coordinator.listen], stores=[store.listen], tls=fresh) as c:
            txn = await c.new_transaction()
            await (await c.create_producer("persistent://t/ns/after")).send(b"y", txn=txn)
            await txn.commit()
        old_only = TlsClientSettings(str(write_bundle(tmp_path / "old-ca.crt", old_ca)))
        with pytest.raises(TlsHandshakeError, match="certificate is not signed by a trusted CA"):
            async with Client(coordinators=[coordinator.listen], stores=[], tls=old_only) as c:
                await c.new_transaction()
        for pod in pods:
            assert "Traceback" not in pod.log()
            assert await metric(pod, "txnkeeper_tls_reload_failing") == 0
    finally:
        for pod in pods:
            pod.stop()


async def _reloads_at_least(pod: ServePod, probe: TlsClientSettings, count: int) -> bool:
    text = await asyncio.to_thread(https_metrics, pod, probe)
    return _metric(text, "txnkeeper_tls_reloads_total") >= count


def test_reloader_keeps_its_context_when_the_files_are_unusable(tmp_path: Path) -> None:
    tls = TlsFiles.create(tmp_path / "secret")
    settings = TlsServerSettings(str(tls.cert_file), str(tls.key_file), str(tls.ca_file))
    reloader = TlsReloader(settings)
    served = reloader.server_context("client")
    assert reloader.check() is False  # unchanged files: nothing to do
    replace_atomically(tls.cert_file, b"-----BEGIN CERTIFICATE-----\ntruncated")
    assert reloader.check() is False
    assert reloader.check() is False  # the same bad content is reported once
    assert reloader.reload_errors == 1 and reloader.failing
    assert reloader.server_context("client") is served
    tls.cert_file.unlink()
    assert reloader.check() is False and reloader.reload_errors == 2  # a missing file: kept too
    tls.serve_pair(issue(tls.ca))
    assert reloader.check() is True
    assert reloader.server_context("client") is not served and reloader.reloads == 1
    assert not reloader.failing
    with pytest.raises(TlsSettingsError, match="cannot be read"):
        TlsReloader(TlsServerSettings(str(tmp_path / "none.crt"), str(tls.key_file), None))
